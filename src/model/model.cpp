// DeepSeek-V4 forward pass (spec §3.5-§3.7), in the order transformers 5.17 computes it.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "io/config_json.h"
#include "model/rope.h"

namespace sparrow {

namespace {

std::string tap_name(int64_t layer, const char* what) { return "L" + std::to_string(layer) + "." + what; }

void tap(const ForwardOptions& opt, int64_t layer, const char* what, const Tensor& t) {
  if (opt.tap) (*opt.tap)(tap_name(layer, what), t);
}

// The forced selection for `what` in `layer`, uploaded as [T, values/T], or an empty tensor.
Tensor forced_decision(Backend& be, const ForwardOptions& opt, int64_t layer, const char* what, int64_t T) {
  if (!opt.forced) return {};
  auto it = opt.forced->find(tap_name(layer, what));
  if (it == opt.forced->end()) return {};
  const int64_t n = static_cast<int64_t>(it->second.size());
  SPARROW_CHECK(T > 0 && n % T == 0);
  return be.upload_i32(it->second, {T, n / T});
}

// What a profile does at each site (docs/design.md, "Precision profiles", has the table).
struct Numerics {
  bool round_bf16 = false;        // bf16 activations at the reference's sub-layer boundaries (§4 rows 9, 11, 13)
  bool act_quant_fp8 = false;     // 1x128 power-of-two FP8 input before FP8/FP4-stored GEMMs (§3.0.5, §4 rows 1-2)
  bool kv_fp8 = false;            // window and compressed KV nope dims FP8, blocks of 64, ue8m0 (§3.0.6, §4 row 5)
  bool index_hadamard_fp4 = false;// indexer q/k Hadamard then FP4 simulation (§3.0.7-§3.0.8, §4 row 6)
  bool index_bf16_scores = false; // index scores in bf16 (§3.3 step 5, §4 row 7)
  bool moe_ref = false;           // W4A8 experts, routing weight before w2, bf16 combine (§3.4, §4 rows 2-3)
};

// The attention's q and keys are bf16 values (AttentionParams::bf16_operands): the profiles with
// bf16 activations and FP8 KV.
bool attention_bf16_operands(const Numerics& nx) { return nx.round_bf16 && nx.kv_fp8; }

Numerics numerics_of(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return {};
    case Precision::kDeepseekRef:
      return {.round_bf16 = true, .act_quant_fp8 = true, .kv_fp8 = true, .index_hadamard_fp4 = true,
              .index_bf16_scores = true, .moe_ref = true};
    case Precision::kFast:
      // The GPU production path: everything deepseek-ref does except the indexer, whose keys are
      // stored at --index-keys (CompressorParams::key_precision) and whose scores stay fp32.
      return {.round_bf16 = true, .act_quant_fp8 = true, .kv_fp8 = true, .index_hadamard_fp4 = false,
              .index_bf16_scores = false, .moe_ref = true};
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::filesystem::path& dir, const ModelOverrides& overrides,
                                             const LoadProgressFn& progress) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return Status::not_found("model directory '" + dir.string() + "' does not exist or is not a directory");
  std::unique_ptr<Model> model(new Model());
  SPARROW_ASSIGN_OR_RETURN(model->config_, model_config_load(dir));
  if (overrides.index_topk) {
    if (*overrides.index_topk < 1)
      return Status::invalid_argument("--index-topk must be >= 1, got " + std::to_string(*overrides.index_topk));
    model->config_.index_topk = *overrides.index_topk;
  }
  model->precision_ = overrides.precision;
  model->index_keys_ = overrides.index_keys.value_or(precision_default_index_keys(overrides.precision));
  model->attn_weights_bf16_ = overrides.attn_weights_bf16.value_or(precision_default_attn_weights_bf16(overrides.precision));
  model->attn_weights_named_ = overrides.attn_weights_bf16.has_value();
  SPARROW_ASSIGN_OR_RETURN(model->checkpoint_, SafetensorsCheckpoint::open(dir));
  auto weights = model_weights_load(*model->checkpoint_, model->config_, progress);
  if (!weights.is_ok()) return weights.status().with_context(dir.string());
  model->weights_ = std::move(weights).value();
  model->rope_main_ = rope_table_make(model->config_.rope_main, model->config_.rope_dim);
  model->rope_compress_ = rope_table_make(model->config_.rope_compress, model->config_.rope_dim);
  return model;
}

std::optional<Precision> precision_from_name(std::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "deepseek-ref") return Precision::kDeepseekRef;
  if (name == "fast") return Precision::kFast;
  return std::nullopt;
}

