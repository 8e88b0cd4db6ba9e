// ModelConfig: the DeepSeek-V4 hyper-parameters, one schema-independent struct.
//
// Both config.json schemas map onto it (spec §1.1): the released one (`compress_ratios`,
// `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`) and the transformers one (`layer_types`,
// `mlp_layer_types`, `compress_rates`, `rope_parameters` with `main`/`compress`,
// `partial_rotary_factor`). Parsing and validation live in src/io/config_json.*. It sits in core so
// io, ops and the backends can share it without depending on src/model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparrow {

enum class AttentionKind : uint8_t {
  kSliding,  // window only (compress ratio 0)
  kCsa,      // compressed sparse attention: overlapping compressor (ratio m) + Lightning Indexer
  kHca,      // heavily compressed attention: non-overlapping compressor (ratio m'), all entries
};

enum class MoeKind : uint8_t {
  kHash,    // experts from tid2eid[token_id]
  kScored,  // top-k of sqrtsoftplus(logits) + bias
};

// One RoPE flavour (spec §3.0.4). YaRN changes frequencies only: no mscale/attention factor.
struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double yarn_factor = 1.0;
  int64_t yarn_original_max_position = 0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // D
  int64_t num_layers = 0;           // main decoder blocks (MTP excluded)
  int64_t num_heads = 0;            // H
  int64_t head_dim = 0;             // Dh: q, k, v and output per head
  int64_t rope_dim = 0;             // trailing RoPE dims of each head (qk_rope_head_dim)
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t sliding_window = 0;       // W: window entries including the query itself
  int64_t index_heads = 0;          // Hi
  int64_t index_head_dim = 0;       // di
  int64_t index_topk = 0;
  int64_t num_experts = 0;          // E routed
  int64_t num_shared_experts = 1;
  int64_t experts_per_token = 0;    // K
  int64_t moe_intermediate = 0;     // F
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;        // 0 = no clamp
  bool norm_topk_prob = true;
  int64_t hc_mult = 0;              // S residual streams
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  bool tie_word_embeddings = false;

  RopeConfig rope_main;      // window-only layers
  RopeConfig rope_compress;  // CSA/HCA layers (all their RoPE applications)

  // Per main layer (size num_layers).
  std::vector<AttentionKind> attention;
  std::vector<int64_t> compress_ratio;  // 0, the CSA ratio or the HCA ratio
  std::vector<MoeKind> moe;

  // Entries of the released `compress_ratios` beyond num_layers: the MTP blocks (not run yet).
  std::vector<int64_t> mtp_compress_ratios;

  // Weight storage described by the config (released checkpoints; informative for loading).
  std::string expert_dtype;  // "", "fp4" or "fp8"
  bool fp8_weights = false;  // quantization_config present with fmt e4m3

  int64_t mix_dim() const { return (2 + hc_mult) * hc_mult; }  // mHC mixes: pre, post, comb
  int64_t nope_dim() const { return head_dim - rope_dim; }
};

}  // namespace sparrow
