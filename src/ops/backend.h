// The op interface: the DeepSeek-V4 model (src/model) is written once over these ops; each
// backend (src/backends/cpu is the reference, CUDA comes later) implements all of them.
//
// Ops are sized like the fused GPU kernels they will become (mHC pre/post, norm, projection,
// compressor update, indexer scoring + top-k, sparse attention with sink, router, grouped experts),
// not scalar tensor algebra. Every op takes a batch of T tokens drawn from one or more sequences
// (continuous batching): BatchInfo says which sequence and position each token has. Per-sequence
// decode state is owned by the runtime and created by the backend (create_sequence_state).
//
// Params structs are filled with designated initialisers; outputs come first.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "core/argmax.h"
#include "core/check.h"
#include "core/tensor.h"
#include "core/model_config.h"
#include "core/quant_sim.h"
#include "sparrow/status.h"
#include "ops/tensor.h"

namespace sparrow {

// Per-sequence decode state of every layer (window ring, compressor buffers, compressed entries,
// indexer keys). Opaque to the model; each backend defines its own layout.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  // Tokens this state has absorbed (the position of the next token).
  virtual int64_t length() const = 0;
  // Marks `n` more tokens as absorbed; called by the runtime after a forward over them.
  virtual void advance(int64_t n) = 0;
};

// Bytes of one sequence's decode state after `context` tokens in the layout of spec §5 that the
// CPU backend uses: per layer an fp32 window ring [W, Dh]; for CSA and HCA the compressor's pending
// kv and gate rows [m, width] (width 2*Dh for CSA's overlapping form, which also keeps the previous
// window's halves [m, Dh] twice) and its compressed entries [context/m, Dh]; for CSA the indexer's
// buffers alike with di. Container and allocator overheads are not counted.
inline int64_t sequence_state_bytes_reference(const ModelConfig& c, int64_t context) {
  int64_t bytes = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    bytes += c.sliding_window * c.head_dim * 4;
    const int64_t m = c.compress_ratio[l];
    if (c.attention[l] == AttentionKind::kCsa) {
      bytes += m * (2 * 2 * c.head_dim + 2 * c.head_dim) * 4 + (context / m) * c.head_dim * 4;
      bytes += m * (2 * 2 * c.index_head_dim + 2 * c.index_head_dim) * 4 + (context / m) * c.index_head_dim * 4;
    } else if (c.attention[l] == AttentionKind::kHca) {
      bytes += m * 2 * c.head_dim * 4 + (context / m) * c.head_dim * 4;
    }
  }
  return bytes;
}