Precision default_precision(std::string_view backend) {
  return backend == "cuda" ? Precision::kFast : Precision::kFp32;
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kDeepseekRef: return "deepseek-ref";
    case Precision::kFast: return "fast";
  }
  return "?";
}

KeyPrecision precision_default_index_keys(Precision p) {
  switch (p) {
    case Precision::kFp32:
    case Precision::kDeepseekRef: return KeyPrecision::kF32;
    case Precision::kFast: return KeyPrecision::kBf16;
  }
  return KeyPrecision::kF32;
}

bool precision_default_attn_weights_bf16(Precision p) { return p != Precision::kFp32; }

Expected<std::optional<bool>> attn_weights_from_name(std::string_view name) {
  if (name == "auto") return std::optional<bool>();
  if (name == "fp32") return std::optional<bool>(false);
  if (name == "bf16") return std::optional<bool>(true);
  return Status::invalid_argument("'" + std::string(name) + "' is not auto, fp32 or bf16");
}

// fast and deepseek-ref need the numerics flags (round_bf16, act_quant_fp8, quant_sim, entry_sim,
// ref_numerics; deepseek-ref also bf16_scores and the Hadamard/FP4 quant_sim kinds): the CPU and CUDA
// backends implement all of them (supports_reference_numerics()); other backends are refused here.
Status Model::check_backend(const Backend& backend) const {
  if (precision_ == Precision::kFast && !backend.supports_reference_numerics())
    return Status::unsupported(
        std::string("precision profile fast is not implemented on the ") + backend.name() +
        " backend yet: it lacks bf16 activation rounding (round_bf16 flags), FP8 1x128 activation quantisation "
        "before the FP8/FP4 GEMMs (LinearParams::act_quant_fp8; linear_fp8_block exists but is not wired), the FP8 "
        "KV record simulation (quant_sim) and the W4A8 MoE path (MoeParams::ref_numerics); use --backend cpu");
  if (precision_ != Precision::kFp32 && !backend.supports_reference_numerics())
    return Status::unsupported(std::string("precision profile ") + precision_name(precision_) +
                               " is not implemented on the " + backend.name() + " backend (use --backend cpu)");
  if (attn_weights_bf16_ && !backend.supports_attention_weights_bf16(attention_bf16_operands(numerics_of(precision_)),
                                                                    config_.num_heads, config_.head_dim))
    return Status::unsupported(std::string("bf16 attention weights (precision ") + precision_name(precision_) +
                               (attn_weights_named_ ? " with --attn-weights bf16" : "'s default") +
                               ") are not implemented on the " + backend.name() + " backend for " +
                               std::to_string(config_.num_heads) + " heads of " + std::to_string(config_.head_dim) +
                               " (the cpu and cuda backends: any); --attn-weights fp32 keeps the weights exact");
  // --index-keys needs only CompressorParams::key_precision, which every backend implements.
  return Status::ok();
}

// A sub-layer's output whose hc_post has not run yet: the next hc_boundary applies it, so a backend
// can fuse it with the next sub-layer's hc_pre and norm. `layer` tags the tap of the streams it makes.
struct Model::PendingPost {
  Tensor sublayer, post, comb;
  int64_t layer = -1;
  const char* tap_name = nullptr;
  HcPostParams params(const Tensor& streams, bool round_bf16) const {
    return {.streams = streams, .sublayer = sublayer, .post = post, .comb = comb, .round_bf16 = round_bf16};
  }
};

