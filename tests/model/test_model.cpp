#include "model/test_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/npy.h"
#include "io/config_json.h"
#include "io/safetensors.h"

namespace sparrow::testing {

namespace {

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  std::vector<float> normal(int64_t n, double mean, double std) {
    std::normal_distribution<double> d(mean, std);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(d(rng_));
    return v;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

ModelConfig tiny_config(const std::vector<AttentionKind>& layers, int64_t hash_layers) {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = static_cast<int64_t>(layers.size());
  c.num_heads = 2;
  c.head_dim = 16;
  c.rope_dim = 4;
  c.q_lora_rank = 12;
  c.o_lora_rank = 8;
  c.o_groups = 2;
  c.sliding_window = 8;
  c.index_heads = 2;
  c.index_head_dim = 8;
  c.index_topk = 2;
  c.num_experts = 4;
  c.num_shared_experts = 1;
  c.experts_per_token = 2;
  c.moe_intermediate = 16;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 1.0;
  c.hc_mult = 2;
  c.hc_sinkhorn_iters = 20;
  c.max_position_embeddings = 4096;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.rope_main = {.theta = 10000.0};
  c.rope_compress = {.theta = 160000.0, .yarn = true, .yarn_factor = 4.0, .yarn_original_max_position = 256,
                     .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0};
  for (size_t i = 0; i < layers.size(); ++i) {
    c.attention.push_back(layers[i]);
    c.compress_ratio.push_back(layers[i] == AttentionKind::kCsa ? 4 : layers[i] == AttentionKind::kHca ? 8 : 0);
    c.moe.push_back(static_cast<int64_t>(i) < hash_layers ? MoeKind::kHash : MoeKind::kScored);
  }
  return c;
}

void write_test_model(const std::filesystem::path& dir, const ModelConfig& c, uint64_t seed,
                      const std::function<void(std::vector<TensorToWrite>&)>& mutate) {
  Gen g(seed);
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    ts.push_back({name, DType::kF32, std::move(shape), f32_bytes(v)});
  };
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, g.normal(out * in, 0.0, 1.0 / std::sqrt(static_cast<double>(in))));
  };
  auto norm = [&](const std::string& name, int64_t n) { add(name, {n}, g.normal(n, 1.0, 0.1)); };
  const int64_t D = c.hidden_size, S = c.hc_mult, H = c.num_heads, Dh = c.head_dim, mix = c.mix_dim();
  matrix("embed.weight", c.vocab_size, D);
  ts.back().bytes = f32_bytes(g.normal(c.vocab_size * D, 0.0, 1.0));
  matrix("head.weight", c.vocab_size, D);
  norm("norm.weight", D);
  add("hc_head_fn", {S, S * D}, g.normal(S * S * D, 0.0, 0.2));
  add("hc_head_base", {S}, g.normal(S, 0.0, 0.5));
  add("hc_head_scale", {1}, g.normal(1, 1.0, 0.2));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", D);
    norm(p + "ffn_norm.weight", D);
    for (const char* site : {"hc_attn", "hc_ffn"}) {
      add(p + site + "_fn", {mix, S * D}, g.normal(mix * S * D, 0.0, 0.2));
      add(p + site + "_base", {mix}, g.normal(mix, 0.0, 0.5));
      add(p + site + "_scale", {3}, g.normal(3, 1.0, 0.2));
    }
    add(p + "attn.attn_sink", {H}, g.normal(H, 0.0, 1.0));
    matrix(p + "attn.wq_a.weight", c.q_lora_rank, D);
    norm(p + "attn.q_norm.weight", c.q_lora_rank);
    matrix(p + "attn.wq_b.weight", H * Dh, c.q_lora_rank);
    matrix(p + "attn.wkv.weight", Dh, D);
    norm(p + "attn.kv_norm.weight", Dh);
    matrix(p + "attn.wo_a.weight", c.o_groups * c.o_lora_rank, H * Dh / c.o_groups);
    matrix(p + "attn.wo_b.weight", D, c.o_groups * c.o_lora_rank);
    const int64_t m = c.compress_ratio[l];
    auto compressor = [&](const std::string& cp, int64_t width, int64_t dim) {
      matrix(cp + "wkv.weight", width, D);
      matrix(cp + "wgate.weight", width, D);
      add(cp + "ape", {m, width}, g.normal(m * width, 0.0, 0.5));
      norm(cp + "norm.weight", dim);
    };
    if (c.attention[l] == AttentionKind::kCsa) {
      compressor(p + "attn.compressor.", 2 * Dh, Dh);
      matrix(p + "attn.indexer.wq_b.weight", c.index_heads * c.index_head_dim, c.q_lora_rank);
      matrix(p + "attn.indexer.weights_proj.weight", c.index_heads, D);
      compressor(p + "attn.indexer.compressor.", 2 * c.index_head_dim, c.index_head_dim);
    } else if (c.attention[l] == AttentionKind::kHca) {
      compressor(p + "attn.compressor.", Dh, Dh);
    }
    matrix(p + "ffn.gate.weight", c.num_experts, D);
    if (c.moe[l] == MoeKind::kHash) {
      std::vector<int64_t> ids(c.vocab_size * c.experts_per_token);
      std::vector<int64_t> perm(c.num_experts);
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g.rng());
        for (int64_t k = 0; k < c.experts_per_token; ++k) ids[v * c.experts_per_token + k] = perm[k];
      }
      std::vector<uint8_t> b(ids.size() * 8);
      std::memcpy(b.data(), ids.data(), b.size());
      ts.push_back({p + "ffn.gate.tid2eid", DType::kI64, {c.vocab_size, c.experts_per_token}, std::move(b)});
    } else {
      add(p + "ffn.gate.bias", {c.num_experts}, g.normal(c.num_experts, 0.0, 0.1));
    }
    auto expert = [&](const std::string& ep) {
      matrix(ep + "w1.weight", c.moe_intermediate, D);
      matrix(ep + "w2.weight", D, c.moe_intermediate);
      matrix(ep + "w3.weight", c.moe_intermediate, D);
    };
    for (int64_t e = 0; e < c.num_experts; ++e) expert(p + "ffn.experts." + std::to_string(e) + ".");
    expert(p + "ffn.shared_experts.");
  }
  if (mutate) mutate(ts);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << model_config_to_released_json(c);
  Status st = safetensors_write(dir / "model.safetensors", ts);
  if (!st.is_ok()) throw std::runtime_error(st.to_string());
}

