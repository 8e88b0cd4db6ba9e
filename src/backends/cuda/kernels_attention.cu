// The compressors, the Lightning Indexer (scores + top-k) and sparse attention with the sink
// (spec §3.3, §5.2). They mirror src/backends/cpu/cpu_backend.cpp; the per-sequence buffers they
// read and write are described in cuda_state.h.
#include "backends/cuda/device_common.cuh"

namespace sparrow::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kAttnThreads = 128;
constexpr int kKeySimThreads = 128;  // one block per key row; di = 128 in DeepSeek-V4

// grid (nseq): one block walks its sequence's tokens in order, exactly as the CPU reference does:
// buffer each row (gate + positional bias), and whenever `ratio` rows are pending, pool the window
// per channel, RMS-normalise, rotate at w*ratio, append, and (CSA) keep the window's first halves
// for the next entry. Channels are spread over the threads; barriers separate the phases.
__global__ void compressor_kernel(CompressorArgs a) {
  const CompressorSeqArgs s = a.seqs[blockIdx.x];
  const int64_t m = a.ratio, dim = a.dim, width = a.overlap ? 2 * dim : dim;
  const int rope_pairs = a.rope.pairs;
  int64_t pending = s.pending, count = s.count;
  bool has_prev = s.has_prev != 0;
  for (int64_t t = s.t_begin; t < s.t_end; ++t) {
    const int64_t pos = a.positions[t];
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      s.pending_kv[pending * width + c] = a.kv[t * width + c];
      s.pending_gate[pending * width + c] = a.gate[t * width + c] + dev_load(a.ape, (pos % m) * width + c);
    }
    if (++pending < m) continue;
    __syncthreads();  // the window's rows are complete
    float* entry = s.entries + count * dim;
    // Slots: the previous window's first halves (CSA, absent for window 0), then this window's
    // second halves (CSA) or whole rows (HCA). Softmax over slots per channel.
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const int64_t cur = a.overlap ? dim + c : c;
      float mx = -INFINITY;
      if (a.overlap && has_prev)
        for (int64_t j = 0; j < m; ++j) mx = fmaxf(mx, s.prev_gate[j * dim + c]);
      for (int64_t j = 0; j < m; ++j) mx = fmaxf(mx, s.pending_gate[j * width + cur]);
      float num = 0.0f, den = 0.0f;
      if (a.overlap && has_prev) {
        for (int64_t j = 0; j < m; ++j) {
          const float e = expf(s.prev_gate[j * dim + c] - mx);
          den += e;
          num += e * s.prev_kv[j * dim + c];
        }
      }
      for (int64_t j = 0; j < m; ++j) {
        const float e = expf(s.pending_gate[j * width + cur] - mx);
        den += e;
        num += e * s.pending_kv[j * width + cur];
      }
      // round_bf16 (fast/deepseek-ref): the pooled value is stored and normalised as bf16.
      const float v = a.round_bf16 ? dev_bf16_round(num / den) : num / den;
      entry[c] = v;
      ss += v * v;
    }
    ss = block_sum(ss);  // its barrier also orders the entry writes before the reads below
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + a.norm_eps);
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const float y = entry[c] * inv * dev_load(a.norm_weight, c);
      entry[c] = a.round_bf16 ? dev_bf16_round(y) : y;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rope_pairs; i += blockDim.x) {
      float* rp = entry + dim - 2 * rope_pairs;
      rope_rotate_pair(rp, i, static_cast<double>(count * m), a.rope, false);
      // The CPU rounds the whole entry after the rotation; the nope dims are bf16 already (above),
      // so rounding the pair this thread just wrote is the same.
      if (a.round_bf16) {
        rp[2 * i] = dev_bf16_round(rp[2 * i]);
        rp[2 * i + 1] = dev_bf16_round(rp[2 * i + 1]);
      }
    }
    if (a.overlap) {
      for (int64_t i = threadIdx.x; i < m * dim; i += blockDim.x) {
        const int64_t j = i / dim, c = i % dim;
        s.prev_kv[i] = s.pending_kv[j * width + c];
        s.prev_gate[i] = s.pending_gate[j * width + c];
      }
      has_prev = true;
    }
    ++count;
    pending = 0;
    __syncthreads();  // the pending rows are free again
  }
}