Tensor Model::forward(Backend& be, const BatchInfo& batch, const ForwardOptions& opt) const {
  const ModelConfig& c = config_;
  const bool ref = numerics_of(precision_).round_bf16;
  const int64_t T = batch.num_tokens(), S = c.hc_mult, D = c.hidden_size;
  // One step for the backend: it may record the ops and run them as one unit (CUDA graphs) unless
  // a tap reads tensors back in between.
  const StepScope step(be, T, opt.tap == nullptr);
  // streams is (T, S, D)
  Tensor streams = be.alloc(ElemType::kF32, {T, S, D});
  be.embed({.out = streams, .table = &weights_.embed}, batch);
  if (ref) be.quant_sim({.x = streams, .row = D, .dims = D, .kind = QuantSimKind::kBf16});
  if (opt.tap) (*opt.tap)("embed", streams);
  // Each layer's last hc_post runs in the next layer's first boundary (or before the head).
  PendingPost pending;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    layer_forward(be, batch, l, streams, opt, &pending);
    be.step_segment();
  }
  apply_pending(be, pending, streams, opt);
  // hidden is (T, D)
  Tensor hidden = be.alloc(ElemType::kF32, {T, D});
  be.hc_head({.out = hidden, .streams = streams, .weights = &weights_.hc_head, .hc_eps = c.hc_eps,
              .norm_eps = c.rms_norm_eps, .round_bf16 = ref});
  be.rms_norm({.out = hidden, .in = hidden, .weight = weights_.norm, .group = D, .eps = c.rms_norm_eps,
               .round_bf16 = ref});
  if (opt.tap) (*opt.tap)("head.hidden", hidden);
  if (opt.logits_rows) hidden = be.gather_rows(hidden, *opt.logits_rows);
  // logits is (rows, V); the reference computes them in fp32 too (spec §4 row 12).
  Tensor logits = be.alloc(ElemType::kF32, {hidden.dim(0), c.vocab_size});
  be.linear({.out = logits, .in = hidden, .weight = &weights_.head, .input_bf16 = ref});
  if (opt.tap) (*opt.tap)("logits", logits);
  return logits;
}

// The streams' update by `pending` (if any; its tap after it) and the hc_pre and input norm of the
// sub-layer at `site` (Backend::hc_boundary); `pending` is then empty.
void Model::hc_boundary(Backend& be, PendingPost& pending, Tensor& streams, const HcWeights& site,
                        const TensorView& norm, const Tensor& u, const Tensor& post, const Tensor& comb,
                        const ForwardOptions& opt) const {
  const ModelConfig& c = config_;
  const bool ref = numerics_of(precision_).round_bf16;
  be.hc_boundary({.post = pending.params(streams, ref),
                  .pre = {.out_input = u, .out_post = post, .out_comb = comb, .streams = streams, .weights = &site,
                          .sinkhorn_iters = c.hc_sinkhorn_iters, .hc_eps = c.hc_eps, .norm_eps = c.rms_norm_eps,
                          .round_bf16 = ref},
                  .norm_weight = norm,
                  .norm_eps = c.rms_norm_eps,
                  .norm_round_bf16 = ref});
  if (!pending.sublayer.empty()) tap(opt, pending.layer, pending.tap_name, streams);
  pending = {};
}

void Model::apply_pending(Backend& be, PendingPost& pending, Tensor& streams, const ForwardOptions& opt) const {
  if (pending.sublayer.empty()) return;
  be.hc_post(pending.params(streams, numerics_of(precision_).round_bf16));
  tap(opt, pending.layer, pending.tap_name, streams);
  pending = {};
}

// One decoder layer: mHC around attention, then mHC around the MoE (spec §3.5). The MoE's hc_post
// is left in `carry` for the next layer's first boundary when carry is set (the whole model), else
// applied here. The taps come in the order of the unfused ops'.
void Model::layer_forward(Backend& be, const BatchInfo& batch, int64_t l, Tensor& streams,
                          const ForwardOptions& opt, PendingPost* carry) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const int64_t T = batch.num_tokens(), S = c.hc_mult, D = c.hidden_size;
  Tensor u = be.alloc(ElemType::kF32, {T, D});
  Tensor post_attn = be.alloc(ElemType::kF32, {T, S}), comb_attn = be.alloc(ElemType::kF32, {T, S, S});
  Tensor post_ffn = be.alloc(ElemType::kF32, {T, S}), comb_ffn = be.alloc(ElemType::kF32, {T, S, S});
  PendingPost local;
  PendingPost& pending = carry ? *carry : local;

  hc_boundary(be, pending, streams, L.hc_attn, L.attn_norm, u, post_attn, comb_attn, opt);
  tap(opt, l, "hc_attn.post", post_attn);
  tap(opt, l, "hc_attn.comb", comb_attn);
  tap(opt, l, "attn.in", u);
  Tensor y = attention_forward(be, batch, l, u, opt);

  pending = {.sublayer = y, .post = post_attn, .comb = comb_attn, .layer = l, .tap_name = "hc_attn.out"};
  hc_boundary(be, pending, streams, L.hc_ffn, L.ffn_norm, u, post_ffn, comb_ffn, opt);
  tap(opt, l, "hc_ffn.post", post_ffn);
  tap(opt, l, "hc_ffn.comb", comb_ffn);
  tap(opt, l, "moe.in", u);
  Tensor z = moe_forward(be, batch, l, u, opt);
  pending = {.sublayer = z, .post = post_ffn, .comb = comb_ffn, .layer = l, .tap_name = "hc_ffn.out"};
  if (!carry) apply_pending(be, pending, streams, opt);
}