// T tokens from several sequences. REQUIRES: a sequence's tokens are contiguous, in position
// order, and continue exactly where its state left off (positions[first] == state->length()).
struct BatchInfo {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int64_t> positions;     // [T] absolute position in its sequence
  std::vector<int32_t> seq_of_token;  // [T] index into `seqs`
  std::vector<SequenceState*> seqs;   // not owned
  std::vector<int64_t> seq_begin;     // per sequence: first token index in the batch
  std::vector<int64_t> seq_end;       // per sequence: one past its last token
  // Optional: the ids as an int32 [T] tensor of the backend running the batch (e.g. the previous
  // step's Backend::argmax_rows), read when the ops run; token_ids then holds T placeholders and
  // no op reads it. Lets a greedy loop queue step t + 1 before step t's id reaches the host.
  Tensor device_token_ids;
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

// RoPE frequencies of one layer flavour: inv_freq[i] for pair i of the trailing rope dims.
struct RopeTable {
  std::vector<double> inv_freq;  // [rope_dim/2]
  int64_t rope_dim() const { return 2 * static_cast<int64_t>(inv_freq.size()); }
};

struct HcWeights {
  TensorView fn;     // [mix, S*D]
  TensorView base;   // [mix]
  TensorView scale;  // [3] (sites) or [1] (head)
};

struct ExpertWeights {
  WeightMatrix w1;  // gate [F, D]
  WeightMatrix w2;  // down [D, F]
  WeightMatrix w3;  // up   [F, D]
};

// ---- params -------------------------------------------------------------------------------------

struct EmbedParams {
  Tensor out;                 // [T, S, D] every stream a copy of the embedding row
  const WeightMatrix* table;  // [V, D]
};

struct HcPreParams {
  Tensor out_input;  // [T, D]   sub-layer input u = sum_j pre_j X[j]
  Tensor out_post;   // [T, S]   post_k = 2 sigmoid(.)
  Tensor out_comb;   // [T, S, S] Sinkhorn-normalised comb[j][k] (row j = source stream)
  Tensor streams;    // [T, S, D]
  const HcWeights* weights;
  int64_t sinkhorn_iters;
  double hc_eps;
  double norm_eps;
  bool round_bf16 = false;  // store u rounded to bf16 (deepseek-ref)
};

struct HcPostParams {
  Tensor streams;     // [T, S, D] in/out: X'[k] = post_k y + sum_j comb[j][k] X[j]
  Tensor sublayer;    // [T, D] y
  Tensor post;        // [T, S]
  Tensor comb;        // [T, S, S]
  bool round_bf16 = false;  // streams rounded to bf16 once, post and comb kept fp32 (deepseek-ref)
};

// The mHC work between two sub-layers (spec §3.5): the sub-layer before's hc_post (skipped when
// post.sublayer is empty: the first layer's attention has none), the next sub-layer's hc_pre on the
// streams it left, and the RMS norm of that sub-layer's input u = pre.out_input, in place. By default
// the three ops in that order; a backend may run them as one (CUDA at decode sizes) but must give
// their results. REQUIRES: post.streams is pre.streams when post is given.
struct HcBoundaryParams {
  HcPostParams post;
  HcPreParams pre;
  TensorView norm_weight;  // [D]: the sub-layer's input norm
  double norm_eps;
  bool norm_round_bf16 = false;
};

struct HcHeadParams {
  Tensor out;        // [T, D]
  Tensor streams;    // [T, S, D]
  const HcWeights* weights;
  double hc_eps;
  double norm_eps;
  bool round_bf16 = false;
};

struct RmsNormParams {
  Tensor out;         // [T, N] (may alias in)
  Tensor in;          // [T, N]
  TensorView weight;  // [group] or empty for the unweighted norm
  int64_t group;      // each row is normalised in groups of this many values (N % group == 0)
  double eps;
  bool round_bf16 = false;
};

struct LinearParams {
  Tensor out;               // [T, N]
  Tensor in;                // [T, K]
  const WeightMatrix* weight;  // [N, K]
  // deepseek-ref: the input goes through the power-of-two FP8 quantisation in blocks of 128 (as
  // before the reference's FP8/FP4 GEMMs, spec §3.0.5) and the output is rounded to bf16.
  bool act_quant_fp8 = false;
  bool round_bf16 = false;
  // The input holds bf16 values (the fast and deepseek-ref profiles' activations): with a weight
  // whose values are bf16 too (BF16, or FP8-block), x W^T is then exactly a bf16 GEMM with fp32
  // sums, which a backend may run as one (the CUDA backend's tensor cores); only the order of the
  // sums differs from fp32 arithmetic.
  bool input_bf16 = false;
};

// The `fast` profile's FP8 linear (issue 6; not used by the model yet): y = dequant(q(x)) ·
// dequant(W)^T in fp32, no bf16 rounding. q is act_quant_fp8's quantisation (each token's input in
// blocks of 128 along K, power-of-two scales, e4m3; spec §3.0.5); W is dequantised as stored. The
// CPU computes it as its reference twin (linear with act_quant_fp8: fp64 sums of the dequantised
// products); CUDA runs an FP8 block-scaled GEMM on the tensor cores (docs/cuda.md).
struct LinearFp8BlockParams {
  Tensor out;                  // [T, N]
  Tensor in;                   // [T, K]
  const WeightMatrix* weight;  // [N, K]
};

// wo_a: groups of G heads' outputs, each projected by its own [R, Kg] block of rows.
struct GroupedLinearParams {
  Tensor out;                  // [T, G*R]
  Tensor in;                   // [T, G*Kg]
  const WeightMatrix* weight;  // [G*R, Kg] group-major rows
  int64_t groups;
  bool round_bf16 = false;
};

enum class RopeDirection : uint8_t { kForward, kInverse };

struct RopeParams {
  Tensor x;              // [T, n, width] in place; rotates the trailing table.rope_dim() dims
  const RopeTable* table;
  RopeDirection direction;
  // The rotated dims stored rounded to bf16 (deepseek-ref). The others are left as they are: every
  // caller's x comes from an op that rounded it already, so the whole tensor is then bf16.
  bool round_bf16 = false;
};

// The deepseek-ref profile's in-place roundings of stored tensors (spec §3.0.5-§3.0.8).
enum class QuantSimKind : uint8_t {
  kFp8Pow2Block64,  // KV nope dims: e4m3 with power-of-two scales per 64 values
  kFp4Pow2Block32,  // indexer q/k: e2m1 with power-of-two scales per 32 values
  kHadamardBf16,    // indexer q/k: x H / sqrt(n) over the whole `dims`, then bf16
  kBf16,            // plain bf16 rounding (tensors the reference keeps in bf16)
};

struct QuantSimParams {
  Tensor x;      // viewed as rows of `row` values; each row's first `dims` values are rounded
  int64_t row;
  int64_t dims;
  QuantSimKind kind;
};

enum class CompressorSlot : uint8_t { kMain, kIndexer };

// Absorbs the batch's projected rows into each sequence's compressor buffer of `layer`, and for
// every window that completes: softmax-pools it per channel, RMS-normalises it, rotates it at
// position w*ratio and appends it to the sequence's compressed entries.
struct CompressorParams {
  Tensor kv;                // [T, width] width = 2*dim (overlapping, CSA) or dim (HCA)
  Tensor gate;              // [T, width] without the positional bias
  TensorView ape;           // [ratio, width] positional bias added to gate rows
  TensorView norm_weight;   // [dim]
  const BatchInfo* batch;
  const RopeTable* rope;
  int64_t layer;
  CompressorSlot slot;
  int64_t ratio;
  int64_t dim;
  bool overlap;             // CSA: entry w pools window w-1's first half and window w's second half
  double norm_eps;
  // Rounding of each emitted entry as stored (indexer keys: `--index-keys`); kF32 stores as computed.
  KeyPrecision key_precision = KeyPrecision::kF32;
  // deepseek-ref: the pooled entry is rounded to bf16 before the norm, the norm and rotation output
  // bf16, then `entry_sim` rounds it as the reference stores it (KV: FP8 on the nope dims; indexer
  // keys: Hadamard then FP4).
  bool round_bf16 = false;
  std::vector<QuantSimKind> entry_sim = {};
};

// Lightning Indexer: score_t(w) = sum_h weight_h ReLU(q_h . K_w) * di^-1/2 * Hi^-1/2 over the
// visible entries w < floor((t+1)/ratio), then top-k. Ties: higher score first, then lower entry
// index. Slots past the visible count hold -1.
struct IndexerTopkParams {
  Tensor out_indices;  // [T, k] int32
  Tensor q;            // [T, Hi, di] rotated
  Tensor head_weights; // [T, Hi] weights_proj(x)
  const BatchInfo* batch;
  int64_t layer;
  int64_t ratio;
  int64_t k;
  // Optional [T, C] fp32: every entry's score, -inf where not visible. Only for taps (C may exceed
  // a sequence's entry count; those columns are -inf too).
  Tensor out_scores = {};
  // deepseek-ref: head dot products, weighted ReLUs and the head sum rounded to bf16 (spec §3.3).
  bool bf16_scores = false;
  // q holds bf16 values (the fast profile's rounding after RoPE). A backend may then score keys
  // that are bf16 values too (--index-keys bf16 or fp4) with bf16 operands: the same products, fp32
  // sums in another order (the CUDA backend's tensor cores). The CPU ignores it.
  bool bf16_operands = false;
};

// Appends the batch's window keys to each sequence's ring (after attention has read the ring).
struct WindowAppendParams {
  Tensor kv;  // [T, Dh]
  const BatchInfo* batch;
  int64_t layer;
  // The rows are FP8 KV record values (core/kv_record.h: the nope dims FP8 in blocks of 64 with
  // power-of-two scales, the RoPE dims bf16; the fast profiles' kv after its quant_sim): a backend
  // may store them as records (the CUDA backend does where the layer's KV can be records).
  bool kv_record = false;
};

// Sparse attention with a per-head sink over (window entries) ∪ (compressed entries): all visible
// ones for HCA, the indexer's selection for CSA, none for window-only layers. K = V.
struct AttentionParams {
  Tensor out;             // [T, H, Dh]
  Tensor q;               // [T, H, Dh]
  Tensor kv;              // [T, Dh] this batch's window keys (not yet in the ring)
  Tensor selected;        // [T, k] int32 for CSA, empty otherwise
  TensorView sinks;       // [H]
  const BatchInfo* batch;
  int64_t layer;
  AttentionKind kind;
  int64_t ratio;          // compression ratio (CSA/HCA)
  int64_t window;         // W
  double scale;           // softmax scale, Dh^-1/2
  bool round_bf16 = false;
  // q and every key (window ring, this batch's kv, compressed entries) hold bf16 values (the fast
  // and deepseek-ref profiles: q rounded, keys FP8-simulated with bf16 RoPE dims). A backend may
  // then take the dot products and the weighted sum on bf16 tensor cores: the same products, fp32
  // sums in another order. The CPU ignores it.
  bool bf16_operands = false;
  // Every key is an FP8 KV record value (WindowAppendParams::kv_record): a backend that stores the
  // KV as records may read them, and encode this batch's kv so. The CPU ignores it.
  bool kv_record = false;
  // Where set, q holds the heads' projections before their unweighted RMS norm (over a head's Dh
  // values, eps q_norm_eps) and forward RoPE (q_rope, at each token's position), each rounded to bf16
  // when round_bf16: the attention applies them first, with the values rms_norm and rope would give
  // (Backend::attention_q_prep runs those two ops; a backend may fold them into its kernel instead,
  // the same bits). q may be overwritten.
  const RopeTable* q_rope = nullptr;
  double q_norm_eps = 0.0;
  // Where set, the attention's output is rotated back afterwards: the inverse RoPE (o_rope, at each
  // token's position) of each head's last 2 pairs dims, rounded to bf16 when round_bf16, with the
  // values rope would give on out (Backend::attention_o_finish runs that op; a backend may fold it
  // into its kernel's stores instead, the same bits).
  const RopeTable* o_rope = nullptr;
  // The softmax weights rounded to bf16 before they weight the keys, as DeepSeek's sparse attention
  // kernel and flash-attention kernels with bf16 P do (`--attn-weights bf16`; the profiles' default
  // is precision_default_attn_weights_bf16): the candidates in chunks of 32 in order, each chunk's weights
  // exp(logit - running max) rounded, the denominator summing them unrounded, the accumulators
  // rescaled as the max grows, the sink joining at the end. A backend that splits a token's
  // candidates may start each split's running max afresh (docs/accuracy.md). Only where
  // supports_attention_weights_bf16(bf16_operands, H, Dh).
  bool weights_bf16 = false;
};

// Where routed_scaling_factor is applied. Exactly one placement multiplies it, never both.
enum class RoutedScalePlacement : uint8_t {
  kInRouterWeights,  // the router returns weights already multiplied by the factor
  kInExpertCombine,  // the router returns normalised weights; the combine multiplies
};

struct RouterParams {
  Tensor out_experts;   // [T, K] int32
  Tensor out_weights;   // [T, K]
  Tensor x;             // [T, D]
  const WeightMatrix* gate;  // [E, D]
  TensorView bias;      // [E] selection-only bias (scored routing), else empty
  TensorView tid2eid;   // [V, K] (hash routing), else empty
  const BatchInfo* batch;
  MoeKind kind;
  int64_t k;
  double routed_scale;
  RoutedScalePlacement placement;
  // Optional [T, K] int32: route to these experts instead of selecting (sparrow diff
  // --force-decisions); the weights are still computed from this router's scores.
  Tensor forced_experts = {};
  // x holds bf16 values: the gate's logits may be a bf16 GEMM (LinearParams::input_bf16).
  bool input_bf16 = false;
};

struct MoeParams {
  Tensor out;            // [T, D] sum of weighted routed experts + shared expert
  Tensor x;              // [T, D]
  Tensor experts;        // [T, K] int32
  Tensor weights;        // [T, K]
  const std::vector<ExpertWeights>* routed;
  const ExpertWeights* shared;   // may be null
  double swiglu_limit;           // 0 = no clamp
  double routed_scale;
  RoutedScalePlacement placement;
  // deepseek-ref (spec §3.4): expert inputs FP8-quantised (blocks of 128), the routing weight
  // multiplied in before w2 as bf16(g * h) (then FP8-quantised), the sum rounded to bf16.
  bool ref_numerics = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // A tensor of the shape; its contents are unspecified (the CPU zero-fills, the CUDA backend leaves
  // device memory as it comes): every op writes all of its outputs.
  virtual Tensor alloc(ElemType type, std::vector<int64_t> shape) = 0;
  // Copies host values into a new tensor / back out (tests, taps, logits).
  virtual Tensor upload_f32(const std::vector<float>& values, std::vector<int64_t> shape) = 0;
  virtual Tensor upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> shape) = 0;
  virtual std::vector<float> download_f32(const Tensor& t) = 0;
  virtual std::vector<int32_t> download_i32(const Tensor& t) = 0;

