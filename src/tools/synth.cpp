#include "tools/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/quant.h"
#include "core/thread_pool.h"

namespace sparrow {

namespace {

constexpr int64_t kFlashLayers = 43;
constexpr int64_t kFlashExpertsPerToken = 6;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Approximately N(0, 1): the sum of four 16-bit uniforms has mean 2 and variance 1/3 (in units of
// 65536); one 64-bit draw per value keeps a 160 GB model's generation I/O-bound.
inline float approx_normal(uint64_t& state) {
  const uint64_t r = splitmix64(state);
  const float sum = static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 65536
  return (sum - 131070.0f) * kScale;
}

class RandomSource : public TensorSource {
 public:
  RandomSource(const ModelConfig& c, uint64_t seed, double hc_scale_std)
      : c_(c), seed_(seed), hc_scale_std_(static_cast<float>(hc_scale_std)) {}

  Status float_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, float* out) override {
    const int64_t C = t.cols();
    const uint64_t base = tensor_seed(t);
    parallel_for(r1 - r0, (r1 - r0) * C * 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fill_row(t, base, r0 + i, out + i * C);
    });
    return Status::ok();
  }

  Status int_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, int64_t* out) override {
    const int64_t K = t.cols(), E = c_.num_experts;
    const uint64_t base = tensor_seed(t);
    for (int64_t r = r0; r < r1; ++r) {
      uint64_t s = row_seed(base, r);
      int64_t* ids = out + (r - r0) * K;
      for (int64_t k = 0; k < K; ++k) {
        int64_t e;
        do e = static_cast<int64_t>(splitmix64(s) % static_cast<uint64_t>(E));
        while (std::find(ids, ids + k, e) != ids + k);
        ids[k] = e;
      }
    }
    return Status::ok();
  }

  // MXFP4 experts straight as codes: per 1x32 block a scale 2^(k+d) with d in {-1, 0, 0, +1} (so
  // tiles differ, as real ones do), and 32 nibbles drawn from a 256-entry table of N(0, sigma^2)
  // quantiles rounded to e2m1. k and sigma are set so the values' RMS is about 1/sqrt(in), like the
  // float linears: RMS = sigma * 2^k * sqrt(E[4^d]) = sigma * 2^k * 1.25.
  bool fp4_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, uint8_t* packed, uint8_t* scales) override {
    const int64_t C = t.cols(), blocks = C / 32;
    const double target = 1.0 / std::sqrt(static_cast<double>(C)) / 1.25;
    const int k = static_cast<int>(std::ceil(std::log2(target / 2.5)));  // sigma in (1.25, 2.5]
    const double sigma = target / std::ldexp(1.0, k);
    uint8_t table[256];
    for (int u = 0; u < 256; ++u) table[u] = f32_to_e2m1(static_cast<float>(sigma * normal_quantile((u + 0.5) / 256)));
    const uint64_t base = tensor_seed(t);
    parallel_for(r1 - r0, (r1 - r0) * C, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        uint64_t s = row_seed(base, r0 + i);
        uint8_t* row = packed + i * (C / 2);
        for (int64_t blk = 0; blk < blocks; ++blk) {
          static constexpr int kOffset[4] = {-1, 0, 0, 1};
          scales[i * blocks + blk] = e8m0_from_exponent(k + kOffset[splitmix64(s) & 3]);
          for (int q = 0; q < 4; ++q) {  // 4 draws of 8 random bytes: 16 packed bytes
            const uint64_t r = splitmix64(s);
            for (int j = 0; j < 4; ++j)
              row[blk * 16 + q * 4 + j] = static_cast<uint8_t>(table[(r >> (16 * j)) & 0xFF] |
                                                               table[(r >> (16 * j + 8)) & 0xFF] << 4);
          }
        }
      }
    });
    return true;
  }

 private:
  // Phi^-1(p) by bisection on erfc (only 256 evaluations per tensor).
  static double normal_quantile(double p) {
    double lo = -10.0, hi = 10.0;
    for (int it = 0; it < 100; ++it) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  }

  uint64_t tensor_seed(const ReleasedTensor& t) const {
    uint64_t s = seed_ ^ fnv1a64(t.name);
    return splitmix64(s);
  }
  static uint64_t row_seed(uint64_t base, int64_t row) {
    uint64_t s = base + static_cast<uint64_t>(row) * 0xD1B54A32D192ED03ull;
    return splitmix64(s);
  }

  void fill_row(const ReleasedTensor& t, uint64_t base, int64_t row, float* out) const {
    const int64_t C = t.cols(), S = c_.hc_mult;
    uint64_t s = row_seed(base, row);
    auto normal = [&](float mean, float std) {
      for (int64_t i = 0; i < C; ++i) out[i] = mean + std * approx_normal(s);
    };
    switch (t.kind) {
      case TensorKind::kEmbed: return normal(0.0f, 1.0f);
      case TensorKind::kLinear: return normal(0.0f, 1.0f / std::sqrt(static_cast<float>(C)));
      case TensorKind::kNorm: return normal(1.0f, 0.02f);
      case TensorKind::kHcFn: return normal(0.0f, 0.5f / std::sqrt(static_cast<float>(C)));
      case TensorKind::kHcScale: return normal(1.0f, hc_scale_std_);
      case TensorKind::kSink: return normal(0.0f, 0.5f);
      case TensorKind::kApe: return normal(0.0f, 0.1f);
      case TensorKind::kGateBias: return normal(0.0f, 0.01f);
      case TensorKind::kHcBase: {
        // pre = sigmoid(base) ~ 1/S; then (sites only) post 0 and comb with a unit diagonal.
        const float pre = -std::log(static_cast<float>(S - 1 > 0 ? S - 1 : 1));
        for (int64_t i = 0; i < C; ++i) {
          float v = 0.0f;
          if (i < S) {
            v = pre;
          } else if (i >= 2 * S) {
            const int64_t j = (i - 2 * S) / S, k = (i - 2 * S) % S;
            v = j == k ? 1.0f : 0.0f;
          }
          out[i] = v + 0.1f * approx_normal(s);
        }
        return;
      }
      case TensorKind::kTid2eid: return normal(0.0f, 0.0f);  // integer: int_rows
    }
  }

  const ModelConfig& c_;
  uint64_t seed_;
  float hc_scale_std_;
};

}  // namespace