// Spec §3.3. x is (T, D); returns (T, D). Under deepseek-ref the linears the release stores as
// FP8 quantise their input (act_quant) and every stored tensor is bf16, as in the reference.
Tensor Model::attention_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x,
                                const ForwardOptions& opt) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const AttentionKind kind = c.attention[l];
  const RopeTable& rope = kind == AttentionKind::kSliding ? rope_main_ : rope_compress_;
  const Numerics nx = numerics_of(precision_);
  const bool ref = nx.round_bf16, aq = nx.act_quant_fp8;
  const int64_t T = batch.num_tokens(), H = c.num_heads, Dh = c.head_dim, D = c.hidden_size;
  const double eps = c.rms_norm_eps;

  // Q path: qr = q_norm(wq_a x); q = per-head unweighted norm(wq_b qr), rotated. wq_a and wkv
  // read the same x: one call, which a backend may run as one GEMM.
  Tensor qr = be.alloc(ElemType::kF32, {T, c.q_lora_rank});
  Tensor kv = be.alloc(ElemType::kF32, {T, 1, Dh});
  const LinearParams x_proj[] = {{.out = qr, .in = x, .weight = &L.wq_a, .act_quant_fp8 = aq, .round_bf16 = ref},
                                 {.out = kv, .in = x, .weight = &L.wkv, .act_quant_fp8 = aq, .round_bf16 = ref}};
  be.linears(x_proj);
  be.rms_norm({.out = qr, .in = qr, .weight = L.q_norm, .group = c.q_lora_rank, .eps = eps, .round_bf16 = ref});
  tap(opt, l, "attn.qr", qr);
  Tensor q = be.alloc(ElemType::kF32, {T, H, Dh});
  // A CSA layer's indexer q reads qr too (index_wq_b): one call with wq_b, which a backend may run
  // as one GEMM (one quantisation of qr); its rope and the rest stay with the indexer below.
  Tensor iq;
  if (kind == AttentionKind::kCsa) {
    iq = be.alloc(ElemType::kF32, {T, c.index_heads, c.index_head_dim});
    const LinearParams q_proj[] = {{.out = q, .in = qr, .weight = &L.wq_b, .act_quant_fp8 = aq, .round_bf16 = ref},
                                   {.out = iq, .in = qr, .weight = &L.index_wq_b, .act_quant_fp8 = aq, .round_bf16 = ref}};
    be.linears(q_proj);
  } else {
    be.linear({.out = q, .in = qr, .weight = &L.wq_b, .act_quant_fp8 = aq, .round_bf16 = ref});
  }
  // The per-head norm and rotation of q: here when tapping (the tap shows q as attention reads it),
  // else inside the attention (AttentionParams::q_rope: the same values; a backend may fold them
  // into its kernel).
  const bool q_in_attention = !opt.tap;
  if (!q_in_attention) {
    be.rms_norm({.out = q, .in = q, .weight = {}, .group = Dh, .eps = eps, .round_bf16 = ref});
    be.rope({.x = q, .table = &rope, .direction = RopeDirection::kForward, .round_bf16 = ref}, batch);
  }
  tap(opt, l, "attn.q", q);

  // KV path: one shared head, K = V. The reference stores its nope dims FP8-simulated.
  be.rms_norm({.out = kv, .in = kv, .weight = L.kv_norm, .group = Dh, .eps = eps, .round_bf16 = ref});
  be.rope({.x = kv, .table = &rope, .direction = RopeDirection::kForward, .round_bf16 = ref}, batch);
  kv = kv.reshaped({T, Dh});
  if (nx.kv_fp8) be.quant_sim({.x = kv, .row = Dh, .dims = c.nope_dim(), .kind = QuantSimKind::kFp8Pow2Block64});
  tap(opt, l, "attn.kv", kv);

  Tensor selected;
  if (kind != AttentionKind::kSliding) {
    const bool csa = kind == AttentionKind::kCsa;
    const int64_t width = csa ? 2 * Dh : Dh;
    // The compressor's projections run in fp32 in the reference too (spec §4 row 8).
    Tensor ckv = be.alloc(ElemType::kF32, {T, width});
    Tensor cgate = be.alloc(ElemType::kF32, {T, width});
    const LinearParams c_proj[] = {{.out = ckv, .in = x, .weight = &L.compressor.wkv, .input_bf16 = ref},
                                   {.out = cgate, .in = x, .weight = &L.compressor.wgate, .input_bf16 = ref}};
    be.linears(c_proj);
    std::vector<QuantSimKind> kv_sim, key_sim;
    if (nx.kv_fp8) kv_sim = {QuantSimKind::kFp8Pow2Block64};
    if (nx.index_hadamard_fp4) key_sim = {QuantSimKind::kHadamardBf16, QuantSimKind::kFp4Pow2Block32};
    be.compressor({.kv = ckv, .gate = cgate, .ape = L.compressor.ape, .norm_weight = L.compressor.norm,
                   .batch = &batch, .rope = &rope, .layer = l, .slot = CompressorSlot::kMain,
                   .ratio = c.compress_ratio[l], .dim = Dh, .overlap = csa, .norm_eps = eps,
                   .round_bf16 = ref, .entry_sim = kv_sim});
    if (csa) {
      // Lightning Indexer: its own compressor at index_head_dim, then scores and top-k.
      const int64_t Hi = c.index_heads, di = c.index_head_dim;
      Tensor ikv = be.alloc(ElemType::kF32, {T, 2 * di});
      Tensor igate = be.alloc(ElemType::kF32, {T, 2 * di});
      const LinearParams i_proj[] = {{.out = ikv, .in = x, .weight = &L.index_compressor.wkv, .input_bf16 = ref},
                                     {.out = igate, .in = x, .weight = &L.index_compressor.wgate, .input_bf16 = ref}};
      be.linears(i_proj);
      be.compressor({.kv = ikv, .gate = igate, .ape = L.index_compressor.ape,
                     .norm_weight = L.index_compressor.norm, .batch = &batch, .rope = &rope, .layer = l,
                     .slot = CompressorSlot::kIndexer, .ratio = c.compress_ratio[l], .dim = di, .overlap = true,
                     .norm_eps = eps, .key_precision = index_keys_, .round_bf16 = ref, .entry_sim = key_sim});
      SPARROW_CHECK_EQ(iq.numel(), T * Hi * di);  // (index_wq_b ran with wq_b above)
      be.rope({.x = iq, .table = &rope, .direction = RopeDirection::kForward, .round_bf16 = ref}, batch);
      if (nx.index_hadamard_fp4) {
        be.quant_sim({.x = iq, .row = di, .dims = di, .kind = QuantSimKind::kHadamardBf16});
        be.quant_sim({.x = iq, .row = di, .dims = di, .kind = QuantSimKind::kFp4Pow2Block32});
      }
      tap(opt, l, "attn.indexer.q", iq);
      Tensor iw = be.alloc(ElemType::kF32, {T, Hi});
      be.linear({.out = iw, .in = x, .weight = &L.index_weights_proj, .round_bf16 = ref, .input_bf16 = ref});
      tap(opt, l, "attn.indexer.weights", iw);
      selected = be.alloc(ElemType::kI32, {T, c.index_topk});
      Tensor scores;  // [T, C] only when tapping: C = entries visible to the batch's last token
      if (opt.tap) {
        int64_t C = 0;
        for (int64_t t = 0; t < T; ++t) C = std::max(C, (batch.positions[t] + 1) / c.compress_ratio[l]);
        scores = be.alloc(ElemType::kF32, {T, C});
      }
      be.indexer_topk({.out_indices = selected, .q = iq, .head_weights = iw, .batch = &batch, .layer = l,
                       .ratio = c.compress_ratio[l], .k = c.index_topk, .out_scores = scores, .bf16_scores = nx.index_bf16_scores,
                       .bf16_operands = ref});
      iq = Tensor();  // (made with q above; freed here as it was when the indexer made it)
      if (opt.tap) tap(opt, l, "attn.indexer.scores", scores);
      if (Tensor forced = forced_decision(be, opt, l, "attn.indexer.topk", T); !forced.empty()) {
        tap(opt, l, "attn.indexer.topk_own", selected);  // what this side would have picked
        selected = forced;
      }
      tap(opt, l, "attn.indexer.topk", selected);
    }
  }

  Tensor o = be.alloc(ElemType::kF32, {T, H, Dh});
  be.attention({.out = o, .q = q, .kv = kv, .selected = selected, .sinks = L.attn_sink, .batch = &batch, .layer = l,
                 .kind = kind, .ratio = c.compress_ratio[l], .window = c.sliding_window,
                 .scale = 1.0 / std::sqrt(static_cast<double>(Dh)), .round_bf16 = ref,
                 .bf16_operands = attention_bf16_operands(nx), .kv_record = attention_bf16_operands(nx),
                 .q_rope = q_in_attention ? &rope : nullptr, .q_norm_eps = eps,
                 .o_rope = q_in_attention ? &rope : nullptr, .weights_bf16 = attn_weights_bf16_});
  be.window_append({.kv = kv, .batch = &batch, .layer = l, .kv_record = attention_bf16_operands(nx)});
  // V carried rotated dims: undo the rotation at the query position (spec §3.3); inside the
  // attention call where no tap reads q (AttentionParams::o_rope: the same values).
  if (!q_in_attention) be.rope({.x = o, .table = &rope, .direction = RopeDirection::kInverse, .round_bf16 = ref}, batch);
  tap(opt, l, "attn.core", o);

  // wo_a is a bf16 GEMM in the reference (dequantised at conversion), wo_b an FP8 one.
  const int64_t G = c.o_groups;
  Tensor grouped = be.alloc(ElemType::kF32, {T, G * c.o_lora_rank});
  be.grouped_linear({.out = grouped, .in = o.reshaped({T, H * Dh}), .weight = &L.wo_a, .groups = G, .round_bf16 = ref});
  Tensor out = be.alloc(ElemType::kF32, {T, D});
  be.linear({.out = out, .in = grouped, .weight = &L.wo_b, .act_quant_fp8 = aq, .round_bf16 = ref});
  tap(opt, l, "attn.out", out);
  return out;
}