  virtual std::unique_ptr<SequenceState> create_sequence_state(const ModelConfig& config) = 0;
  // Bytes (host or device) a state from create_sequence_state holds once it has absorbed `context`
  // tokens, at most; the engine reserves this per request against its state budget. Called from
  // any thread. The default is the CPU backend's layout (sequence_state_bytes_reference).
  virtual int64_t sequence_state_bytes(const ModelConfig& config, int64_t context) const {
    return sequence_state_bytes_reference(config, context);
  }

  virtual void embed(const EmbedParams& p, const BatchInfo& batch) = 0;
  virtual void hc_pre(const HcPreParams& p) = 0;
  virtual void hc_post(const HcPostParams& p) = 0;
  virtual void hc_head(const HcHeadParams& p) = 0;
  // hc_post (when given), hc_pre and the input's rms_norm (HcBoundaryParams); backends may fuse them.
  virtual void hc_boundary(const HcBoundaryParams& p);
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void linear(const LinearParams& p) = 0;
  // Several linears of one input (every p.in the same tensor, the same flags): by default linear()
  // of each in order. A backend may run them as one GEMM over the weights stacked row-wise, each
  // output then computed as its linear computes a weight of the stacked shape (CUDA: the fast FP8
  // linears, docs/cuda.md).
  virtual void linears(std::span<const LinearParams> ps) {
    for (const LinearParams& p : ps) linear(p);
  }
  virtual void grouped_linear(const GroupedLinearParams& p) = 0;
  // Only tests use it for now; a backend without it aborts (see LinearFp8BlockParams).
  virtual void linear_fp8_block(const LinearFp8BlockParams& p);
  virtual void rope(const RopeParams& p, const BatchInfo& batch) = 0;
  virtual void compressor(const CompressorParams& p) = 0;
  virtual void indexer_topk(const IndexerTopkParams& p) = 0;
  virtual void attention(const AttentionParams& p) = 0;
  virtual void window_append(const WindowAppendParams& p) = 0;
  virtual void router(const RouterParams& p) = 0;
  virtual void moe(const MoeParams& p) = 0;
  // out[i] = in[rows[i]] for a [T, N] tensor. The default goes through the host; backends may do
  // better.
  virtual Tensor gather_rows(const Tensor& in, const std::vector<int64_t>& rows);
  // out[i] (int32 [T]) = argmax_first of row i of a [T, N] f32 tensor (core/argmax.h: ties to the
  // lowest index, the first NaN wins): a greedy step reads T ids instead of T x N logits. The
  // default goes through the host; backends may do better. REQUIRES: N > 0.
  virtual Tensor argmax_rows(const Tensor& in);
  // Only the deepseek-ref profile uses it; the model refuses that profile on backends without it.
  virtual void quant_sim(const QuantSimParams& p);
  // quant_sim and the *_bf16 rounding flags are implemented (the deepseek-ref profile).
  // CompressorParams::key_precision is not covered by this: every backend implements it.
  virtual bool supports_reference_numerics() const { return false; }
  // Whether attention() implements AttentionParams::weights_bf16 on calls with these bf16_operands,
  // heads and head_dim (the CPU and CUDA backends: on any).
  virtual bool supports_attention_weights_bf16(bool bf16_operands, int64_t heads, int64_t head_dim) const {
    (void)bf16_operands, (void)heads, (void)head_dim;
    return false;
  }

