#include "model/weights.h"

#include <cstring>
#include <sstream>
#include <string>

namespace sparrow {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Looks tensors up under the released name and the names transformers' save_pretrained writes.
class Resolver {
 public:
  explicit Resolver(const SafetensorsCheckpoint& ckpt) : ckpt_(ckpt) {}

  // `stem` is the released name; `aliases` are other spellings (without the "model." prefix).
  const TensorView* find(const std::string& stem, std::initializer_list<std::string> aliases = {}) const {
    for (const std::string& n : candidates(stem, aliases))
      if (const TensorView* t = ckpt_.find(n)) return t;
    return nullptr;
  }

  Status missing(const std::string& stem, std::initializer_list<std::string> aliases = {}) const {
    std::string tried;
    for (const std::string& n : candidates(stem, aliases)) tried += (tried.empty() ? "'" : ", '") + n + "'";
    return Status::not_found("missing tensor '" + stem + "' (looked for " + tried + ")");
  }

 private:
  static std::vector<std::string> candidates(const std::string& stem, std::initializer_list<std::string> aliases) {
    std::vector<std::string> out{stem, "model." + stem};
    for (const std::string& a : aliases) {
      out.push_back(a);
      out.push_back("model." + a);
    }
    return out;
  }
  const SafetensorsCheckpoint& ckpt_;
};

Status check_shape(const TensorView& t, const std::vector<int64_t>& want) {
  if (t.shape != want)
    return Status::invalid_argument("tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", expected " +
                                    shape_str(want) + " from config.json");
  return Status::ok();
}

// A float parameter vector or table (norm weights, hc_*, attn_sink, ape, gate.bias).
Status load_param(const Resolver& r, const std::string& stem, const std::vector<int64_t>& shape, TensorView* out,
                  std::initializer_list<std::string> aliases = {}) {
  const TensorView* t = r.find(stem, aliases);
  if (!t) return r.missing(stem, aliases);
  if (!is_float(t->dtype))
    return Status::invalid_argument("tensor '" + t->name + "' has dtype " + dtype_name(t->dtype) +
                                    ", expected a float dtype (F32, BF16 or F16)");
  SPARROW_RETURN_IF_ERROR(check_shape(*t, shape));
  *out = *t;
  return Status::ok();
}

enum class QuantAllowed { kFloatOrFp8, kAny };

// A linear weight `<stem>.weight` with logical shape [out, in]: float, FP8 e4m3 with 128x128 block
// scales (`<stem>.scale`, e8m0 or F32), or (experts) packed FP4 with 1x32 e8m0 scales.
Status load_matrix(const Resolver& r, const std::string& stem, int64_t out, int64_t in, WeightMatrix* w,
                   QuantAllowed allowed = QuantAllowed::kFloatOrFp8,
                   std::initializer_list<std::string> aliases = {}) {
  const std::string wname = stem + ".weight";
  std::vector<std::string> alias_w;
  const TensorView* t = nullptr;
  for (const std::string& a : aliases)
    if (!t) t = r.find(a + ".weight");
  if (!t) t = r.find(wname);
  if (!t) return r.missing(wname);
  w->out = out;
  w->in = in;
  w->data = *t;
  if (is_float(t->dtype)) {
    w->format = WeightFormat::kFloat;
    return check_shape(*t, {out, in});
  }
  const std::string tname = t->name;
  const std::string base = tname.substr(0, tname.size() - std::strlen(".weight"));
  const TensorView* s = r.find(base + ".scale");
  if (!s) s = r.find(base + ".weight_scale_inv");
  if (t->dtype == DType::kF8E4M3) {
    SPARROW_RETURN_IF_ERROR(check_shape(*t, {out, in}));
    if (!s) return Status::not_found("FP8 tensor '" + tname + "' has no scale tensor '" + base + ".scale'");
    if (s->dtype != DType::kF8E8M0 && s->dtype != DType::kF32)
      return Status::invalid_argument("scale tensor '" + s->name + "' has dtype " + dtype_name(s->dtype) +
                                      ", expected F8_E8M0 or F32");
    SPARROW_RETURN_IF_ERROR(check_shape(*s, {ceil_div(out, 128), ceil_div(in, 128)}));
    w->format = WeightFormat::kFp8Block;
    w->scale = *s;
    w->block_out = 128;
    w->block_in = 128;
    return Status::ok();
  }
  if ((t->dtype == DType::kI8 || t->dtype == DType::kU8) && allowed == QuantAllowed::kAny) {
    if (in % 32 != 0)
      return Status::invalid_argument("FP4 tensor '" + tname + "': input size " + std::to_string(in) +
                                      " is not a multiple of 32");
    SPARROW_RETURN_IF_ERROR(check_shape(*t, {out, in / 2}));
    if (!s) return Status::not_found("FP4 tensor '" + tname + "' has no scale tensor '" + base + ".scale'");
    if (s->dtype != DType::kF8E8M0)
      return Status::invalid_argument("scale tensor '" + s->name + "' has dtype " + dtype_name(s->dtype) +
                                      ", expected F8_E8M0");
    SPARROW_RETURN_IF_ERROR(check_shape(*s, {out, in / 32}));
    w->format = WeightFormat::kFp4Packed;
    w->scale = *s;
    w->block_out = 1;
    w->block_in = 32;
    return Status::ok();
  }
  return Status::invalid_argument("tensor '" + tname + "' has dtype " + dtype_name(t->dtype) +
                                  (allowed == QuantAllowed::kAny ? ", expected F32/BF16/F16, F8_E4M3 or packed FP4 (I8)"
                                                                 : ", expected F32/BF16/F16 or F8_E4M3"));
}

Status load_hc(const Resolver& r, const std::string& fn, const std::string& base, const std::string& scale,
               int64_t mix, int64_t width, int64_t nscale, HcWeights* hc,
               std::initializer_list<std::string> fn_alias, std::initializer_list<std::string> base_alias,
               std::initializer_list<std::string> scale_alias) {
  SPARROW_RETURN_IF_ERROR(load_param(r, fn, {mix, width}, &hc->fn, fn_alias));
  SPARROW_RETURN_IF_ERROR(load_param(r, base, {mix}, &hc->base, base_alias));
  return load_param(r, scale, {nscale}, &hc->scale, scale_alias);
}

Status load_compressor(const Resolver& r, const std::string& p, int64_t width, int64_t dim, int64_t ratio,
                       int64_t D, CompressorWeights* c) {
  SPARROW_RETURN_IF_ERROR(load_matrix(r, p + "wkv", width, D, &c->wkv));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, p + "wgate", width, D, &c->wgate));
  SPARROW_RETURN_IF_ERROR(load_param(r, p + "ape", {ratio, width}, &c->ape));
  return load_param(r, p + "norm.weight", {dim}, &c->norm);
}

