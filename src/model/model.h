// The DeepSeek-V4 model, written once over the op interface (src/ops/backend.h).
//
// The model owns its config, RoPE tables and the weight table (views into the mmap'd checkpoint);
// it owns no per-sequence state: the runtime passes SequenceStates in a BatchInfo. Every
// intermediate has a stable tap name `L<layer>.<block>.<tensor>`; taps cost one branch when off.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "core/model_config.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

// Receives (name, tensor) for every tapped intermediate, in execution order.
using TapFn = std::function<void(const std::string& name, const Tensor& value)>;

// Selections to impose instead of computing them (`sparrow diff --force-decisions`): tap name
// ("L3.attn.indexer.topk" [T, k], "L0.moe.router.experts" [T, K]) -> int32 values, for one forward
// over the same tokens.
using ForcedDecisions = std::map<std::string, std::vector<int32_t>>;

struct ForwardOptions {
  RoutedScalePlacement routed_scale_placement = RoutedScalePlacement::kInRouterWeights;
  const TapFn* tap = nullptr;                // null: taps off
  const ForcedDecisions* forced = nullptr;   // null: every decision computed
  // Token indices to compute logits for (e.g. each sequence's last token when generating);
  // null: every token. The returned logits have one row per listed token, in that order.
  const std::vector<int64_t>* logits_rows = nullptr;
};

// Run-time changes to what config.json says (for experiments: `--index-topk`).
// Numerics profiles (spec §4; the exact per-tensor definition is the table in docs/design.md).
// kFp32 is the reference: fp32 activations, no rounding. kDeepseekRef emulates DeepSeek's own
// inference code: power-of-two FP8 activation quantisation before the GEMMs the release stores as
// FP8/FP4, FP8-simulated KV nope dims, Hadamard + FP4-simulated indexer q/k, bf16 index scores,
// the routing weight applied before w2, and bf16 rounding wherever the reference keeps bf16
// tensors (between sub-layers, norms, RoPE, projections). kFast is the GPU production profile
// (issue 6) as its CPU reference twin: deepseek-ref's bf16 roundings, FP8 activation quantisation,
// W4A8 experts and FP8 KV record, but the indexer keys stored at `--index-keys` (default bf16, no
// Hadamard, no FP4 unless asked), the index queries bf16 and the index scores fp32.
enum class Precision : uint8_t { kFp32, kDeepseekRef, kFast };
std::optional<Precision> precision_from_name(std::string_view name);  // "fp32", "deepseek-ref", "fast"
const char* precision_name(Precision p);
// The profile a backend runs when none is named ("auto" on the command line and in EngineOptions):
// fast on "cuda" (the GPU's production numerics), fp32 elsewhere (the reference).
Precision default_precision(std::string_view backend);
// The indexer key precision a profile uses when `--index-keys` is not given: bf16 under fast (the
// FP8 KV record's neighbour in the production cache), fp32 (as computed) otherwise.
KeyPrecision precision_default_index_keys(Precision p);
// Whether a profile rounds the attention's softmax weights to bf16 where they weight the keys
// (AttentionParams::weights_bf16) when `--attn-weights` is not given: fast and deepseek-ref do, as
// DeepSeek's own sparse attention kernel does (docs/accuracy.md, "bf16 attention weights"); fp32
// keeps them exact.
bool precision_default_attn_weights_bf16(Precision p);
// `--attn-weights`'s values: "auto" (unset: the profile's), "fp32" (false), "bf16" (true); any other
// name is an invalid argument that names it.
Expected<std::optional<bool>> attn_weights_from_name(std::string_view name);

struct ModelOverrides {
  std::optional<int64_t> index_topk;
  // Precision the indexer keys are stored in; unset: the profile's (precision_default_index_keys).
  std::optional<KeyPrecision> index_keys = std::nullopt;
  Precision precision = Precision::kFp32;
  // `--attn-weights`: the attention's softmax weights rounded to bf16 before they weight the keys
  // (AttentionParams::weights_bf16, true) or exact (false); unset: the profile's
  // (precision_default_attn_weights_bf16). Backends without the rounding are refused (check_backend).
  std::optional<bool> attn_weights_bf16 = std::nullopt;
};

// Called while Model::load checks the weight table: (layers checked, layers in total).
using LoadProgressFn = std::function<void(int64_t done, int64_t total)>;

class Model {
 public:
  // Loads config.json and the safetensors checkpoint from `dir` and checks every tensor. The
  // checkpoint stays mmap'd in its stored format; loading reads headers and tid2eid only.
  static Expected<std::unique_ptr<Model>> load(const std::filesystem::path& dir, const ModelOverrides& overrides = {},
                                               const LoadProgressFn& progress = {});

  const ModelConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  KeyPrecision index_keys() const { return index_keys_; }
  bool attn_weights_bf16() const { return attn_weights_bf16_; }
  // The model can run on `backend` with its precision profile (deepseek-ref and fast need
  // quant_sim and the rounding flags: supports_reference_numerics()) and its attention weights
  // (attn_weights_bf16: supports_attention_weights_bf16(bf16 operands, H, Dh)).
  Status check_backend(const Backend& backend) const;
  const ModelWeights& weights() const { return weights_; }
  const RopeTable& rope_main() const { return rope_main_; }
  const RopeTable& rope_compress() const { return rope_compress_; }

  // Runs the batch's tokens through every layer, updating the sequences' states, and returns the
  // logits [T, V]. REQUIRES: `batch` satisfies BatchInfo's contract. The caller advances states.
  Tensor forward(Backend& backend, const BatchInfo& batch, const ForwardOptions& options = {}) const;
  // One decoder layer alone over `streams` [T, S, D], in place (`sparrow bench` times layers).
  void forward_layer(Backend& backend, const BatchInfo& batch, int64_t layer, Tensor& streams,
                     const ForwardOptions& options = {}) const {
    layer_forward(backend, batch, layer, streams, options, nullptr);
  }

 private:
  Model() = default;
  struct PendingPost;
  void layer_forward(Backend& be, const BatchInfo& batch, int64_t l, Tensor& streams, const ForwardOptions& opt,
                     PendingPost* carry) const;
  void hc_boundary(Backend& be, PendingPost& pending, Tensor& streams, const HcWeights& site, const TensorView& norm,
                   const Tensor& u, const Tensor& post, const Tensor& comb, const ForwardOptions& opt) const;
  void apply_pending(Backend& be, PendingPost& pending, Tensor& streams, const ForwardOptions& opt) const;
  Tensor attention_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x,
                           const ForwardOptions& opt) const;
  Tensor moe_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x, const ForwardOptions& opt) const;

  std::unique_ptr<SafetensorsCheckpoint> checkpoint_;
  ModelConfig config_;
  KeyPrecision index_keys_ = KeyPrecision::kF32;
  Precision precision_ = Precision::kFp32;
  bool attn_weights_bf16_ = false;
  bool attn_weights_named_ = false;  // (attn_weights_bf16_ came from --attn-weights, not the profile)
  ModelWeights weights_;
  RopeTable rope_main_, rope_compress_;
};

}  // namespace sparrow