Expected<ModelConfig> v4_flash_config(int64_t layers, int64_t experts) {
  if (layers < 1 || layers > kFlashLayers)
    return Status::invalid_argument("--layers " + std::to_string(layers) + ": V4-Flash has 1 to " +
                                    std::to_string(kFlashLayers) + " main layers");
  if (experts < kFlashExpertsPerToken)
    return Status::invalid_argument("--experts " + std::to_string(experts) + ": must be at least " +
                                    std::to_string(kFlashExpertsPerToken) + " (num_experts_per_tok)");
  ModelConfig c;
  c.vocab_size = 129280;
  c.hidden_size = 4096;
  c.num_layers = layers;
  c.num_heads = 64;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.q_lora_rank = 1024;
  c.o_lora_rank = 1024;
  c.o_groups = 8;
  c.sliding_window = 128;
  c.index_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.num_experts = experts;
  c.num_shared_experts = 1;
  c.experts_per_token = kFlashExpertsPerToken;
  c.moe_intermediate = 2048;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.norm_topk_prob = true;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 1048576;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.tie_word_embeddings = false;
  c.rope_main = {.theta = 10000.0};
  c.rope_compress = {.theta = 160000.0, .yarn = true, .yarn_factor = 16.0, .yarn_original_max_position = 65536,
                     .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0};
  // compress_ratios = [0, 0] + [4, 128] * 20 + [4] for the 43 main layers (spec §1.2).
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t ratio = i < 2 ? 0 : (i % 2 == 0 ? 4 : 128);
    c.compress_ratio.push_back(ratio);
    c.attention.push_back(ratio == 0 ? AttentionKind::kSliding : ratio == 4 ? AttentionKind::kCsa : AttentionKind::kHca);
    c.moe.push_back(i < 3 ? MoeKind::kHash : MoeKind::kScored);
  }
  c.fp8_weights = true;
  c.expert_dtype = "fp4";
  return c;
}

Expected<ModelConfig> synth_preset_config(const std::string& preset, int64_t layers, int64_t experts) {
  if (preset == "v4-flash") return v4_flash_config(layers, experts);
  return Status::invalid_argument("--preset '" + preset + "' is not a known preset (available: v4-flash)");
}

Status checkpoint_synthesize(const std::filesystem::path& dir, const ModelConfig& c, uint64_t seed,
                             const ReleasedWriteOptions& options, double hc_scale_std) {
  if (!(hc_scale_std >= 0.0 && hc_scale_std <= 1.0)) {
    char v[32];
    std::snprintf(v, sizeof v, "%g", hc_scale_std);
    return Status::invalid_argument(std::string("--hc-scale-std ") + v + " is outside [0, 1]");
  }
  RandomSource source(c, seed, hc_scale_std);
  return released_checkpoint_write(dir, c, source, options);
}

}  // namespace sparrow
