#include "tools/quantize.h"

#include <cstring>
#include <map>
#include <variant>

#include "backends/cpu/weight_reader.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace sparrow {

namespace fs = std::filesystem;

namespace {

// The loaded model's tensors under their released names. The walk mirrors released_layout; the
// source checks each requested tensor's shape, so a mismatch between the two is caught.
class ModelSource : public TensorSource {
 public:
  explicit ModelSource(const Model& m) {
    const ModelWeights& w = m.weights();
    const ModelConfig& c = m.config();
    add("embed.weight", w.embed);
    add("head.weight", w.head);
    add("norm.weight", w.norm);
    add_hc("hc_head", w.hc_head);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& L = w.layers[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", L.attn_norm);
      add(p + "ffn_norm.weight", L.ffn_norm);
      add_hc(p + "hc_attn", L.hc_attn);
      add_hc(p + "hc_ffn", L.hc_ffn);
      const std::string a = p + "attn.";
      add(a + "attn_sink", L.attn_sink);
      add(a + "wq_a.weight", L.wq_a);
      add(a + "q_norm.weight", L.q_norm);
      add(a + "wq_b.weight", L.wq_b);
      add(a + "wkv.weight", L.wkv);
      add(a + "kv_norm.weight", L.kv_norm);
      add(a + "wo_a.weight", L.wo_a);
      add(a + "wo_b.weight", L.wo_b);
      add_compressor(a + "compressor.", L.compressor);
      add(a + "indexer.wq_b.weight", L.index_wq_b);
      add(a + "indexer.weights_proj.weight", L.index_weights_proj);
      add_compressor(a + "indexer.compressor.", L.index_compressor);
      const std::string f = p + "ffn.";
      add(f + "gate.weight", L.gate);
      add(f + "gate.bias", L.gate_bias);
      add(f + "gate.tid2eid", L.tid2eid);
      for (size_t e = 0; e < L.experts.size(); ++e) add_expert(f + "experts." + std::to_string(e) + ".", L.experts[e]);
      add_expert(f + "shared_experts.", L.shared);
    }
  }

  Status float_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, float* out) override {
    SPARROW_ASSIGN_OR_RETURN(const Ref ref, find(t));
    const int64_t C = t.cols();
    if (const auto* const* wm = std::get_if<const WeightMatrix*>(&ref)) {
      const WeightMatrix& w = **wm;
      parallel_for(r1 - r0, (r1 - r0) * C, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) cpu::weight_row(w, r0 + r, out + r * C);
      });
      return Status::ok();
    }
    const TensorView& v = *std::get<const TensorView*>(ref);
    if (v.dtype != DType::kF32 && v.dtype != DType::kBF16 && v.dtype != DType::kF16)
      return Status::invalid_argument("tensor '" + v.name + "' has dtype " + dtype_name(v.dtype) +
                                      ", expected a float dtype for '" + t.name + "'");
    for (int64_t i = 0; i < (r1 - r0) * C; ++i) out[i] = cpu::load_float(v, r0 * C + i);
    return Status::ok();
  }

  Status int_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, int64_t* out) override {
    SPARROW_ASSIGN_OR_RETURN(const Ref ref, find(t));
    const TensorView* v = std::holds_alternative<const TensorView*>(ref) ? std::get<const TensorView*>(ref) : nullptr;
    if (v == nullptr || (v->dtype != DType::kI64 && v->dtype != DType::kI32))
      return Status::internal("'" + t.name + "' is not an integer tensor in the loaded model");
    const int64_t C = t.cols();
    const auto* base = static_cast<const uint8_t*>(v->data);
    for (int64_t i = 0; i < (r1 - r0) * C; ++i) {
      const int64_t k = r0 * C + i;
      if (v->dtype == DType::kI64) {
        std::memcpy(&out[i], base + 8 * k, 8);
      } else {
        int32_t x;
        std::memcpy(&x, base + 4 * k, 4);
        out[i] = x;
      }
    }
    return Status::ok();
  }

 private:
  using Ref = std::variant<const WeightMatrix*, const TensorView*>;

  void add(const std::string& name, const WeightMatrix& w) {
    if (w.present()) refs_[name] = &w;
  }
  void add(const std::string& name, const TensorView& v) {
    if (v.data != nullptr) refs_[name] = &v;  // absent views (e.g. gate.bias on a hash layer) stay null
  }
  void add_hc(const std::string& p, const HcWeights& hc) {
    add(p + "_fn", hc.fn);
    add(p + "_base", hc.base);
    add(p + "_scale", hc.scale);
  }
  void add_compressor(const std::string& p, const CompressorWeights& cw) {
    add(p + "wkv.weight", cw.wkv);
    add(p + "wgate.weight", cw.wgate);
    add(p + "ape", cw.ape);
    add(p + "norm.weight", cw.norm);
  }
  void add_expert(const std::string& p, const ExpertWeights& e) {
    add(p + "w1.weight", e.w1);
    add(p + "w2.weight", e.w2);
    add(p + "w3.weight", e.w3);
  }

  Expected<Ref> find(const ReleasedTensor& t) const {
    const auto it = refs_.find(t.name);
    if (it == refs_.end()) return Status::internal("the loaded model has no tensor for '" + t.name + "'");
    std::vector<int64_t> shape;
    if (const auto* const* wm = std::get_if<const WeightMatrix*>(&it->second)) {
      shape = {(*wm)->out, (*wm)->in};
    } else {
      shape = std::get<const TensorView*>(it->second)->shape;
    }
    if (shape != t.shape) return Status::internal("'" + t.name + "' has a different shape in the loaded model");
    return it->second;
  }

  std::map<std::string, Ref> refs_;
};

}  // namespace

Status checkpoint_quantize(const fs::path& in_dir, const fs::path& out_dir, const ReleasedWriteOptions& options) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::equivalent(in_dir, out_dir, ec))
    return Status::invalid_argument("--out '" + out_dir.string() +
                                    "' is the input directory: the input's shards are read while the output is written");
  SPARROW_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(in_dir));
  ModelSource source(*model);
  SPARROW_RETURN_IF_ERROR(released_checkpoint_write(out_dir, model->config(), source, options));
  for (const char* extra : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    if (!fs::exists(in_dir / extra, ec)) continue;
    fs::copy_file(in_dir / extra, out_dir / extra, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::io_error((out_dir / extra).string() + ": cannot copy: " + ec.message());
  }
  return Status::ok();
}

}  // namespace sparrow