Status load_tid2eid(const Resolver& r, const std::string& stem, const ModelConfig& c, TensorView* out) {
  const TensorView* t = r.find(stem);
  if (!t) return r.missing(stem);
  if (t->dtype != DType::kI64 && t->dtype != DType::kI32)
    return Status::invalid_argument("tensor '" + t->name + "' has dtype " + dtype_name(t->dtype) +
                                    ", expected I64 or I32");
  SPARROW_RETURN_IF_ERROR(check_shape(*t, {c.vocab_size, c.experts_per_token}));
  // Every entry must name an expert: a bad id would index out of the expert table.
  const int64_t n = t->numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    if (t->dtype == DType::kI64) {
      std::memcpy(&v, static_cast<const uint8_t*>(t->data) + 8 * i, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, static_cast<const uint8_t*>(t->data) + 4 * i, 4);
      v = v32;
    }
    if (v < 0 || v >= c.num_experts)
      return Status::invalid_argument("tensor '" + t->name + "' entry [" + std::to_string(i / c.experts_per_token) +
                                      ", " + std::to_string(i % c.experts_per_token) + "] = " + std::to_string(v) +
                                      " is not an expert id in [0, " + std::to_string(c.num_experts) + ")");
  }
  *out = *t;
  return Status::ok();
}

// config.json's expert_dtype ("fp4": packed e2m1 in I8, "fp8": F8_E4M3) says how the routed experts
// are stored; a quantised expert in the other format means the config and the tensors disagree.
// Float experts are unambiguous and accepted whatever expert_dtype says.
Status check_expert_dtype(const WeightMatrix& w, const std::string& expert_dtype) {
  const bool mismatch = (expert_dtype == "fp4" && w.format == WeightFormat::kFp8Block) ||
                        (expert_dtype == "fp8" && w.format == WeightFormat::kFp4Packed);
  if (!mismatch) return Status::ok();
  return Status::invalid_argument("tensor '" + w.data.name + "' has dtype " + dtype_name(w.data.dtype) +
                                  ", expected " + (expert_dtype == "fp4" ? "I8 (packed FP4)" : "F8_E4M3") +
                                  " because config.json says expert_dtype \"" + expert_dtype + "\"");
}

Status load_expert(const Resolver& r, const std::string& p, int64_t F, int64_t D, ExpertWeights* e,
                   const std::string& expert_dtype = "") {
  SPARROW_RETURN_IF_ERROR(load_matrix(r, p + "w1", F, D, &e->w1, QuantAllowed::kAny));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, p + "w2", D, F, &e->w2, QuantAllowed::kAny));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, p + "w3", F, D, &e->w3, QuantAllowed::kAny));
  for (const WeightMatrix* w : {&e->w1, &e->w2, &e->w3}) SPARROW_RETURN_IF_ERROR(check_expert_dtype(*w, expert_dtype));
  return Status::ok();
}