// grid (n): one block rounds one row in place exactly as core/quant_sim.cpp simulate_key_precision
// does (spec §5.1 for the fp8 layout, §3.0.7 for fp4); only the indexer keys are rounded, q is not.
//   bf16: every value to nearest even.
//   fp8:  amax = max |x| over the whole row (0: the row is left as is), s = amax / 448 in fp32 (an
//         fp32 scale, not a power of two: the 132-byte layout), x <- e4m3(x / s) * s, saturating.
//   fp4:  blocks of 32 (the last may be partial), amax floored at 6 * 2^-126,
//         s = 2^ceil(log2(amax / 6)), x <- e2m1(clamp(x / s, -6, 6)) * s.
// Every thread reads and writes only its own channels (or its own fp4 blocks), so the one barrier
// needed is block_max's.
__global__ void key_sim_kernel(KeySimArgs a) {
  float* row = a.rows[blockIdx.x];
  const int64_t dim = a.dim;
  switch (a.precision) {
    case KeyPrecision::kF32:
      return;
    case KeyPrecision::kBf16:
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) row[c] = dev_bf16_round(row[c]);
      return;
    case KeyPrecision::kFp8: {
      // fmaxf skips NaN like the host's std::max(amax, |x|) with amax first; max is order-free.
      float amax = 0.0f;
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) amax = fmaxf(amax, fabsf(row[c]));
      amax = block_max(amax);  // uniform branch: every thread of the block calls it
      if (amax == 0.0f) return;
      const float s = amax / 448.0f;
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) row[c] = dev_e4m3(dev_f32_to_e4m3(row[c] / s)) * s;
      return;
    }
    case KeyPrecision::kFp4: {
      constexpr int64_t kBlock = 32;
      for (int64_t b = threadIdx.x * kBlock; b < dim; b += static_cast<int64_t>(blockDim.x) * kBlock) {
        const int64_t e = b + kBlock < dim ? b + kBlock : dim;
        float amax = 6.0f * 0x1p-126f;  // the reference's floor: an all-zero block gets a finite scale
        for (int64_t i = b; i < e; ++i) amax = fmaxf(amax, fabsf(row[i]));
        // 2^k as the e8m0 byte k + 127 decodes it (k in [-127, 127]; 2^-127 is an fp32 subnormal).
        const float s = dev_e8m0(static_cast<uint8_t>(dev_pow2_scale_exponent(amax, 6.0f) + 127));
        for (int64_t i = b; i < e; ++i) {
          float v = row[i] / s;
          v = v < -6.0f ? -6.0f : (6.0f < v ? 6.0f : v);  // std::clamp's order: NaN passes through
          row[i] = dev_e2m1(dev_f32_to_e2m1(v)) * s;
        }
      }
      return;
    }
  }
}

// grid (T, ceil(C / kThreads)): score of entry w for token t, -inf where not visible.
__global__ void indexer_score_kernel(IndexerArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t w = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (w >= a.C) return;
  if (w >= a.visible[t]) {
    a.scores[t * a.C + w] = -INFINITY;
    return;
  }
  const float* key = a.keys[t] + w * a.di;
  if (a.bf16_scores) {
    // deepseek-ref, as the CPU: wh = bf16(weight * scale), term = bf16(max(bf16(d), 0) * wh),
    // terms summed in fp64 in head order, the sum rounded to bf16. d is the fp32 dot product.
    double acc = 0.0;
    for (int64_t h = 0; h < a.Hi; ++h) {
      const float* q = a.q + (t * a.Hi + h) * a.di;
      float d = 0.0f;
      for (int64_t i = 0; i < a.di; ++i) d += q[i] * key[i];
      const float wh = dev_bf16_round(__double2float_rn(static_cast<double>(a.head_weights[t * a.Hi + h]) * a.scale_f64));
      const float db = dev_bf16_round(d);
      const float relu = db < 0.0f ? 0.0f : db;  // std::max(db, 0.0f)
      acc += static_cast<double>(dev_bf16_round(relu * wh));
    }
    a.scores[t * a.C + w] = dev_bf16_round(__double2float_rn(acc));
    return;
  }
  float score = 0.0f;
  for (int64_t h = 0; h < a.Hi; ++h) {
    const float* q = a.q + (t * a.Hi + h) * a.di;
    float d = 0.0f;
    for (int64_t i = 0; i < a.di; ++i) d += q[i] * key[i];
    score += a.head_weights[t * a.Hi + h] * fmaxf(d, 0.0f);
  }
  a.scores[t * a.C + w] = score * a.scale;
}