  // The ops called between begin_step and end_step are one step of the model over `tokens` tokens.
  // A backend may record them and run them as one unit at end_step (the CUDA backend's graphs,
  // docs/cuda.md); `capturable` false says the caller reads tensors back within the step (taps), so
  // the ops must run as they are called. What the step computed can be downloaded after end_step.
  // Steps do not nest (an inner pair is ignored). The default runs every op as it is called.
  virtual void begin_step(int64_t tokens, bool capturable) {}
  // Within a step (the model calls it after each layer): the work called so far may start on the
  // device while the rest is being called.
  virtual void step_segment() {}
  virtual void end_step() {}

 protected:
  // AttentionParams::q_rope's norm and rotation of q, in place, by this backend's rms_norm and rope.
  void attention_q_prep(const AttentionParams& p);
  // AttentionParams::o_rope's rotation of out, in place, by this backend's rope.
  void attention_o_finish(const AttentionParams& p);
};

// begin_step on construction, end_step on destruction.
class StepScope {
 public:
  StepScope(Backend& backend, int64_t tokens, bool capturable) : backend_(backend) {
    backend_.begin_step(tokens, capturable);
  }
  ~StepScope() { backend_.end_step(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Backend& backend_;
};

inline void Backend::hc_boundary(const HcBoundaryParams& p) {
  if (!p.post.sublayer.empty()) hc_post(p.post);
  hc_pre(p.pre);
  rms_norm({.out = p.pre.out_input, .in = p.pre.out_input, .weight = p.norm_weight, .group = p.pre.out_input.dim(1),
            .eps = p.norm_eps, .round_bf16 = p.norm_round_bf16});
}

inline void Backend::attention_q_prep(const AttentionParams& p) {
  if (p.q_rope == nullptr) return;
  rms_norm({.out = p.q, .in = p.q, .weight = {}, .group = p.q.dim(2), .eps = p.q_norm_eps, .round_bf16 = p.round_bf16});
  rope({.x = p.q, .table = p.q_rope, .direction = RopeDirection::kForward, .round_bf16 = p.round_bf16}, *p.batch);
}

inline void Backend::attention_o_finish(const AttentionParams& p) {
  if (p.o_rope == nullptr) return;
  rope({.x = p.out, .table = p.o_rope, .direction = RopeDirection::kInverse, .round_bf16 = p.round_bf16}, *p.batch);
}

inline Tensor Backend::gather_rows(const Tensor& in, const std::vector<int64_t>& rows) {
  const int64_t n = in.numel() / in.dim(0);
  const std::vector<float> all = download_f32(in);
  std::vector<float> picked;
  picked.reserve(rows.size() * n);
  for (int64_t r : rows) picked.insert(picked.end(), all.begin() + r * n, all.begin() + (r + 1) * n);
  return upload_f32(picked, {static_cast<int64_t>(rows.size()), n});
}

inline Tensor Backend::argmax_rows(const Tensor& in) {
  const int64_t T = in.dim(0), n = T == 0 ? 0 : in.numel() / T;
  SPARROW_CHECK(T == 0 || n > 0);
  const std::vector<float> all = download_f32(in);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t r = 0; r < T; ++r) ids[r] = static_cast<int32_t>(argmax_first(all.data() + r * n, n));
  return upload_i32(ids, {T});
}

// Token ids a backend computed (e.g. argmax_rows), on the host, each checked to lie in [0, vocab):
// anything else is the backend's bug, said as an internal error rather than fed on as an id.
inline Expected<std::vector<int32_t>> download_token_ids(Backend& backend, const Tensor& ids, int64_t vocab) {
  std::vector<int32_t> out = backend.download_i32(ids);
  for (int32_t id : out)
    if (id < 0 || id >= vocab)
      return Status::internal(std::string("the ") + backend.name() + " backend gave token id " + std::to_string(id) +
                              " (vocabulary " + std::to_string(vocab) + ")");
  return out;
}

inline void Backend::linear_fp8_block(const LinearFp8BlockParams&) {
  std::fprintf(stderr, "sparrow: backend %s has no linear_fp8_block op\n", name());
  std::abort();
}

inline void Backend::quant_sim(const QuantSimParams&) {
  std::fprintf(stderr, "sparrow: backend %s has no quant_sim op\n", name());
  std::abort();
}

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace sparrow