Status load_layer(const Resolver& r, const ModelConfig& c, int64_t i, LayerWeights* L) {
  const std::string p = "layers." + std::to_string(i) + ".";
  const int64_t D = c.hidden_size, S = c.hc_mult, H = c.num_heads, Dh = c.head_dim;
  SPARROW_RETURN_IF_ERROR(load_param(r, p + "attn_norm.weight", {D}, &L->attn_norm));
  SPARROW_RETURN_IF_ERROR(load_param(r, p + "ffn_norm.weight", {D}, &L->ffn_norm));
  SPARROW_RETURN_IF_ERROR(load_hc(r, p + "hc_attn_fn", p + "hc_attn_base", p + "hc_attn_scale", c.mix_dim(), S * D, 3,
                                  &L->hc_attn, {}, {}, {}));
  SPARROW_RETURN_IF_ERROR(load_hc(r, p + "hc_ffn_fn", p + "hc_ffn_base", p + "hc_ffn_scale", c.mix_dim(), S * D, 3,
                                  &L->hc_ffn, {}, {}, {}));
  const std::string a = p + "attn.";
  SPARROW_RETURN_IF_ERROR(load_param(r, a + "attn_sink", {H}, &L->attn_sink));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "wq_a", c.q_lora_rank, D, &L->wq_a));
  SPARROW_RETURN_IF_ERROR(load_param(r, a + "q_norm.weight", {c.q_lora_rank}, &L->q_norm));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "wq_b", H * Dh, c.q_lora_rank, &L->wq_b));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "wkv", Dh, D, &L->wkv));
  // transformers writes the attention's KV norm as `attn.norm.weight`.
  SPARROW_RETURN_IF_ERROR(load_param(r, a + "kv_norm.weight", {Dh}, &L->kv_norm, {a + "norm.weight"}));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "wo_a", c.o_groups * c.o_lora_rank, H * Dh / c.o_groups, &L->wo_a));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "wo_b", D, c.o_groups * c.o_lora_rank, &L->wo_b));
  const int64_t m = c.compress_ratio[i];
  if (c.attention[i] == AttentionKind::kCsa) {
    SPARROW_RETURN_IF_ERROR(load_compressor(r, a + "compressor.", 2 * Dh, Dh, m, D, &L->compressor));
    const int64_t Hi = c.index_heads, di = c.index_head_dim;
    SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "indexer.wq_b", Hi * di, c.q_lora_rank, &L->index_wq_b));
    SPARROW_RETURN_IF_ERROR(load_matrix(r, a + "indexer.weights_proj", Hi, D, &L->index_weights_proj,
                                        QuantAllowed::kFloatOrFp8, {a + "indexer.scorer.weights_proj"}));
    SPARROW_RETURN_IF_ERROR(load_compressor(r, a + "indexer.compressor.", 2 * di, di, m, D, &L->index_compressor));
  } else if (c.attention[i] == AttentionKind::kHca) {
    SPARROW_RETURN_IF_ERROR(load_compressor(r, a + "compressor.", Dh, Dh, m, D, &L->compressor));
  }
  const std::string f = p + "ffn.";
  SPARROW_RETURN_IF_ERROR(load_matrix(r, f + "gate", c.num_experts, D, &L->gate));
  if (c.moe[i] == MoeKind::kHash) {
    SPARROW_RETURN_IF_ERROR(load_tid2eid(r, f + "gate.tid2eid", c, &L->tid2eid));
  } else {
    SPARROW_RETURN_IF_ERROR(load_param(r, f + "gate.bias", {c.num_experts}, &L->gate_bias));
  }
  L->experts.resize(c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e)
    SPARROW_RETURN_IF_ERROR(
        load_expert(r, f + "experts." + std::to_string(e) + ".", c.moe_intermediate, D, &L->experts[e], c.expert_dtype));
  if (c.num_shared_experts == 1)
    SPARROW_RETURN_IF_ERROR(load_expert(r, f + "shared_experts.", c.moe_intermediate, D, &L->shared));
  return Status::ok();
}

}  // namespace

Expected<ModelWeights> model_weights_load(const SafetensorsCheckpoint& ckpt, const ModelConfig& c,
                                          const std::function<void(int64_t done, int64_t total)>& progress) {
  Resolver r(ckpt);
  ModelWeights w;
  const int64_t D = c.hidden_size, S = c.hc_mult;
  SPARROW_RETURN_IF_ERROR(load_matrix(r, "embed", c.vocab_size, D, &w.embed, QuantAllowed::kFloatOrFp8,
                                      {"embed_tokens", "model.embed_tokens"}));
  SPARROW_RETURN_IF_ERROR(load_matrix(r, "head", c.vocab_size, D, &w.head, QuantAllowed::kFloatOrFp8, {"lm_head"}));
  SPARROW_RETURN_IF_ERROR(load_param(r, "norm.weight", {D}, &w.norm));
  SPARROW_RETURN_IF_ERROR(load_hc(r, "hc_head_fn", "hc_head_base", "hc_head_scale", S, S * D, 1, &w.hc_head,
                                  {"hc_head.hc_fn"}, {"hc_head.hc_base"}, {"hc_head.hc_scale"}));
  w.layers.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    SPARROW_RETURN_IF_ERROR(load_layer(r, c, i, &w.layers[i]));
    if (progress) progress(i + 1, c.num_layers);
  }
  return w;
}

}  // namespace sparrow