// grid (T, ceil(C / kThreads)): the rank of visible entry w among its token's visible entries
// (higher score first, then the lower index) is its output slot when below k. Ranks are a
// permutation, so each kept slot is written exactly once; the rest keep their -1.
__global__ void indexer_select_kernel(IndexerArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t w = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t visible = a.visible[t];
  if (w >= visible) return;
  const float* s = a.scores + t * a.C;
  const float mine = s[w];
  int64_t rank = 0;
  for (int64_t v = 0; v < visible && rank < a.k; ++v) rank += (s[v] > mine || (s[v] == mine && v < w)) ? 1 : 0;
  if (rank < a.k) a.out_indices[t * a.k + rank] = static_cast<int32_t>(w);
}

// Candidate j of a token: window positions first (older ones from the ring, this batch's from
// batch_kv), then compressed entries (HCA: all visible; CSA: the selection, null for -1).
__device__ inline const float* candidate(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j) {
  if (j < tk.n_window) {
    const int64_t q = tk.pos - tk.n_window + 1 + j;
    return q >= tk.first_pos ? tk.batch_kv + (q - tk.first_pos) * a.Dh : tk.ring + (q % a.window) * a.Dh;
  }
  const int64_t i = j - tk.n_window;
  if (!a.csa) return tk.entries + i * a.Dh;
  const int32_t w = a.selected[t * a.k + i];
  if (w < 0) return nullptr;
  if (w >= tk.n_entries) __trap();  // a selection past the stored entries is a bug upstream
  return tk.entries + static_cast<int64_t>(w) * a.Dh;
}

// grid (T * H): softmax with the sink over the token's candidates, K = V. The sink joins the max
// and the denominator but carries no value (spec §3.3).
__global__ void attention_kernel(AttentionArgs a) {
  const int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const AttnTokenArgs tk = a.tokens[t];
  const int64_t n = tk.n_window + tk.n_compressed;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  float* e = a.scratch + blockIdx.x * a.max_candidates;
  const float sink = dev_load(a.sinks, h);
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float* key = candidate(a, tk, t, j);
    float logit = -INFINITY;
    if (key) {
      float d = 0.0f;
      for (int64_t i = 0; i < a.Dh; ++i) d += q[i] * key[i];
      logit = d * a.scale;
    }
    e[j] = logit;
    mx = fmaxf(mx, logit);
  }
  mx = fmaxf(block_max(mx), sink);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = e[j] == -INFINITY ? 0.0f : expf(e[j] - mx);
    e[j] = v;
    sum += v;
  }
  const float denom = block_sum(sum) + expf(sink - mx);  // block_sum's barrier publishes e[]
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float* key = candidate(a, tk, t, j);
      if (key) acc += e[j] * key[d];
    }
    a.out[(t * a.H + h) * a.Dh + d] = acc / denom;
  }
}

}  // namespace

void launch_compressor(const CompressorArgs& a) {
  if (a.nseq > 0) compressor_kernel<<<static_cast<unsigned>(a.nseq), kThreads>>>(a);
}

void launch_key_sim(const KeySimArgs& a) {
  if (a.n > 0 && a.dim > 0 && a.precision != KeyPrecision::kF32)
    key_sim_kernel<<<static_cast<unsigned>(a.n), kKeySimThreads>>>(a);
}

void launch_indexer_topk(const IndexerArgs& a) {
  if (a.T == 0 || a.C == 0) return;
  const dim3 grid(static_cast<unsigned>(a.T), blocks_for(a.C, kThreads));
  indexer_score_kernel<<<grid, kThreads>>>(a);
  if (a.k > 0) indexer_select_kernel<<<grid, kThreads>>>(a);
}

void launch_attention(const AttentionArgs& a) {
  if (a.T * a.H > 0) attention_kernel<<<static_cast<unsigned>(a.T * a.H), kAttnThreads>>>(a);
}

}  // namespace sparrow::cuda
