// The CPU reference backend: plain loops, fp32 activations, fp64 accumulation in reductions.
//
// This backend is the specification the fast backends are tested against, so every op is written
// for clarity first: one output element is computed by one thread in a fixed order, which makes
// results deterministic and independent of the thread count and of which other tokens share the
// batch (batch invariance). Formulas cite spec sections (../shared/docs/dsv4-spec.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backends/cpu/cpu_state.h"
#include "backends/cpu/weight_reader.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/backend.h"

namespace sparrow {
namespace cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Token t's id: from BatchInfo::device_token_ids when given (host memory on this backend).
int64_t token_at(const BatchInfo& b, int64_t t) {
  return b.device_token_ids.empty() ? b.token_ids[t] : b.device_token_ids.i32()[t];
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// log(sqrt(softplus(x))), finite for every finite x: softplus(x) = x above 20 (PyTorch's
// threshold), log1p(exp(x)) below, and ~exp(x) below -30 where log(softplus) = x. Scores are
// compared and normalised in log space so the weights never become 0/0 (traps.md row 6).
double log_sqrt_softplus(double x) {
  double log_sp;
  if (x > 20.0) {
    log_sp = std::log(x);
  } else if (x < -30.0) {
    log_sp = x + std::log1p(-0.5 * std::exp(x));  // log(log1p(e^x)) ~ x - e^x/2
  } else {
    log_sp = std::log(std::log1p(std::exp(x)));
  }
  return 0.5 * log_sp;
}

// Rotates the pairs (x[2i], x[2i+1]) of a trailing rope slice by pos * inv_freq[i] (spec §3.0.3).
void rotate(float* rope_part, const RopeTable& table, double pos, RopeDirection dir) {
  const double sign = dir == RopeDirection::kInverse ? -1.0 : 1.0;
  for (size_t i = 0; i < table.inv_freq.size(); ++i) {
    const double angle = pos * table.inv_freq[i];
    const double c = std::cos(angle);
    const double s = sign * std::sin(angle);
    const double x0 = rope_part[2 * i];
    const double x1 = rope_part[2 * i + 1];
    rope_part[2 * i] = static_cast<float>(x0 * c - x1 * s);
    rope_part[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

// y = x * rsqrt(mean(x^2) + eps) [* w], in place on n values.
void rms_normalise(float* x, int64_t n, const TensorView* weight, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i] * r;
    if (weight) v *= load_float(*weight, i);
    x[i] = static_cast<float>(v);
  }
}

void apply_sim(float* x, int64_t n, QuantSimKind kind) {
  switch (kind) {
    case QuantSimKind::kFp8Pow2Block64:
      return fp8_pow2_quant_sim(x, n, 64);
    case QuantSimKind::kFp4Pow2Block32:
      return fp4_pow2_quant_sim(x, n);
    case QuantSimKind::kHadamardBf16:
      hadamard_transform(x, n);
      return bf16_round_inplace(x, n);
    case QuantSimKind::kBf16:
      return bf16_round_inplace(x, n);
  }
}

double dot(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// mix = fn . normalise(flatten(X)) for one token (spec §3.2 steps 1-2).
void hc_mix(const float* streams, int64_t width, const TensorView& fn, int64_t mix, double norm_eps,
            std::vector<double>& out) {
  double ss = 0.0;
  for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(streams[i]) * streams[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(width) + norm_eps);
  out.assign(mix, 0.0);
  for (int64_t m = 0; m < mix; ++m) {
    double acc = 0.0;
    for (int64_t i = 0; i < width; ++i) acc += static_cast<double>(load_float(fn, m * width + i)) * streams[i];
    out[m] = acc * r;
  }
}

// out = sum_j pre_j X[j] over the S streams of one token (mHC pre, hc_head), optionally bf16.
void collapse_streams(float* out, const float* X, const std::vector<double>& pre, int64_t D, bool round_bf16) {
  const int64_t S = static_cast<int64_t>(pre.size());
  for (int64_t d = 0; d < D; ++d) {
    double acc = 0.0;
    for (int64_t j = 0; j < S; ++j) acc += pre[j] * X[j * D + d];
    out[d] = static_cast<float>(acc);
  }
  if (round_bf16) bf16_round_inplace(out, D);
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  Tensor alloc(ElemType type, std::vector<int64_t> shape) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
    std::shared_ptr<void> storage(::operator new(bytes), [](void* p) { ::operator delete(p); });
    std::memset(storage.get(), 0, bytes);
    return Tensor(storage, storage.get(), type, std::move(shape));
  }

  Tensor upload_f32(const std::vector<float>& values, std::vector<int64_t> shape) override {
    Tensor t = alloc(ElemType::kF32, std::move(shape));
    SPARROW_CHECK_EQ(t.numel(), static_cast<int64_t>(values.size()));
    std::memcpy(t.f32(), values.data(), values.size() * sizeof(float));
    return t;
  }

  Tensor upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> shape) override {
    Tensor t = alloc(ElemType::kI32, std::move(shape));
    SPARROW_CHECK_EQ(t.numel(), static_cast<int64_t>(values.size()));
    std::memcpy(t.i32(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }

  std::vector<float> download_f32(const Tensor& t) override {
    SPARROW_CHECK(t.type() == ElemType::kF32);
    return std::vector<float>(t.f32(), t.f32() + t.numel());
  }

  std::vector<int32_t> download_i32(const Tensor& t) override {
    SPARROW_CHECK(t.type() == ElemType::kI32);
    return std::vector<int32_t>(t.i32(), t.i32() + t.numel());
  }

  std::unique_ptr<SequenceState> create_sequence_state(const ModelConfig& config) override {
    return std::make_unique<CpuSequenceState>(config);
  }

  void embed(const EmbedParams& p, const BatchInfo& batch) override {
    // out is (T, S, D)
    const int64_t T = p.out.dim(0), S = p.out.dim(1), D = p.out.dim(2);
    parallel_for(T, T * S * D, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* row = p.out.f32() + t * S * D;
        weight_row(*p.table, token_at(batch, t), row);
        for (int64_t s = 1; s < S; ++s) std::memcpy(row + s * D, row, D * sizeof(float));
      }
    });
  }

  // Spec §3.2: pre/post/comb from the flattened streams, Sinkhorn with eps in every denominator,
  // then u = sum_j pre_j X[j].
  void hc_pre(const HcPreParams& p) override {
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    const int64_t mix = (2 + S) * S;
    const HcWeights& w = *p.weights;
    const double eps = p.hc_eps;
    const double scale_pre = load_float(w.scale, 0), scale_post = load_float(w.scale, 1),
                 scale_comb = load_float(w.scale, 2);
    parallel_for(T, T * S * D * 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* X = p.streams.f32() + t * S * D;
        std::vector<double> m;
        hc_mix(X, S * D, w.fn, mix, p.norm_eps, m);
        std::vector<double> pre(S), comb(S * S);
        for (int64_t j = 0; j < S; ++j) {
          pre[j] = sigmoid(m[j] * scale_pre + load_float(w.base, j)) + eps;
          p.out_post.f32()[t * S + j] = static_cast<float>(2.0 * sigmoid(m[S + j] * scale_post + load_float(w.base, S + j)));
        }
        for (int64_t j = 0; j < S; ++j) {
          // Row j: softmax over k, then + eps.
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t k = 0; k < S; ++k) {
            comb[j * S + k] = m[2 * S + j * S + k] * scale_comb + load_float(w.base, 2 * S + j * S + k);
            mx = std::max(mx, comb[j * S + k]);
          }
          double sum = 0.0;
          for (int64_t k = 0; k < S; ++k) sum += (comb[j * S + k] = std::exp(comb[j * S + k] - mx));
          for (int64_t k = 0; k < S; ++k) comb[j * S + k] = comb[j * S + k] / sum + eps;
        }
        auto normalise_columns = [&] {
          for (int64_t k = 0; k < S; ++k) {
            double sum = 0.0;
            for (int64_t j = 0; j < S; ++j) sum += comb[j * S + k];
            for (int64_t j = 0; j < S; ++j) comb[j * S + k] /= sum + eps;
          }
        };
        auto normalise_rows = [&] {
          for (int64_t j = 0; j < S; ++j) {
            double sum = 0.0;
            for (int64_t k = 0; k < S; ++k) sum += comb[j * S + k];
            for (int64_t k = 0; k < S; ++k) comb[j * S + k] /= sum + eps;
          }
        };
        normalise_columns();
        for (int64_t it = 1; it < p.sinkhorn_iters; ++it) {
          normalise_rows();
          normalise_columns();
        }
        for (int64_t i = 0; i < S * S; ++i) p.out_comb.f32()[t * S * S + i] = static_cast<float>(comb[i]);
        collapse_streams(p.out_input.f32() + t * D, X, pre, D, p.round_bf16);
      }
    });
  }

  // X'[k] = post_k y + sum_j comb[j][k] X[j]: comb is applied transposed (traps.md row 13).
  void hc_post(const HcPostParams& p) override {
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    parallel_for(T, T * S * S * D, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* X = p.streams.f32() + t * S * D;
        const float* y = p.sublayer.f32() + t * D;
        const float* post = p.post.f32() + t * S;
        const float* comb = p.comb.f32() + t * S * S;
        std::vector<float> out(S * D);
        for (int64_t k = 0; k < S; ++k) {
          for (int64_t d = 0; d < D; ++d) {
            double acc = static_cast<double>(post[k]) * y[d];
            for (int64_t j = 0; j < S; ++j) acc += static_cast<double>(comb[j * S + k]) * X[j * D + d];
            out[k * D + d] = static_cast<float>(acc);
          }
        }
        if (p.round_bf16) bf16_round_inplace(out.data(), S * D);
        std::memcpy(X, out.data(), out.size() * sizeof(float));
      }
    });
  }

  void hc_head(const HcHeadParams& p) override {
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    const HcWeights& w = *p.weights;
    const double scale = load_float(w.scale, 0);
    parallel_for(T, T * S * D * S, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* X = p.streams.f32() + t * S * D;
        std::vector<double> m;
        hc_mix(X, S * D, w.fn, S, p.norm_eps, m);
        std::vector<double> pre(S);
        for (int64_t j = 0; j < S; ++j) pre[j] = sigmoid(m[j] * scale + load_float(w.base, j)) + p.hc_eps;
        collapse_streams(p.out.f32() + t * D, X, pre, D, p.round_bf16);
      }
    });
  }

  void rms_norm(const RmsNormParams& p) override {
    const int64_t T = p.in.dim(0);
    const int64_t N = p.in.numel() / T;
    SPARROW_CHECK_EQ(N % p.group, 0);
    const TensorView* weight = p.weight.data ? &p.weight : nullptr;
    parallel_for(T, T * N, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t g = 0; g < N / p.group; ++g) {
          float* dst = p.out.f32() + t * N + g * p.group;
          if (p.out.f32() != p.in.f32()) std::memcpy(dst, p.in.f32() + t * N + g * p.group, p.group * sizeof(float));
          rms_normalise(dst, p.group, weight, p.eps);
          if (p.round_bf16) bf16_round_inplace(dst, p.group);
        }
      }
    });
  }

  void linear(const LinearParams& p) override {
    const WeightMatrix& w = *p.weight;
    const int64_t T = p.in.dim(0), K = w.in, N = w.out;
    SPARROW_CHECK_EQ(p.in.numel(), T * K);
    SPARROW_CHECK_EQ(p.out.numel(), T * N);
    const float* in = p.in.f32();
    std::vector<float> quantised;
    if (p.act_quant_fp8) {
      // Each token's activation in blocks of 128, as the reference's act_quant feeds its GEMMs.
      quantised.assign(in, in + T * K);
      for (int64_t t = 0; t < T; ++t) fp8_pow2_quant_sim(quantised.data() + t * K, K, 128);
      in = quantised.data();
    }
    parallel_for(N, N * T * K, [&](int64_t begin, int64_t end) {
      std::vector<float> row(K);
      for (int64_t n = begin; n < end; ++n) {
        weight_row(w, n, row.data());
        for (int64_t t = 0; t < T; ++t) {
          const float v = static_cast<float>(dot(in + t * K, row.data(), K));
          p.out.f32()[t * N + n] = p.round_bf16 ? bf16_round(v) : v;
        }
      }
    });
  }

  // The reference twin of the CUDA FP8 GEMM: the input quantised as act_quant_fp8 does, the
  // weight dequantised as stored (in fp32, as the GPU holds it), the products of the dequantised
  // values summed in fp64 and rounded once to fp32. The dequantised input is exact in fp32 and each
  // product is exact in fp64, so the only errors are the fp64 sum's (K 2^-53 relative, negligible)
  // and the final rounding.
  void linear_fp8_block(const LinearFp8BlockParams& p) override {
    linear({.out = p.out, .in = p.in, .weight = p.weight, .act_quant_fp8 = true});
  }

  void grouped_linear(const GroupedLinearParams& p) override {
    const WeightMatrix& w = *p.weight;
    const int64_t T = p.in.dim(0), G = p.groups, Kg = w.in, R = w.out / G;
    SPARROW_CHECK_EQ(p.in.numel(), T * G * Kg);
    SPARROW_CHECK_EQ(p.out.numel(), T * G * R);
    parallel_for(G * R, G * R * T * Kg, [&](int64_t begin, int64_t end) {
      std::vector<float> row(Kg);
      for (int64_t n = begin; n < end; ++n) {
        const int64_t g = n / R;
        weight_row(w, n, row.data());
        for (int64_t t = 0; t < T; ++t) {
          const float v = static_cast<float>(dot(p.in.f32() + (t * G + g) * Kg, row.data(), Kg));
          p.out.f32()[t * G * R + n] = p.round_bf16 ? bf16_round(v) : v;
        }
      }
    });
  }

  void rope(const RopeParams& p, const BatchInfo& batch) override {
    const int64_t T = p.x.dim(0), n = p.x.dim(1), width = p.x.dim(2);
    const int64_t rd = p.table->rope_dim();
    parallel_for(T, T * n * width, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < n; ++h) {
          float* rotated = p.x.f32() + (t * n + h) * width + (width - rd);
          rotate(rotated, *p.table, static_cast<double>(batch.positions[t]), p.direction);
          if (p.round_bf16) bf16_round_inplace(rotated, rd);
        }
    });
  }

  void quant_sim(const QuantSimParams& p) override {
    const int64_t rows = p.x.numel() / p.row;
    SPARROW_CHECK_EQ(rows * p.row, p.x.numel());
    SPARROW_CHECK_LE(p.dims, p.row);
    for (int64_t r = 0; r < rows; ++r) apply_sim(p.x.f32() + r * p.row, p.dims, p.kind);
  }

  bool supports_reference_numerics() const override { return true; }
  bool supports_attention_weights_bf16(bool, int64_t, int64_t) const override { return true; }

  // Spec §3.3 "Compressor" and §5.2. Rows are buffered until a window of `ratio` tokens completes;
  // the overlapping (CSA) form pools 2*ratio slots: the previous window's first half and the
  // current window's second half.
  void compressor(const CompressorParams& p) override {
    const BatchInfo& batch = *p.batch;
    const int64_t width = p.overlap ? 2 * p.dim : p.dim;
    const int64_t m = p.ratio;
    SPARROW_CHECK_EQ(p.kv.numel(), batch.num_tokens() * width);
    const int64_t nseq = static_cast<int64_t>(batch.seqs.size());
    parallel_for(nseq, batch.num_tokens() * width * 8, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        auto& state = static_cast<CpuSequenceState*>(batch.seqs[s])->layer(p.layer);
        CompressorBuffer& buf = p.slot == CompressorSlot::kMain ? state.main : state.indexer;
        for (int64_t t = batch.seq_begin[s]; t < batch.seq_end[s]; ++t) {
          const int64_t pos = batch.positions[t];
          SPARROW_CHECK_EQ(pos, buf.count * m + buf.pending);
          const float* kv = p.kv.f32() + t * width;
          const float* gate = p.gate.f32() + t * width;
          float* dst_kv = buf.pending_kv.data() + buf.pending * width;
          float* dst_gate = buf.pending_gate.data() + buf.pending * width;
          for (int64_t c = 0; c < width; ++c) {
            dst_kv[c] = kv[c];
            dst_gate[c] = gate[c] + load_float(p.ape, (pos % m) * width + c);
          }
          if (++buf.pending == m) emit_entry(p, buf);
        }
      }
    });
  }

  void indexer_topk(const IndexerTopkParams& p) override {
    const BatchInfo& batch = *p.batch;
    const int64_t T = batch.num_tokens(), Hi = p.q.dim(1), di = p.q.dim(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(di)) / std::sqrt(static_cast<double>(Hi));
    parallel_for(T, T * Hi * di * 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const auto& keys = static_cast<CpuSequenceState*>(batch.seqs[batch.seq_of_token[t]])->layer(p.layer).indexer;
        const int64_t visible = (batch.positions[t] + 1) / p.ratio;
        SPARROW_CHECK_LE(visible, keys.count);
        std::vector<std::pair<double, int32_t>> scored(visible);
        for (int64_t w = 0; w < visible; ++w) {
          double score = 0.0;
          for (int64_t h = 0; h < Hi; ++h) {
            const double d = dot(p.q.f32() + (t * Hi + h) * di, keys.entries.data() + w * di, di);
            const double weight = p.head_weights.f32()[t * Hi + h];
            if (p.bf16_scores) {
              // The reference folds both scales into bf16 head weights and keeps every product bf16.
              const float wh = bf16_round(static_cast<float>(weight * scale));
              score += bf16_round(std::max(bf16_round(static_cast<float>(d)), 0.0f) * wh);
            } else {
              score += weight * std::max(d, 0.0);
            }
          }
          scored[w] = {p.bf16_scores ? bf16_round(static_cast<float>(score)) : score * scale, static_cast<int32_t>(w)};
        }
        if (!p.out_scores.empty()) {
          const int64_t C = p.out_scores.dim(1);
          float* row = p.out_scores.f32() + t * C;
          for (int64_t w = 0; w < C; ++w) row[w] = w < visible ? static_cast<float>(scored[w].first) : kNegInf;
        }
        // Higher score first; among equal scores the lower entry index (a documented tie-break:
        // torch.topk leaves tie order unspecified, traps.md row 17).
        const int64_t keep = std::min<int64_t>(p.k, visible);
        std::partial_sort(scored.begin(), scored.begin() + keep, scored.end(), [](const auto& a, const auto& b) {
          return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        int32_t* out = p.out_indices.i32() + t * p.k;
        for (int64_t i = 0; i < p.k; ++i) out[i] = i < keep ? scored[i].second : -1;
      }
    });
  }

  void attention(const AttentionParams& p) override {
    attention_q_prep(p);
    const BatchInfo& batch = *p.batch;
    const int64_t T = batch.num_tokens(), H = p.q.dim(1), Dh = p.q.dim(2);
    parallel_for(T, T * H * Dh * 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t s = batch.seq_of_token[t];
        const auto& state = static_cast<CpuSequenceState*>(batch.seqs[s])->layer(p.layer);
        const int64_t pos = batch.positions[t];
        const int64_t first_in_batch = batch.positions[batch.seq_begin[s]];
        // Candidate keys: the window [pos-W+1, pos] (older ones from the ring, the rest from this
        // batch), then compressed entries.
        std::vector<const float*> keys;
        for (int64_t q = std::max<int64_t>(0, pos - p.window + 1); q <= pos; ++q) {
          if (q >= first_in_batch) {
            keys.push_back(p.kv.f32() + (batch.seq_begin[s] + (q - first_in_batch)) * Dh);
          } else {
            keys.push_back(state.ring.data() + (q % p.window) * Dh);
          }
        }
        if (p.kind == AttentionKind::kHca) {
          const int64_t visible = (pos + 1) / p.ratio;
          SPARROW_CHECK_LE(visible, state.main.count);
          for (int64_t w = 0; w < visible; ++w) keys.push_back(state.main.entries.data() + w * Dh);
        } else if (p.kind == AttentionKind::kCsa) {
          const int64_t k = p.selected.dim(1);
          // (A masked slot, -1, attends to nothing, but with bf16 weights it keeps its place in the
          // chunks, as in DeepSeek's kernel and the CUDA ones: a null key.)
          for (int64_t i = 0; i < k; ++i) {
            const int32_t w = p.selected.i32()[t * k + i];
            if (w < 0) {
              if (p.weights_bf16) keys.push_back(nullptr);
              continue;
            }
            SPARROW_CHECK_LT(w, state.main.count);
            keys.push_back(state.main.entries.data() + static_cast<int64_t>(w) * Dh);
          }
        }
        std::vector<double> logits(keys.size());
        std::vector<double> acc(Dh);
        for (int64_t h = 0; h < H; ++h) {
          const float* q = p.q.f32() + (t * H + h) * Dh;
          // The sink joins the max and the denominator but carries no value (spec §3.3).
          const double sink = load_float(p.sinks, h);
          if (p.weights_bf16) {
            attention_head_bf16_weights(q, keys, Dh, p.scale, sink, acc, p.out.f32() + (t * H + h) * Dh, p.round_bf16);
            continue;
          }
          double mx = sink;
          for (size_t j = 0; j < keys.size(); ++j) {
            logits[j] = dot(q, keys[j], Dh) * p.scale;
            mx = std::max(mx, logits[j]);
          }
          double denom = std::exp(sink - mx);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (size_t j = 0; j < keys.size(); ++j) {
            const double e = std::exp(logits[j] - mx);
            denom += e;
            for (int64_t d = 0; d < Dh; ++d) acc[d] += e * keys[j][d];
          }
          float* o = p.out.f32() + (t * H + h) * Dh;
          for (int64_t d = 0; d < Dh; ++d) o[d] = static_cast<float>(acc[d] / denom);
          if (p.round_bf16) bf16_round_inplace(o, Dh);
        }
      }
    });
    attention_o_finish(p);
  }

  // AttentionParams::weights_bf16 for one head: flash-attention's order with bf16 weights. Chunks of
  // kChunk candidates in order (a null key, a masked CSA slot, keeps its place with weight 0); per chunk the running max m (the logits in fp32, as the GPU kernels
  // keep them), the accumulators and the denominator rescaled by exp(m_old - m), each weight
  // p = exp(logit - m) rounded to bf16 where it weights its key and unrounded in the denominator;
  // then the sink: M = max(sink, m), out = exp(m - M) acc / (exp(sink - M) + exp(m - M) l).
  static void attention_head_bf16_weights(const float* q, const std::vector<const float*>& keys, int64_t Dh,
                                          double scale, double sink, std::vector<double>& acc, float* o,
                                          bool round_bf16) {
    constexpr size_t kChunk = 32;
    double m = -std::numeric_limits<double>::infinity(), l = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    std::array<float, kChunk> s;
    for (size_t c0 = 0; c0 < keys.size(); c0 += kChunk) {
      const size_t n = std::min(kChunk, keys.size() - c0);
      double mx = m;
      for (size_t j = 0; j < n; ++j) {
        s[j] = keys[c0 + j] ? static_cast<float>(dot(q, keys[c0 + j], Dh) * scale) : -std::numeric_limits<float>::infinity();
        mx = std::max(mx, static_cast<double>(s[j]));
      }
      const double alpha = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(m - mx);
      for (double& a : acc) a *= alpha;
      l *= alpha;
      m = mx;
      for (size_t j = 0; j < n; ++j) {
        if (keys[c0 + j] == nullptr) continue;  // (a masked slot: weight 0)
        const float e = static_cast<float>(std::exp(static_cast<double>(s[j]) - m));
        l += e;
        const double w = bf16_round(e);
        for (int64_t d = 0; d < Dh; ++d) acc[d] += w * keys[c0 + j][d];
      }
    }
    const double M = std::max(sink, m);
    const double ws = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(m - M);
    const double denom = std::exp(sink - M) + ws * l;
    for (int64_t d = 0; d < Dh; ++d) o[d] = static_cast<float>(ws * acc[d] / denom);
    if (round_bf16) bf16_round_inplace(o, Dh);
  }

  void window_append(const WindowAppendParams& p) override {
    const BatchInfo& batch = *p.batch;
    const int64_t Dh = p.kv.dim(1);
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      auto& state = static_cast<CpuSequenceState*>(batch.seqs[batch.seq_of_token[t]])->layer(p.layer);
      const int64_t W = static_cast<int64_t>(state.ring.size()) / Dh;
      std::memcpy(state.ring.data() + (batch.positions[t] % W) * Dh, p.kv.f32() + t * Dh, Dh * sizeof(float));
    }
  }

  // Spec §3.4: sqrtsoftplus scores; bias only for choosing; weights from unbiased scores,
  // renormalised, and routed_scaling_factor applied here only for kInRouterWeights.
  void router(const RouterParams& p) override {
    const BatchInfo& batch = *p.batch;
    const WeightMatrix& gate = *p.gate;
    const int64_t T = p.x.dim(0), D = gate.in, E = gate.out, K = p.k;
    std::vector<double> logits(T * E);
    parallel_for(E, E * T * D, [&](int64_t begin, int64_t end) {
      std::vector<float> row(D);
      for (int64_t e = begin; e < end; ++e) {
        weight_row(gate, e, row.data());
        for (int64_t t = 0; t < T; ++t) logits[t * E + e] = dot(p.x.f32() + t * D, row.data(), D);
      }
    });
    const double scale = p.placement == RoutedScalePlacement::kInRouterWeights ? p.routed_scale : 1.0;
    parallel_for(T, T * E * 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        std::vector<double> log_score(E);
        for (int64_t e = 0; e < E; ++e) log_score[e] = log_sqrt_softplus(logits[t * E + e]);
        std::vector<int32_t> chosen(K);
        if (!p.forced_experts.empty()) {
          for (int64_t i = 0; i < K; ++i) {
            chosen[i] = p.forced_experts.i32()[t * K + i];
            SPARROW_CHECK(chosen[i] >= 0 && chosen[i] < E);
          }
        } else if (p.kind == MoeKind::kHash) {
          const int64_t id = token_at(batch, t);
          for (int64_t i = 0; i < K; ++i) chosen[i] = static_cast<int32_t>(load_index(p.tid2eid, id * K + i));
        } else {
          std::vector<std::pair<double, int32_t>> biased(E);
          for (int64_t e = 0; e < E; ++e)
            biased[e] = {std::exp(log_score[e]) + load_float(p.bias, e), static_cast<int32_t>(e)};
          std::partial_sort(biased.begin(), biased.begin() + K, biased.end(), [](const auto& a, const auto& b) {
            return a.first != b.first ? a.first > b.first : a.second < b.second;
          });
          for (int64_t i = 0; i < K; ++i) chosen[i] = biased[i].second;
        }
        // g_i = s_i / sum s, evaluated as exp(log s_i - max) / sum exp(. - max).
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < K; ++i) mx = std::max(mx, log_score[chosen[i]]);
        double sum = 0.0;
        for (int64_t i = 0; i < K; ++i) sum += std::exp(log_score[chosen[i]] - mx);
        for (int64_t i = 0; i < K; ++i) {
          p.out_experts.i32()[t * K + i] = chosen[i];
          p.out_weights.f32()[t * K + i] = static_cast<float>(std::exp(log_score[chosen[i]] - mx) / sum * scale);
        }
      }
    });
  }

  // Routed experts grouped by expert (each expert's rows are decoded once per batch), then the
  // shared expert; SwiGLU with the swiglu_limit clamp on both (traps.md row 7).
  void moe(const MoeParams& p) override {
    const int64_t T = p.x.dim(0), D = p.x.dim(1), K = p.experts.dim(1);
    const auto& routed = *p.routed;
    const int64_t E = static_cast<int64_t>(routed.size());
    const double combine_scale = p.placement == RoutedScalePlacement::kInExpertCombine ? p.routed_scale : 1.0;
    // Group (token, slot) pairs by expert, in token order.
    std::vector<std::vector<std::pair<int64_t, int64_t>>> by_expert(E);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < K; ++i) {
        const int32_t e = p.experts.i32()[t * K + i];
        SPARROW_CHECK(e >= 0 && e < E);
        by_expert[e].push_back({t, i});
      }
    // contrib[(t*K + i)*D + d]: expert output for token t's slot i, summed in slot order below so
    // the result does not depend on which other tokens are in the batch.
    std::vector<float> contrib(T * K * D, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      if (by_expert[e].empty()) continue;
      std::vector<std::vector<float>> xs;
      std::vector<double> gs;
      for (auto [t, i] : by_expert[e]) {
        xs.emplace_back(p.x.f32() + t * D, p.x.f32() + (t + 1) * D);
        gs.push_back(static_cast<double>(p.weights.f32()[t * K + i]) * combine_scale);
      }
      std::vector<std::vector<float>> ys;
      // The reference multiplies the routing weight in before w2; the fp32 profile after it.
      swiglu_ffn(routed[e], xs, p.swiglu_limit, p.ref_numerics ? &gs : nullptr, ys);
      for (size_t r = 0; r < xs.size(); ++r) {
        auto [t, i] = by_expert[e][r];
        const double g = p.ref_numerics ? 1.0 : gs[r];
        for (int64_t d = 0; d < D; ++d) contrib[(t * K + i) * D + d] = static_cast<float>(g * ys[r][d]);
      }
    }
    std::vector<std::vector<float>> shared_out;
    if (p.shared) {
      std::vector<std::vector<float>> xs;
      for (int64_t t = 0; t < T; ++t) xs.emplace_back(p.x.f32() + t * D, p.x.f32() + (t + 1) * D);
      const std::vector<double> ones(xs.size(), 1.0);
      swiglu_ffn(*p.shared, xs, p.swiglu_limit, p.ref_numerics ? &ones : nullptr, shared_out);
    }
    parallel_for(T, T * K * D, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t i = 0; i < K; ++i) acc += contrib[(t * K + i) * D + d];
          if (p.shared) acc += shared_out[t][d];
          p.out.f32()[t * D + d] = p.ref_numerics ? bf16_round(static_cast<float>(acc)) : static_cast<float>(acc);
        }
      }
    });
  }

 private:
  static int64_t load_index(const TensorView& t, int64_t i) {
    if (t.dtype == DType::kI64) {
      int64_t v;
      std::memcpy(&v, static_cast<const uint8_t*>(t.data) + 8 * i, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
    return v;
  }

  // ys[r] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for each row x of xs. With `ref_weights`
  // (deepseek-ref, spec §3.4) the inputs of w1/w3 and of w2 are FP8-quantised in blocks of 128 and
  // w2 reads bf16(g_r * h): the routing weight enters before w2.
  static void swiglu_ffn(const ExpertWeights& w, std::vector<std::vector<float>> xs, double limit,
                         const std::vector<double>* ref_weights, std::vector<std::vector<float>>& ys) {
    const int64_t R = static_cast<int64_t>(xs.size());
    const int64_t F = w.w1.out, D = w.w1.in;
    if (ref_weights)
      for (auto& x : xs) fp8_pow2_quant_sim(x.data(), D, 128);
    std::vector<float> h(R * F);
    parallel_for(F, F * R * D, [&](int64_t begin, int64_t end) {
      std::vector<float> r1(D), r3(D);
      for (int64_t f = begin; f < end; ++f) {
        weight_row(w.w1, f, r1.data());
        weight_row(w.w3, f, r3.data());
        for (int64_t r = 0; r < R; ++r) {
          double a = dot(xs[r].data(), r1.data(), D);
          double b = dot(xs[r].data(), r3.data(), D);
          if (limit > 0) {
            a = std::min(a, limit);
            b = std::clamp(b, -limit, limit);
          }
          h[r * F + f] = static_cast<float>(a / (1.0 + std::exp(-a)) * b);
        }
      }
    });
    if (ref_weights) {
      for (int64_t r = 0; r < R; ++r) {
        float* hr = h.data() + r * F;
        for (int64_t f = 0; f < F; ++f) hr[f] = bf16_round(static_cast<float>((*ref_weights)[r] * hr[f]));
        fp8_pow2_quant_sim(hr, F, 128);
      }
    }
    const int64_t Dout = w.w2.out;
    ys.assign(R, std::vector<float>(Dout));
    parallel_for(Dout, Dout * R * F, [&](int64_t begin, int64_t end) {
      std::vector<float> r2(F);
      for (int64_t d = begin; d < end; ++d) {
        weight_row(w.w2, d, r2.data());
        for (int64_t r = 0; r < R; ++r) ys[r][d] = static_cast<float>(dot(h.data() + r * F, r2.data(), F));
      }
    });
  }

  // Pools the completed window in `buf`, normalises, rotates at w*ratio and appends (spec §5.2).
  static void emit_entry(const CompressorParams& p, CompressorBuffer& buf) {
    const int64_t m = p.ratio, dim = p.dim;
    const int64_t width = p.overlap ? 2 * dim : dim;
    std::vector<float> entry(dim);
    // Slots: (kv row pointer, gate row pointer); the overlapping form puts the previous window's
    // first halves first (absent for window 0: weight 0), then this window's second halves.
    std::vector<std::pair<const float*, const float*>> slots;
    if (p.overlap) {
      if (buf.has_prev)
        for (int64_t j = 0; j < m; ++j) slots.push_back({buf.prev_kv.data() + j * dim, buf.prev_gate.data() + j * dim});
      for (int64_t j = 0; j < m; ++j)
        slots.push_back({buf.pending_kv.data() + j * width + dim, buf.pending_gate.data() + j * width + dim});
    } else {
      for (int64_t j = 0; j < m; ++j) slots.push_back({buf.pending_kv.data() + j * width, buf.pending_gate.data() + j * width});
    }
    for (int64_t c = 0; c < dim; ++c) {
      double mx = -std::numeric_limits<double>::infinity();
      for (const auto& s : slots) mx = std::max(mx, static_cast<double>(s.second[c]));
      double num = 0.0, den = 0.0;
      for (const auto& s : slots) {
        const double e = std::exp(s.second[c] - mx);
        den += e;
        num += e * s.first[c];
      }
      entry[c] = static_cast<float>(num / den);
    }
    if (p.round_bf16) bf16_round_inplace(entry.data(), dim);
    rms_normalise(entry.data(), dim, &p.norm_weight, p.norm_eps);
    if (p.round_bf16) bf16_round_inplace(entry.data(), dim);
    const int64_t w = buf.count;
    rotate(entry.data() + dim - p.rope->rope_dim(), *p.rope, static_cast<double>(w * m), RopeDirection::kForward);
    if (p.round_bf16) bf16_round_inplace(entry.data(), dim);
    for (QuantSimKind kind : p.entry_sim)
      apply_sim(entry.data(), kind == QuantSimKind::kFp8Pow2Block64 ? dim - p.rope->rope_dim() : dim, kind);
    simulate_key_precision(entry.data(), dim, p.key_precision);
    buf.entries.insert(buf.entries.end(), entry.begin(), entry.end());
    ++buf.count;
    if (p.overlap) {
      // This window's first halves pool into the next entry.
      for (int64_t j = 0; j < m; ++j) {
        std::memcpy(buf.prev_kv.data() + j * dim, buf.pending_kv.data() + j * width, dim * sizeof(float));
        std::memcpy(buf.prev_gate.data() + j * dim, buf.pending_gate.data() + j * width, dim * sizeof(float));
      }
      buf.has_prev = true;
    }
    buf.pending = 0;
  }
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

}  // namespace sparrow