std::vector<int32_t> fixture_ids(const std::string& name) {
  const auto path = std::filesystem::path(SPARROW_FIXTURES_DIR) / name / "ids.npy";
  auto array = npy_read(path);
  if (!array.is_ok()) throw std::runtime_error(array.status().to_string());
  std::vector<int32_t> ids;
  for (int64_t v : npy_to_i64(*array).value()) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

std::filesystem::path make_temp_dir(const std::string& tag) {
  static int counter = 0;
  std::random_device rd;
  auto dir = std::filesystem::temp_directory_path() /
             ("sparrow_" + tag + "_" + std::to_string(rd()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::filesystem::path copy_checkpoint_with_fault(const std::filesystem::path& src, const std::string& tensor,
                                                 float factor, const std::function<void(nlohmann::json&)>& edit_config) {
  const auto dir = make_temp_dir("fault");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  if (edit_config) edit_config(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  if (tensor.empty()) {
    // Only the config changes: every other file (one safetensors file, or the shards and their
    // index of a larger checkpoint) is linked, not copied.
    for (const auto& e : std::filesystem::directory_iterator(src))
      if (e.path().filename() != "config.json")
        std::filesystem::create_symlink(std::filesystem::absolute(e.path()), dir / e.path().filename());
    return dir;
  }
  auto file = SafetensorsFile::open(src / "model.safetensors").value();
  std::vector<TensorToWrite> out;
  bool found = false;
  for (const TensorView& t : file->tensors()) {
    TensorToWrite w{t.name, t.dtype, t.shape,
                    std::vector<uint8_t>(static_cast<const uint8_t*>(t.data),
                                         static_cast<const uint8_t*>(t.data) + t.nbytes)};
    if (t.name == tensor) {
      found = true;
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (t.dtype == DType::kF32) {
          float v;
          std::memcpy(&v, w.bytes.data() + 4 * i, 4);
          v *= factor;
          std::memcpy(w.bytes.data() + 4 * i, &v, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, w.bytes.data() + 2 * i, 2);
          h = f32_to_bf16(bf16_to_f32(h) * factor);
          std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        }
      }
    }
    out.push_back(std::move(w));
  }
  if (!found) throw std::runtime_error("copy_checkpoint_with_fault: no tensor " + tensor);
  if (!safetensors_write(dir / "model.safetensors", out).is_ok())
    throw std::runtime_error("copy_checkpoint_with_fault: cannot write " + (dir / "model.safetensors").string());
  return dir;
}

}  // namespace sparrow::testing