// Spec §3.4. x is (T, D); returns (T, D).
Tensor Model::moe_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x,
                          const ForwardOptions& opt) const {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  const int64_t T = batch.num_tokens(), K = c.experts_per_token;
  const bool ref = numerics_of(precision_).round_bf16;
  Tensor experts = be.alloc(ElemType::kI32, {T, K});
  Tensor weights = be.alloc(ElemType::kF32, {T, K});
  be.router({.out_experts = experts, .out_weights = weights, .x = x, .gate = &L.gate, .bias = L.gate_bias,
             .tid2eid = L.tid2eid, .batch = &batch, .kind = c.moe[l], .k = K,
             .routed_scale = c.routed_scaling_factor, .placement = opt.routed_scale_placement,
             .forced_experts = forced_decision(be, opt, l, "moe.router.experts", T), .input_bf16 = ref});
  tap(opt, l, "moe.router.experts", experts);
  tap(opt, l, "moe.router.weights", weights);
  Tensor out = be.alloc(ElemType::kF32, {T, c.hidden_size});
  be.moe({.out = out, .x = x, .experts = experts, .weights = weights, .routed = &L.experts,
          .shared = c.num_shared_experts == 1 ? &L.shared : nullptr, .swiglu_limit = c.swiglu_limit,
          .routed_scale = c.routed_scaling_factor, .placement = opt.routed_scale_placement,
          .ref_numerics = numerics_of(precision_).moe_ref});
  tap(opt, l, "moe.out", out);
  return out;
}

}  // namespace sparrow
