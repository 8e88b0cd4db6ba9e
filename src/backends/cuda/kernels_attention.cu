// The compressors, the Lightning Indexer (scores + top-k) and sparse attention with the sink
// (spec §3.3, §5.2). They mirror src/backends/cpu/cpu_backend.cpp; the per-sequence buffers they
// read and write are described in cuda_state.h.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backends/cuda/attn_layout.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/wgmma.cuh"
#include "core/check.h"

namespace sparrow::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kAttnThreads = 128;
constexpr int kKeySimThreads = 128;  // one block per key row; di = 128 in DeepSeek-V4

// One channel of an entry: the softmax over slots of the gates, weighting the kv values: the
// previous window's first halves (when `has_prev`), then this window's rows, each slot's exp added to
// the denominator and its weighted value to the numerator in that order. The accessors give slot j's
// gate (with the positional bias) and kv. round_bf16 (fast/deepseek-ref): stored and normalised as bf16.
template <class PrevGate, class PrevKv, class CurGate, class CurKv>
__device__ inline float pool_channel(const CompressorArgs& a, bool has_prev, PrevGate prev_gate, PrevKv prev_kv,
                                     CurGate cur_gate, CurKv cur_kv) {
  const int64_t m = a.ratio;
  float mx = -INFINITY;
  if (has_prev)
    for (int64_t j = 0; j < m; ++j) mx = fmaxf(mx, prev_gate(j));
  for (int64_t j = 0; j < m; ++j) mx = fmaxf(mx, cur_gate(j));
  float num = 0.0f, den = 0.0f;
  if (has_prev) {
    for (int64_t j = 0; j < m; ++j) {
      const float e = expf(prev_gate(j) - mx);
      den += e;
      num += e * prev_kv(j);
    }
  }
  for (int64_t j = 0; j < m; ++j) {
    const float e = expf(cur_gate(j) - mx);
    den += e;
    num += e * cur_kv(j);
  }
  return a.round_bf16 ? dev_bf16_round(num / den) : num / den;
}

// The rest of an entry once its channels are pooled into `entry` (every thread passing the sum of
// its channels' squares): RMS norm with the weight, then the rotation at position `count * ratio`,
// each rounded to bf16 under round_bf16. Every thread of the block calls it.
__device__ inline void finish_entry(const CompressorArgs& a, float* entry, int64_t count, float ss) {
  const int64_t dim = a.dim;
  const int rope_pairs = a.rope.pairs;
  ss = block_sum(ss);  // its barrier also orders the entry writes before the reads below
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + a.norm_eps);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float y = entry[c] * inv * dev_load(a.norm_weight, c);
    entry[c] = a.round_bf16 ? dev_bf16_round(y) : y;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rope_pairs; i += blockDim.x) {
    float* rp = entry + dim - 2 * rope_pairs;
    rope_rotate_pair(rp, i, static_cast<double>(count * a.ratio), a.rope, false);
    // The CPU rounds the whole entry after the rotation; the nope dims are bf16 already (above),
    // so rounding the pair this thread just wrote is the same.
    if (a.round_bf16) {
      rp[2 * i] = dev_bf16_round(rp[2 * i]);
      rp[2 * i + 1] = dev_bf16_round(rp[2 * i + 1]);
    }
  }
}

// grid (nseq): one block walks its sequence's tokens in order, exactly as the CPU reference does:
// buffer each row (gate + positional bias), and whenever `ratio` rows are pending, pool the window
// per channel, RMS-normalise, rotate at w*ratio, append, and (CSA) keep the window's first halves
// for the next entry. Channels are spread over the threads; barriers separate the phases.
__global__ void compressor_kernel(CompressorArgs a) {
  wait_previous_grid();
  const CompressorSeqArgs s = a.seqs[blockIdx.x];
  const int64_t m = a.ratio, dim = a.dim, width = a.overlap ? 2 * dim : dim;
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
    float* entry = s.entries + (count - s.entries_first) * dim;
    // Slots: the previous window's first halves (CSA, absent for window 0), then this window's
    // second halves (CSA) or whole rows (HCA). Softmax over slots per channel.
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const int64_t cur = a.overlap ? dim + c : c;
      const float v = pool_channel(
          a, a.overlap && has_prev, [&](int64_t j) { return s.prev_gate[j * dim + c]; },
          [&](int64_t j) { return s.prev_kv[j * dim + c]; }, [&](int64_t j) { return s.pending_gate[j * width + cur]; },
          [&](int64_t j) { return s.pending_kv[j * width + cur]; });
      entry[c] = v;
      ss += v * v;
    }
    finish_entry(a, entry, count, ss);
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

// The same entries in parallel (the serial walk above spent 46 ms of an 8K CSA prefill and 16 ms of
// an HCA one in its one block per sequence): grid (n_jobs), one block per emitted entry (jobs[b] =
// {sequence, e}: the e-th entry this batch emits for it), reading its window's rows where they are
// (rows of the pending buffer written by earlier batches, or this batch's kv and gate rows plus the
// positional bias, as the walk would have buffered them) and the previous window's first halves
// (the prev buffer for e = 0, else window e - 1's rows). Every channel's sums, the norm's block_sum
// and the rotation are the walk's, in the same order: the same bits. compressor_state_kernel then
// leaves the pending and prev buffers as the walk would.
__global__ void compressor_entries_kernel(CompressorArgs a) {
  wait_previous_grid();
  const CompressorSeqArgs s = a.seqs[a.jobs[2 * blockIdx.x]];
  const int64_t e = a.jobs[2 * blockIdx.x + 1];
  const int64_t m = a.ratio, dim = a.dim, width = a.overlap ? 2 * dim : dim;
  const int64_t count = s.count + e;
  float* entry = s.entries + (count - s.entries_first) * dim;
  const bool has_prev = a.overlap && (e > 0 || s.has_prev != 0);
  // Row q of this batch's windows (q counts from the first pending row): its kv and its gate with
  // the positional bias, as the walk buffers them.
  auto kv_at = [&](int64_t q, int64_t c) {
    if (q < s.pending) return s.pending_kv[q * width + c];
    return a.kv[(s.t_begin + q - s.pending) * width + c];
  };
  auto gate_at = [&](int64_t q, int64_t c) {
    if (q < s.pending) return s.pending_gate[q * width + c];
    const int64_t t = s.t_begin + q - s.pending;
    return a.gate[t * width + c] + dev_load(a.ape, (a.positions[t] % m) * width + c);
  };
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const int64_t cur = a.overlap ? dim + c : c;
    // The previous window's first halves: the prev buffer (e = 0), else window e - 1's rows.
    const float v = pool_channel(
        a, has_prev, [&](int64_t j) { return e == 0 ? s.prev_gate[j * dim + c] : gate_at((e - 1) * m + j, c); },
        [&](int64_t j) { return e == 0 ? s.prev_kv[j * dim + c] : kv_at((e - 1) * m + j, c); },
        [&](int64_t j) { return gate_at(e * m + j, cur); }, [&](int64_t j) { return kv_at(e * m + j, cur); });
    entry[c] = v;
    ss += v * v;
  }
  finish_entry(a, entry, count, ss);
}

// grid (nseq), after compressor_entries_kernel: the prev buffer (overlap) becomes the first halves
// of the last window emitted (read before the pending rows move), then the rows past the last
// window become the pending rows (with the positional bias in the gate), as after the walk. Only the
// rows this batch adds are written (with nothing emitted the old pending rows stay where they are;
// otherwise every row past the last window is new, as pending < ratio). A thread loads
// kStateUnroll elements (indices clamped into the range, pointers chosen without branches, the bias
// read inline where it is f32, V4's dtype) before it stores any: one element at a time, each one's
// loads (its token's position, then the bias) waited for the stores before them (the batch-1 step's
// CSA states 5.7 and 2.6 us, HCA's 5.2, in the H100 trace of 2026-12-07; HCA's 5.41 -> 4.83 us in
// ncu). The same values. Sizes here are below ratio x width, so indices within the buffers are
// 32-bit.
constexpr int kStateUnroll = 4;

template <bool kApeF32>
__global__ void compressor_state_kernel(CompressorArgs a) {
  wait_previous_grid();
  const CompressorSeqArgs s = a.seqs[blockIdx.x];
  const int32_t m = static_cast<int32_t>(a.ratio), dim = static_cast<int32_t>(a.dim), width = a.overlap ? 2 * dim : dim;
  const int32_t pending = static_cast<int32_t>(s.pending), n = static_cast<int32_t>(s.t_end - s.t_begin);
  const int32_t emitted = (pending + n) / m, step = static_cast<int32_t>(blockDim.x);
  // Elements i0 + u * step (u < kStateUnroll, those below total) of rows q0 + i / cols, channel
  // i % cols, rows counted from the first pending row: kv[u] and gate[u] (with the bias on this
  // batch's rows), all loaded before `store` takes them.
  const auto move = [&](int32_t i0, int32_t total, int32_t q0, int32_t cols, auto store) {
    float kv[kStateUnroll], gate[kStateUnroll], bias[kStateUnroll];
    bool old[kStateUnroll];
    int32_t c[kStateUnroll];
    int64_t position[kStateUnroll], at[kStateUnroll];
#pragma unroll
    for (int u = 0; u < kStateUnroll; ++u) {
      const int32_t i = min(i0 + u * step, total - 1), q = q0 + i / cols;
      c[u] = i % cols;
      old[u] = q < pending;
      // move runs only with a row of this batch to move (n > 0), so s.t_begin is a row: read, not used.
      const int64_t t = old[u] ? s.t_begin : s.t_begin + q - pending;
      const float* kv_row = old[u] ? s.pending_kv + q * width : a.kv + t * width;
      const float* gate_row = old[u] ? s.pending_gate + q * width : a.gate + t * width;
      kv[u] = kv_row[c[u]];
      gate[u] = gate_row[c[u]];
      position[u] = a.positions[t];
    }
    // The remainders after every load above: a 64-bit remainder branches to a call, and the loads
    // after it waited for it.
#pragma unroll
    for (int u = 0; u < kStateUnroll; ++u) at[u] = old[u] ? c[u] : (position[u] % m) * width + c[u];
#pragma unroll
    for (int u = 0; u < kStateUnroll; ++u) {
      if constexpr (kApeF32) bias[u] = static_cast<const float*>(a.ape.data)[at[u]];
      else bias[u] = dev_load_call(a.ape, at[u]);
    }
#pragma unroll
    for (int u = 0; u < kStateUnroll; ++u)
      if (i0 + u * step < total) store(i0 + u * step, kv[u], old[u] ? gate[u] : gate[u] + bias[u]);
  };
  if (a.overlap && emitted > 0) {
    const int32_t total = m * dim;
    for (int32_t i0 = static_cast<int32_t>(threadIdx.x); i0 < total; i0 += kStateUnroll * step)
      move(i0, total, (emitted - 1) * m, dim, [&](int32_t i, float kv, float gate) {
        s.prev_kv[i] = kv;
        s.prev_gate[i] = gate;
      });
  }
  __syncthreads();  // the old pending rows are read
  const int32_t first = emitted == 0 ? pending * width : 0, total = (pending + n - emitted * m) * width;
  for (int32_t i0 = first + static_cast<int32_t>(threadIdx.x); i0 < total; i0 += kStateUnroll * step)
    move(i0, total, emitted * m, width, [&](int32_t i, float kv, float gate) {
      s.pending_kv[i] = kv;
      s.pending_gate[i] = gate;
    });
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
  wait_previous_grid();
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
  wait_previous_grid();
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
  // Explicit FMAs (what nvcc's contraction makes of `d += q * k` anyway), so that
  // indexer_score_smem_kernel can give the same bits.
  float score = 0.0f;
  for (int64_t h = 0; h < a.Hi; ++h) {
    const float* q = a.q + (t * a.Hi + h) * a.di;
    float d = 0.0f;
    for (int64_t i = 0; i < a.di; ++i) d = __fmaf_rn(q[i], key[i], d);
    score = __fmaf_rn(a.head_weights[t * a.Hi + h], fmaxf(d, 0.0f), score);
  }
  a.scores[t * a.C + w] = score * a.scale;
}

// grid (T, ceil(C / kThreads)): the rank of visible entry w among its token's visible entries
// (higher score first, then the lower index) is its output slot when below k. Ranks are a
// permutation, so each kept slot is written exactly once; the rest keep their -1.
__global__ void indexer_select_kernel(IndexerArgs a) {
  wait_previous_grid();
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

// ---- the indexer's fast paths (same results, bit for bit, as the kernels above) ------------------

constexpr int kSelectThreads = 512;
constexpr int kSelectPerLane = 16;  // entries a lane loads at once in indexer_radix_select_kernel's sweeps
constexpr int kSelectCap = 4096;  // the keys that kernel sorts at most (32 KB of shared memory)
constexpr int kScoreEntries = 32;  // entries per block of indexer_score_smem_kernel
constexpr int kScoreWarps = 8;

// A 64-bit key that orders entries as the rank rule does: higher score first, then lower index.
// The score's bits map to an unsigned order (negative floats reversed); the low word is the
// complement of the index. 0 sorts below every real entry (a finite or -inf score maps above 0).
__device__ inline uint64_t rank_key(float score, int64_t w) {
  const uint32_t b = score == 0.0f ? 0u : __float_as_uint(score);  // -0 ties with +0, as on the CPU
  const uint32_t u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(w));
}

// The lanes' inclusive prefix sum within a warp (every lane of the warp calls it).
__device__ inline uint32_t warp_inclusive_scan(uint32_t v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// The score's bits in an unsigned order (rank_key's high word).
__device__ inline uint32_t order_bits(float score) { return static_cast<uint32_t>(rank_key(score, 0) >> 32); }

// Calls f(u, w, valid) for the entries w < E of a token's scores, u = order_bits(score): a warp
// takes kSelectPerLane x 32 entries a round, every load of the round issued before the first use
// (the sweeps are bound by the latency of those loads from L2), as float4s when `sc` is 16-byte
// aligned. Every lane of the warp calls f together, kSelectPerLane times a round (valid false past
// E); the entries come in no particular order.
template <class F>
__device__ inline void select_sweep(const float* sc, uint32_t E, F&& f) {
  constexpr uint32_t kRound = 32 * kSelectPerLane;
  const uint32_t lane = threadIdx.x % 32;
  const bool vec = reinterpret_cast<uintptr_t>(sc) % 16 == 0;
  for (uint32_t base = threadIdx.x / 32 * kRound; base < E; base += kSelectThreads / 32 * kRound) {
    float v[kSelectPerLane];
    if (vec) {  // lane: entries base + 128 q + 4 lane + {0..3}
#pragma unroll
      for (int q = 0; q < kSelectPerLane / 4; ++q) {
        const uint32_t w = base + 128 * q + 4 * lane;
        if (w + 4 <= E) {
          const float4 f4 = *reinterpret_cast<const float4*>(sc + w);
          v[4 * q] = f4.x, v[4 * q + 1] = f4.y, v[4 * q + 2] = f4.z, v[4 * q + 3] = f4.w;
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) v[4 * q + c] = w + c < E ? sc[w + c] : 0.0f;
        }
      }
    } else {  // lane: entries base + 32 j + lane
#pragma unroll
      for (int j = 0; j < kSelectPerLane; ++j) v[j] = base + 32 * j + lane < E ? sc[base + 32 * j + lane] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kSelectPerLane; ++j) {
      const uint32_t w = vec ? base + 128 * (j / 4) + 4 * lane + j % 4 : base + 32 * j + lane;
      f(order_bits(v[j]), w, w < E);
    }
  }
}

// Where a radix select stands: the keys k-th largest and above that are not yet known all lie in
// the bin `prefix` under `mask` (the digits found so far), of which `remaining` are still to take;
// `at_least` keys are >= prefix (the bin's lower bound); `done` when the whole bin is taken (then
// the keys >= prefix are exactly the top k).
struct SelectState {
  uint64_t prefix, mask;
  uint32_t remaining, at_least, done;
};

// Every thread of the block, after a histogram `hist` of the next digit (`bits` bits at `shift`,
// 8 or 12) of the keys in the current bin: moves `st` into the highest bin at which the count from
// the top reaches st.remaining. Thread i sums bins 8 i .. 8 i + 7 from the top; a block scan finds
// the thread whose bins cross. The caller synchronises before anyone reads `st`.
__device__ inline void select_descend(const uint32_t* hist, int shift, int bits, uint32_t k, SelectState& st,
                                      uint32_t* warp_sums) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nbins = 1 << bits;
  const uint32_t rem = st.remaining;
  uint32_t c[8], total = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = 8 * tid < nbins ? hist[nbins - 1 - 8 * tid - i] : 0u;
    total += c[i];
  }
  const uint32_t incl = warp_inclusive_scan(total);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();  // (also: every thread has read st.remaining)
  uint32_t acc = incl - total;
  for (int w = 0; w < warp; ++w) acc += warp_sums[w];
  if (acc < rem && rem <= acc + total) {  // exactly one thread: the crossing is in its bins
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (acc + c[i] >= rem) {
        st.prefix |= static_cast<uint64_t>(nbins - 1 - 8 * tid - i) << shift;
        st.mask |= static_cast<uint64_t>(nbins - 1) << shift;
        st.remaining = rem - acc;
        st.at_least = (k - rem) + acc + c[i];  // above the bin's range, above the bin, in it
        st.done = acc + c[i] == rem ? 1u : 0u;
        break;
      }
      acc += c[i];
    }
  }
}

// Sorts keys[0 .. n) descending (n a power of two <= kSelectCap; every thread of the block calls
// it). Bitonic: the steps of stride 32 and up through shared memory, one barrier each; the steps
// below 32 in registers, a lane's partner by shuffle (lane i ^ stride holds key i ^ stride).
__device__ inline void select_sort_desc(uint64_t* keys, int n) {
  const int tid = threadIdx.x, lane = tid % 32;
  // Key i against its partner i ^ stride within a bitonic merge of `size`: the lower index keeps
  // the larger key where the merge runs descending ((i & size) == 0), the smaller otherwise.
  auto step = [](uint64_t x, int i, int size, int stride) {
    const uint64_t y = __shfl_xor_sync(0xffffffffu, x, stride);
    return ((i & size) == 0) == ((i & stride) == 0) ? (x > y ? x : y) : (x < y ? x : y);
  };
  for (int base = tid / 32 * 32; base < n; base += kSelectThreads) {  // sizes 2 .. 32
    const int i = base + lane;
    uint64_t x = keys[i];  // (past n only while n < 32: keys exist there, and are not written)
    for (int size = 2; size <= 32 && size <= n; size <<= 1)
      for (int stride = size / 2; stride > 0; stride >>= 1) x = step(x, i, size, stride);
    if (i < n) keys[i] = x;
  }
  __syncthreads();
  for (int size = 64; size <= n; size <<= 1) {
    for (int stride = size / 2; stride >= 32; stride >>= 1) {
      for (int i = tid; i < n; i += kSelectThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const uint64_t x = keys[i], y = keys[j];
          if ((i & size) == 0 ? x < y : x > y) {
            keys[i] = y;
            keys[j] = x;
          }
        }
      }
      __syncthreads();
    }
    for (int base = tid / 32 * 32; base < n; base += kSelectThreads) {
      const int i = base + lane;
      uint64_t x = keys[i];
      for (int stride = 16; stride > 0; stride >>= 1) x = step(x, i, size, stride);
      keys[i] = x;
    }
    __syncthreads();
  }
}

// grid (T), block kSelectThreads, dynamic shared memory: kSelectCap keys. The same slots as
// indexer_select_kernel in O(visible) per token, on the 64-bit rank keys (score bits, then the
// complement of the index: unique, so the k-th largest key is the k-th ranked entry). The top k
// are found among candidates in shared memory: every entry at or above a lower bound that at
// least k and at most kSelectCap entries clear, appended by one sweep over the token's scores
// (warp-aggregated slots, any order). The bound is
//   - 0, when the token sees at most kSelectCap entries;
//   - else first a guess: from the 12-bit histogram of a sample of the scores (the first 128 of
//     every 1024), the bin's lower bound that about 1.5 k entries are expected to clear, kept
//     when the collect finds between k and kSelectCap above it;
//   - else the radix passes over the scores in global memory (digits of 12, 8, 8 and 4 bits from
//     the top), until the entries at or above the bin holding the k-th largest fit.
// Radix passes over the candidates' keys (8 bits a pass, into the index bits) then narrow down
// the bin holding the k-th largest key until it is taken whole: the keys at or above it are the
// top k, compacted and sorted (a bitonic sort of next_pow2(k) keys). Only when more than
// kSelectCap entries tie at the k-th largest score do all the global passes run and the
// compaction keep index order (the lowest-index ties are kept): one sweep to count per warp, one
// to write. In the histograms a warp whose counted lanes share one bin adds to it once (per-lane
// atomics on one bin serialise 32 ways); the bin is found by a block scan.
__global__ void indexer_radix_select_kernel(IndexerArgs a, int64_t pow2) {
  wait_previous_grid();
  extern __shared__ uint64_t cand[];  // [kSelectCap]
  constexpr int kWarps = kSelectThreads / 32;
  constexpr int kHeld = kSelectCap / kSelectThreads;  // keys a thread holds in the compaction
  __shared__ uint32_t hist[256];
  __shared__ SelectState st;
  __shared__ uint32_t s_next;
  __shared__ uint32_t s_greater[kWarps], s_equal[kWarps], warp_sums[kWarps];
  static_assert(8 * kSelectThreads >= 4096 && kSelectCap * 2 >= 4096, "the 12-bit pass: its bins, its histogram in cand");
  const int64_t t = blockIdx.x;
  const uint32_t E = static_cast<uint32_t>(a.visible[t]);  // < 2^31: the launch checks C
  const uint32_t k = static_cast<uint32_t>(a.k);
  const float* sc = a.scores + t * a.C;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint32_t take = E < k ? E : k;  // slots this token fills
  for (int i = tid; i < kSelectCap; i += kSelectThreads) cand[i] = 0;
  if (E == 0) {
    for (uint32_t i = tid; i < k; i += kSelectThreads) a.out_indices[t * k + i] = -1;
    return;
  }
  const uint32_t below = (1u << lane) - 1u;
  if (tid == 0) {
    st = {.prefix = 0, .mask = 0, .remaining = k, .at_least = E, .done = 0};
    s_next = 0;
  }
  __syncthreads();
  if (E <= k) {
    for (uint32_t w = tid; w < E; w += kSelectThreads) cand[w] = rank_key(sc[w], w);
    __syncthreads();
    select_sort_desc(cand, static_cast<int>(pow2));
  } else {
    int shift = 64;  // the lowest bit of the digits found so far
    uint32_t* ghist = reinterpret_cast<uint32_t*>(cand);  // (cand is not used before a collect)
    // Adds the counted lanes' bins to `h` (every lane of the warp calls it): a warp whose counted
    // lanes share one bin adds once (per-lane atomics on one bin serialise 32 ways).
    auto hist_add = [&](uint32_t* h, bool counted, uint32_t bin) {
      const uint32_t voters = __ballot_sync(0xffffffffu, counted);
      if (voters == 0) return;
      const int leader = __ffs(voters) - 1;
      const uint32_t lead_bin = __shfl_sync(0xffffffffu, bin, leader);
      if (__all_sync(0xffffffffu, !counted || bin == lead_bin)) {
        if (lane == leader) atomicAdd(&h[lead_bin], static_cast<uint32_t>(__popc(voters)));
      } else if (counted) {
        atomicAdd(&h[bin], 1u);
      }
    };
    // Appends the entries whose score bits are >= `lower` to cand (as many as fit; s_next counts
    // them all). Starts from s_next = 0 and a zeroed cand.
    auto collect = [&](uint32_t lower) {
      select_sweep(sc, E, [&](uint32_t u, uint32_t w, bool valid) {
        const bool kept = valid && u >= lower;
        const uint32_t kb = __ballot_sync(0xffffffffu, kept);
        if (kb == 0) return;
        uint32_t slot = 0;
        if (lane == 0) slot = atomicAdd(&s_next, static_cast<uint32_t>(__popc(kb)));
        slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(kb & below);
        if (kept && slot < static_cast<uint32_t>(kSelectCap))
          cand[slot] = (static_cast<uint64_t>(u) << 32) | (0xffffffffu - w);
      });
    };
    uint32_t n = 0;
    bool in_smem = false;  // cand[0 .. n) holds every key >= the k-th largest; st is set for them
    if (E > static_cast<uint32_t>(kSelectCap)) {
      // A guess first: the 12-bit histogram of a sample (the first 128 entries of every 1024)
      // gives a lower bound that about 1.5 k entries are expected to clear; one sweep collects
      // them. The guess is kept only if between k and kSelectCap entries cleared it (then the top
      // k are among them); otherwise the radix passes below run from the start.
      for (int i = tid; i < 4096; i += kSelectThreads) ghist[i] = 0;
      __syncthreads();
      for (uint32_t c0 = warp; c0 * 1024 < E; c0 += 2 * kWarps) {
        float v[8];  // chunks c0 and c0 + kWarps: entries 4 lane .. 4 lane + 3 of each
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t w = (c0 + (j / 4) * kWarps) * 1024 + 4 * lane + j % 4;
          v[j] = w < E ? sc[w] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t w = (c0 + (j / 4) * kWarps) * 1024 + 4 * lane + j % 4;
          hist_add(ghist, w < E, order_bits(v[j]) >> 20);
        }
      }
      const uint32_t S = E / 1024 * 128 + (E % 1024 < 128 ? E % 1024 : 128);  // entries sampled
      const uint32_t want = static_cast<uint32_t>(static_cast<uint64_t>(S) * 3 * k / (2 * static_cast<uint64_t>(E))) + 16;
      if (want < S) {
        if (tid == 0) st = {.prefix = 0, .mask = 0, .remaining = want, .at_least = S, .done = 0};
        __syncthreads();
        select_descend(ghist, 52, 12, want, st, warp_sums);
        __syncthreads();
        const uint32_t lower = static_cast<uint32_t>(st.prefix >> 32);
        for (int i = tid; i < kSelectCap; i += kSelectThreads) cand[i] = 0;
        __syncthreads();
        collect(lower);
        __syncthreads();
        n = s_next;
        in_smem = n >= k && n <= static_cast<uint32_t>(kSelectCap);
        if (!in_smem)
          for (int i = tid; i < kSelectCap; i += kSelectThreads) cand[i] = 0;
        __syncthreads();  // (everyone has read s_next)
        if (tid == 0) {
          st = {.prefix = 0, .mask = 0, .remaining = k, .at_least = in_smem ? n : E, .done = 0};
          if (!in_smem) s_next = 0;
        }
        __syncthreads();
      }
    }
    if (!in_smem) {
      // Global passes over the score bits (the keys' high words) while too many entries remain:
      // the first over the top 12 bits (sign, exponent, 3 bits of mantissa: scores of a token
      // mostly share their top 8), then 8, 8 and 4, counted in `cand`.
      while (st.at_least > static_cast<uint32_t>(kSelectCap) && shift > 32) {
        const int bits = shift == 64 ? 12 : (shift - 32 < 8 ? shift - 32 : 8);
        shift -= bits;
        const uint32_t bin_mask = (1u << bits) - 1u;
        for (int i = tid; i < (1 << bits); i += kSelectThreads) ghist[i] = 0;
        __syncthreads();
        const uint32_t prefix = static_cast<uint32_t>(st.prefix >> 32), mask = static_cast<uint32_t>(st.mask >> 32);
        select_sweep(sc, E, [&](uint32_t u, uint32_t, bool valid) {
          hist_add(ghist, valid && (u & mask) == prefix, (u >> (shift - 32)) & bin_mask);
        });
        __syncthreads();
        select_descend(ghist, shift, bits, k, st, warp_sums);
        __syncthreads();
      }
      for (int i = tid; i < kSelectCap; i += kSelectThreads) cand[i] = 0;
      __syncthreads();
      if (st.at_least <= static_cast<uint32_t>(kSelectCap)) {
        // The entries at or above the bin's lower bound, into shared memory.
        collect(static_cast<uint32_t>(st.prefix >> 32));
        __syncthreads();
        n = s_next;
        in_smem = true;
      }
    }
    if (in_smem) {
      // The passes go on in shared memory, down to the index bits if need be (the keys are
      // unique, so a bin of one key is taken whole at the latest).
      while (!st.done && shift > 0) {
        const int bits = shift < 8 ? shift : 8;
        shift -= bits;
        for (int i = tid; i < 256; i += kSelectThreads) hist[i] = 0;
        __syncthreads();
        const uint64_t prefix = st.prefix, mask = st.mask;
        for (uint32_t i = tid; i < n; i += kSelectThreads) {
          const uint64_t key = cand[i];
          if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & ((1u << bits) - 1u)], 1u);
        }
        __syncthreads();
        select_descend(hist, shift, bits, k, st, warp_sums);
        __syncthreads();
      }
      if (n > k) {  // keep the k keys >= prefix in slots 0 .. k - 1 (the rest zero)
        const uint64_t lower64 = st.prefix;
        uint64_t held[kHeld];
#pragma unroll
        for (int j = 0; j < kHeld; ++j) {
          const uint32_t i = tid + j * kSelectThreads;
          held[j] = i < n ? cand[i] : 0u;
        }
        __syncthreads();
        if (tid == 0) s_next = 0;
#pragma unroll
        for (int j = 0; j < kHeld; ++j)
          if (tid + j * kSelectThreads < n) cand[tid + j * kSelectThreads] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kHeld; ++j) {
          const bool kept = held[j] >= lower64 && held[j] != 0;
          const uint32_t kb = __ballot_sync(0xffffffffu, kept);
          if (kb == 0) continue;
          uint32_t slot = 0;
          if (lane == 0) slot = atomicAdd(&s_next, static_cast<uint32_t>(__popc(kb)));
          slot = __shfl_sync(0xffffffffu, slot, 0);
          if (kept) cand[slot + __popc(kb & below)] = held[j];
        }
      }
    } else {
      // More than kSelectCap entries tie at the k-th largest score u*: the lowest-index ones are
      // kept, so the compaction keeps index order. Warp i walks entries [i * slice, (i + 1) *
      // slice), kStep at a time.
      const uint32_t prefix = static_cast<uint32_t>(st.prefix >> 32);  // u*
      const uint32_t remaining = st.remaining;                          // entries equal to u* that are kept
      constexpr uint32_t kStep = 32 * kSelectPerLane;
      const uint32_t slice = (E + kWarps * kStep - 1) / (kWarps * kStep) * kStep;
      const uint32_t w0 = warp * slice < E ? warp * slice : E, w1 = w0 + slice < E ? w0 + slice : E;
      uint32_t greater = 0, equal = 0;
      for (uint32_t base = w0; base < w1; base += kStep) {
        uint32_t u[kSelectPerLane];
#pragma unroll
        for (int j = 0; j < kSelectPerLane; ++j) {
          const uint32_t w = base + 32 * j + lane;
          u[j] = w < w1 ? order_bits(sc[w]) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kSelectPerLane; ++j) {
          const bool in = base + 32 * j + lane < w1;
          greater += __popc(__ballot_sync(0xffffffffu, in && u[j] > prefix));
          equal += __popc(__ballot_sync(0xffffffffu, in && u[j] == prefix));
        }
      }
      if (lane == 0) {
        s_greater[warp] = greater;
        s_equal[warp] = equal;
      }
      __syncthreads();
      if (warp == 0) {  // exclusive scans over the warps
        const uint32_t g = lane < kWarps ? s_greater[lane] : 0u, e = lane < kWarps ? s_equal[lane] : 0u;
        const uint32_t gi = warp_inclusive_scan(g), ei = warp_inclusive_scan(e);
        if (lane < kWarps) {
          s_greater[lane] = gi - g;
          s_equal[lane] = ei - e;
        }
      }
      __syncthreads();
      uint32_t g = s_greater[warp], e = s_equal[warp];
      const uint32_t n_greater = take - remaining;
      for (uint32_t base = w0; base < w1; base += kStep) {
        uint64_t key[kSelectPerLane];
#pragma unroll
        for (int j = 0; j < kSelectPerLane; ++j) {
          const uint32_t w = base + 32 * j + lane;
          key[j] = w < w1 ? rank_key(sc[w], w) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kSelectPerLane; ++j) {  // in index order
          const bool in = base + 32 * j + lane < w1;
          const uint32_t u = static_cast<uint32_t>(key[j] >> 32);
          const uint32_t gb = __ballot_sync(0xffffffffu, in && u > prefix);
          const uint32_t eb = __ballot_sync(0xffffffffu, in && u == prefix);
          if (in && u > prefix) cand[g + __popc(gb & below)] = key[j];
          if (in && u == prefix) {
            const uint32_t my = e + __popc(eb & below);
            if (my < remaining) cand[n_greater + my] = key[j];
          }
          g += __popc(gb);
          e += __popc(eb);
        }
      }
    }
    __syncthreads();
    select_sort_desc(cand, static_cast<int>(pow2));
  }
  for (uint32_t i = tid; i < k; i += kSelectThreads)
    a.out_indices[t * k + i] = i < take ? static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(cand[i] & 0xffffffffu)) : -1;
}

// The rank rule counted in shared memory, for small calls (indexer_rank_select_fits): grid (T,
// C' / 32), block 32 * kRankWarps, dynamic shared memory: a row of C' order bits (C' = C rounded up
// to a power of two, at least 32: launch_indexer_select). Every block
// reads its token's scores into shared memory as order bits (rank_key's high word); lane l of each
// warp holds entry 32 y + l and counts the entries of the warp's slice of the row (warp i: the i-th
// of kRankWarps equal parts) that rank above it: a higher key, or the same key at a lower index
// (rank_key's order, the radix kernel's: the same slots). All lanes read the same key at once (a
// shared-memory broadcast). Warp 0 adds the slices' counts in warp order and writes the entry to
// its slot when the rank is below k; the ranks are a permutation, so every slot below the visible
// count is written once, and the token's block 0 writes -1 past it. At one token and 1024 entries
// the radix kernel (one block: 14 barriers' radix passes and a bitonic sort of 512 keys) held the
// batch-1 CSA step 20 us (H200, 2026-12-03); here 32 blocks of a 1024-step scan.
constexpr int kRankWarps = 8;
__global__ void __launch_bounds__(32 * kRankWarps) indexer_rank_select_kernel(IndexerArgs a) {
  wait_previous_grid();
  extern __shared__ uint32_t row_bits[];  // [C]
  __shared__ uint32_t partial[kRankWarps][32];
  const int64_t t = blockIdx.x;
  const uint32_t E = static_cast<uint32_t>(a.visible[t]), k = static_cast<uint32_t>(a.k);
  int32_t* out = a.out_indices + t * a.k;
  if (blockIdx.y == 0)
    for (uint32_t i = E + threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
  const uint32_t w0 = blockIdx.y * 32u;
  if (w0 >= E) return;  // (the whole block)
  const float* sc = a.scores + t * a.C;
  for (uint32_t i = threadIdx.x; i < E; i += blockDim.x) row_bits[i] = order_bits(sc[i]);
  __syncthreads();
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t w = w0 + lane;
  const uint32_t mine = w < E ? row_bits[w] : 0u;
  const uint32_t slice = (E + kRankWarps - 1) / kRankWarps;
  const uint32_t v0 = warp * slice < E ? warp * slice : E, v1 = v0 + slice < E ? v0 + slice : E;
  uint32_t above = 0;
#pragma unroll 8
  for (uint32_t v = v0; v < v1; ++v) {
    const uint32_t u = row_bits[v];
    above += (u > mine) | ((u == mine) & (v < w));
  }
  partial[warp][lane] = above;
  __syncthreads();
  if (warp == 0 && w < E) {
    uint32_t rank = 0;
#pragma unroll
    for (int i = 0; i < kRankWarps; ++i) rank += partial[i][lane];
    if (rank < k) out[rank] = static_cast<int32_t>(w);
  }
}

// grid (T, ceil(C / kScoreEntries)), block 32 * kScoreWarps, dynamic shared memory: the token's q
// [Hi, di + 1] (padded: conflict-free column reads), one key row per warp [di], and the per-head
// terms [kScoreWarps, Hi]. Warp w scores entries w, w + kScoreWarps, ... of the block's tile: lane l
// computes the dot products of heads l, l + 32, ... with the same FMAs in the same order over i as
// indexer_score_kernel, and lane 0 accumulates weight x ReLU(dot) in head order with the same FMAs,
// so the scores are the same bits. fp32 scores only (not bf16_scores).
__global__ void indexer_score_smem_kernel(IndexerArgs a) {
  wait_previous_grid();
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x;
  const int64_t di = a.di, Hi = a.Hi, qs = di + 1;
  float* q = smem;                                   // [Hi, di + 1]
  float* keys = q + Hi * qs;                         // [kScoreWarps, di]
  float* terms = keys + kScoreWarps * di;            // [kScoreWarps, Hi]
  for (int64_t i = threadIdx.x; i < Hi * di; i += blockDim.x) q[(i / di) * qs + i % di] = a.q[t * Hi * di + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t visible = a.visible[t];
  const float* kbase = a.keys[t];
  float* key = keys + warp * di;
  float* term = terms + warp * Hi;
  for (int e = warp; e < kScoreEntries; e += kScoreWarps) {
    const int64_t w = static_cast<int64_t>(blockIdx.y) * kScoreEntries + e;
    if (w >= a.C) break;  // the whole warp
    if (w >= visible) {
      if (lane == 0) a.scores[t * a.C + w] = -INFINITY;
      continue;
    }
    for (int64_t i = lane; i < di; i += 32) key[i] = kbase[w * di + i];
    __syncwarp();
    for (int64_t h = lane; h < Hi; h += 32) {
      const float* qh = q + h * qs;
      float d = 0.0f;
      for (int64_t i = 0; i < di; ++i) d = __fmaf_rn(qh[i], key[i], d);
      term[h] = fmaxf(d, 0.0f);
    }
    __syncwarp();
    if (lane == 0) {
      float score = 0.0f;
      for (int64_t h = 0; h < Hi; ++h) score = __fmaf_rn(a.head_weights[t * Hi + h], term[h], score);
      a.scores[t * a.C + w] = score * a.scale;
    }
    __syncwarp();
  }
}

// The same scores from register tiles (the batch-256, 128K cells spent 23 ms here with
// indexer_score_smem_kernel: one lane's 2 heads x 128 sequential FMAs per entry, lane 0's 64 more,
// and the token's q re-read for every 32 entries). grid (T, ceil(C / kTileEntries)), block
// kTileThreads, dynamic shared memory: the token's q [kTileHeads, di + 4] and the block's keys
// [kTileEntries, di + 4] (rows padded to keep float4 reads aligned and spread over the banks), then
// the ReLU terms [kTileEntries, kTileHeads + 1] in the keys' place. Thread (head group hg, entry
// group eg) computes the dot products of heads hg + 16 j (j < 4) with entries 8 eg .. 8 eg + 7: each
// is the same FMA chain over i in the same order as indexer_score_kernel's, and thread e then sums
// entry e's terms over the heads in head order with the same FMAs: the same bits. REQUIRES
// Hi <= kTileHeads, di % 4 == 0, fp32 scores.
constexpr int kTileEntries = 128, kTileHeads = 64, kTileThreads = 256;
constexpr int kTileHeadsPerThread = 4, kTileEntriesPerThread = 8;
static_assert((kTileHeads / kTileHeadsPerThread) * (kTileEntries / kTileEntriesPerThread) == kTileThreads,
              "one thread per (head group, entry group)");

size_t indexer_tile_smem(int64_t di) {
  const size_t row = static_cast<size_t>(di + 4);
  const size_t keys = kTileEntries * row, terms = static_cast<size_t>(kTileEntries) * (kTileHeads + 1);
  return (kTileHeads * row + (keys > terms ? keys : terms)) * sizeof(float);
}

__global__ void __launch_bounds__(kTileThreads) indexer_score_tiled_kernel(IndexerArgs a) {
  wait_previous_grid();
  extern __shared__ __align__(16) float tile_smem[];
  const int64_t t = blockIdx.x, di = a.di, Hi = a.Hi, row = di + 4;
  const int64_t w0 = static_cast<int64_t>(blockIdx.y) * kTileEntries;
  const int64_t visible = a.visible[t];
  const int64_t end = visible < a.C ? visible : a.C;  // entries below `end` are scored
  const int64_t n_ent = end <= w0 ? 0 : (end - w0 < kTileEntries ? end - w0 : kTileEntries);
  float* q = tile_smem;                      // [kTileHeads, row]
  float* keys = q + kTileHeads * row;        // [kTileEntries, row]
  float* terms = keys;                       // [kTileEntries, kTileHeads + 1], after the dot products
  const int tid = threadIdx.x;
  // Entries past `visible` (and past C) score -inf.
  for (int64_t e = tid; e < kTileEntries; e += kTileThreads) {
    const int64_t w = w0 + e;
    if (w < a.C && e >= n_ent) a.scores[t * a.C + w] = -INFINITY;
  }
  if (n_ent <= 0) return;
  // Staged with 16-byte loads, kStageUnroll issued before any is stored (scalar loads one after
  // another left the scorer waiting on memory: 14.5 ms at 256 x 128K on the H200).
  constexpr int kStageUnroll = 8;
  const int64_t d4 = di / 4;
  const float4* qsrc = reinterpret_cast<const float4*>(a.q + t * Hi * di);
  for (int64_t i0 = tid; i0 < kTileHeads * d4; i0 += kStageUnroll * kTileThreads) {
    float4 v[kStageUnroll];
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = i0 + u * kTileThreads, h = i / d4;
      v[u] = i < kTileHeads * d4 && h < Hi ? qsrc[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = i0 + u * kTileThreads;
      if (i < kTileHeads * d4) *reinterpret_cast<float4*>(q + (i / d4) * row + 4 * (i % d4)) = v[u];
    }
  }
  const float4* ksrc = reinterpret_cast<const float4*>(a.keys[t] + w0 * di);
  for (int64_t i0 = tid; i0 < kTileEntries * d4; i0 += kStageUnroll * kTileThreads) {
    float4 v[kStageUnroll];
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = i0 + u * kTileThreads;
      v[u] = i < kTileEntries * d4 && i / d4 < n_ent ? ksrc[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = i0 + u * kTileThreads;
      if (i < kTileEntries * d4) *reinterpret_cast<float4*>(keys + (i / d4) * row + 4 * (i % d4)) = v[u];
    }
  }
  __syncthreads();
  // Thread (hg, eg): heads hg, hg + 16, hg + 32, hg + 48 (strided, so that the 8 lanes of a float4
  // read phase hit 8 different q rows 132 floats apart: distinct banks) and entries 8 eg .. 8 eg + 7.
  constexpr int kHeadGroups = kTileHeads / kTileHeadsPerThread;
  const int hg = tid % kHeadGroups, eg = tid / kHeadGroups;
  float d[kTileHeadsPerThread][kTileEntriesPerThread] = {};
  for (int64_t i = 0; i < di; i += 4) {
    float4 qv[kTileHeadsPerThread], kv[kTileEntriesPerThread];
#pragma unroll
    for (int h = 0; h < kTileHeadsPerThread; ++h)
      qv[h] = *reinterpret_cast<const float4*>(q + (hg + kHeadGroups * h) * row + i);
#pragma unroll
    for (int e = 0; e < kTileEntriesPerThread; ++e)
      kv[e] = *reinterpret_cast<const float4*>(keys + (kTileEntriesPerThread * eg + e) * row + i);
#pragma unroll
    for (int h = 0; h < kTileHeadsPerThread; ++h)
#pragma unroll
      for (int e = 0; e < kTileEntriesPerThread; ++e) {
        d[h][e] = __fmaf_rn(qv[h].x, kv[e].x, d[h][e]);
        d[h][e] = __fmaf_rn(qv[h].y, kv[e].y, d[h][e]);
        d[h][e] = __fmaf_rn(qv[h].z, kv[e].z, d[h][e]);
        d[h][e] = __fmaf_rn(qv[h].w, kv[e].w, d[h][e]);
      }
  }
  __syncthreads();  // every key read before the terms overwrite them
#pragma unroll
  for (int h = 0; h < kTileHeadsPerThread; ++h)
#pragma unroll
    for (int e = 0; e < kTileEntriesPerThread; ++e)
      terms[(kTileEntriesPerThread * eg + e) * (kTileHeads + 1) + hg + kHeadGroups * h] = fmaxf(d[h][e], 0.0f);
  __syncthreads();
  for (int64_t e = tid; e < n_ent; e += kTileThreads) {
    float score = 0.0f;
    for (int64_t h = 0; h < Hi; ++h) score = __fmaf_rn(a.head_weights[t * Hi + h], terms[e * (kTileHeads + 1) + h], score);
    a.scores[t * a.C + w0 + e] = score * a.scale;
  }
}

// The fast profile's scores on the bf16 tensor cores (indexer_mma; 5.7 ms at 256 x 128K with the
// fp32 register tiles above, compute-bound on the CUDA cores). q and the keys are bf16 values there
// (q rounded after RoPE, keys stored at --index-keys bf16 or fp4), so bf16 operands give every
// product exactly; the fp32 sums are in the tensor cores' order, so the scores differ from the FMA
// chains above in the last bits (top-k can flip only at near-ties). Each score is still a function
// of its own token and entry alone (batch and chunking invariant).
//
// grid (T ceil(C / (tiles kTileEntries))), block 8 warps; a block takes `tiles` consecutive tiles
// of 128 entries of one token, its q staged once. The keys stream through a ring of kMmaStages
// tiles in shared memory (cp.async: two tiles in flight while one is multiplied, two blocks an SM:
// the scan is bound by how many bytes are in flight). Warp w takes the entries 16 w .. 16 w + 15 of
// each tile as two n8 tiles, all heads (kMts m16 tiles) in one accumulator set. The dims are taken in
// a permuted order, the same for A and B (a dot product does not depend on it): in k-step 2p + s a
// lane's logical k {2 tig, 2 tig + 1} are the dims 32 p + 8 tig + 4 s + {0, 1} and {2 tig + 8,
// 2 tig + 9} the dims + {2, 3}, so a lane reads a row's 8 dims 32 p + 8 tig .. + 7 as one 16-byte
// shared-memory load. q is staged in the order of the A fragments (one 16-byte load a fragment, no
// register shuffling before the mma); key rows are stored with their 16-byte chunks swizzled by the
// row's parity (rows of 128 bytes or more), so the 8 lanes of a load phase (rows gid, gid + 1 x 4
// tig) hit distinct banks. Then score = scale * sum_h w_h relu(d_h): each lane's 2 kMts heads by FMAs,
// the 8 lanes of an entry by shuffles.
constexpr int kMmaThreads = 256;
constexpr int kMmaMaxTiles = 32;
constexpr int64_t kMmaMinBlocks = 1024;  // about 4 waves of 2 blocks an SM
constexpr int kMmaStages = 3;
static_assert(kMmaThreads / 32 * 16 == kTileEntries, "a warp a 16-entry slice of the tile");

__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

__device__ inline void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Where 16-byte chunk c of row r of a staged q or key tile lies, in chunks.
template <int kRowChunks>
__device__ inline int indexer_chunk(int r, int c) {
  return r * kRowChunks + (kRowChunks >= 8 ? c ^ ((r & 1) << 2) : c);
}

// Shared memory of indexer_score_mma_kernel: q, then the key ring (as many stages as the block has
// tiles, at most kMmaStages).
inline size_t indexer_mma_smem(int64_t Hi, int64_t di, int tiles) {
  const int stages = tiles < kMmaStages ? tiles : kMmaStages;
  return static_cast<size_t>((Hi + stages * kTileEntries) * di * 2);
}

template <int kPairs, int kMts>  // di = 32 kPairs, Hi = 16 kMts
__global__ void __launch_bounds__(kMmaThreads, 2) indexer_score_mma_kernel(IndexerArgs a, int tiles) {
  wait_previous_grid();
  constexpr int kDi = 32 * kPairs, kHi = 16 * kMts, kRowChunks = kDi / 8;  // 16-byte chunks a row
  constexpr int kTileChunks = kTileEntries * kRowChunks;
  extern __shared__ uint4 smem_chunks[];
  uint4* qs = smem_chunks;                       // [kMts kPairs 2 x 32 lanes] A fragments
  uint4* ring = smem_chunks + kHi * kRowChunks;  // [stages][kTileEntries rows]
  const int tid = threadIdx.x;
  // Token-major blocks: a token's blocks run together, so its q is read from HBM once (with the
  // tokens in the grid's fast dimension, every wave re-read all of them: 0.27 GB at 256 x 128K).
  const int64_t chunks = (a.C + int64_t{tiles} * kTileEntries - 1) / (int64_t{tiles} * kTileEntries);
  const int64_t t = blockIdx.x / chunks;
  const int64_t visible = a.visible[t];
  const int64_t end = visible < a.C ? visible : a.C;  // entries below `end` are scored
  // The block's tiles: entries past `end` (and below C) score -inf.
  const int64_t b0 = static_cast<int64_t>(blockIdx.x % chunks) * tiles * kTileEntries;
  for (int64_t e = tid; e < static_cast<int64_t>(tiles) * kTileEntries; e += kMmaThreads) {
    const int64_t w = b0 + e;
    if (w < a.C && w >= end) a.scores[t * a.C + w] = -INFINITY;
  }
  if (b0 >= end) return;
  const int n_blk = static_cast<int>(end - b0 < int64_t{tiles} * kTileEntries ? end - b0 : int64_t{tiles} * kTileEntries);
  const int n_tiles = (n_blk + kTileEntries - 1) / kTileEntries;
  // Tile i into stage i % kMmaStages; rows past the block's entries zero-filled (not read). A
  // thread copies chunk tid % kRowChunks of rows tid / kRowChunks + kRowStep j: the same chunk and
  // row parity (kRowStep is even), so one swizzled offset and one source offset plus constants.
  constexpr int kRowStep = kMmaThreads / kRowChunks;
  static_assert(kRowStep % 2 == 0 && kTileEntries % kRowStep == 0, "a thread's rows share their parity");
  const int my_row = tid / kRowChunks;
  const uint4* src = reinterpret_cast<const uint4*>(a.keys_bf16[t] + b0 * kDi) + my_row * kRowChunks + tid % kRowChunks;
  const int dst = indexer_chunk<kRowChunks>(my_row, tid % kRowChunks);
  auto issue = [&](int i) {
    if (i < n_tiles) {
      uint4* stage = ring + (i % kMmaStages) * kTileChunks + dst;
      const uint4* from = src + i * kTileChunks;
      if ((i + 1) * kTileEntries <= n_blk) {  // a whole tile
#pragma unroll
        for (int j = 0; j < kTileEntries / kRowStep; ++j)
          cp_async(stage + j * kRowStep * kRowChunks, from + j * kRowStep * kRowChunks, true, 16);
      } else {
#pragma unroll
        for (int j = 0; j < kTileEntries / kRowStep; ++j) {
          const bool ok = i * kTileEntries + my_row + j * kRowStep < n_blk;
          cp_async(stage + j * kRowStep * kRowChunks, ok ? from + j * kRowStep * kRowChunks : src, ok, 16);
        }
      }
    }
    cp_async_commit();  // (empty past the last tile: the group count stays i + 1)
  };
  issue(0);
  issue(1);
  // q once for the block's tiles (bf16 values: the conversion is exact), as the A fragments lanes
  // load whole: fragment ((mt kPairs + p) 2 + s) 32 + lane is {row gid, row gid + 8} x {dims
  // + {0, 1}, dims + {2, 3}} at dims 32 p + 8 tig + 4 s of m16 tile mt (the order mma takes).
  for (int f = tid; f < kMts * kPairs * 64; f += kMmaThreads) {
    const int ln = f % 32, s = (f / 32) % 2, p = (f / 64) % kPairs, mt = f / (64 * kPairs);
    const float2* r0 = reinterpret_cast<const float2*>(a.q + (t * kHi + 16 * mt + ln / 4) * kDi + 32 * p + 8 * (ln % 4) + 4 * s);
    const float2* r1 = r0 + 4 * kDi;  // row + 8
    qs[f] = make_uint4(pack_bf16x2(r0[0].x, r0[0].y), pack_bf16x2(r1[0].x, r1[0].y), pack_bf16x2(r0[1].x, r0[1].y),
                       pack_bf16x2(r1[1].x, r1[1].y));
  }
  const int warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  float wh[kMts][2];  // the weights of this lane's heads
#pragma unroll
  for (int mt = 0; mt < kMts; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) wh[mt][h] = a.head_weights[t * kHi + 16 * mt + gid + 8 * h];
  float* scores = a.scores + t * a.C + b0;
  for (int i = 0; i < n_tiles; ++i) {
    cp_async_wait<1>();  // this thread's copies of tile i have landed
    __syncthreads();     // everyone's (and q); every warp is done with tile i - 1's stage
    issue(i + 2);
    const uint4* stage = ring + (i % kMmaStages) * kTileChunks;
    float acc[kMts][2][4] = {};  // [m16 tile][n8 tile][fragment]
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      uint4 kb[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) kb[nt] = stage[indexer_chunk<kRowChunks>(warp * 16 + nt * 8 + gid, 4 * p + tig)];
#pragma unroll
      for (int mt = 0; mt < kMts; ++mt) {
        const uint4 f0 = qs[((mt * kPairs + p) * 2) * 32 + lane], f1 = qs[((mt * kPairs + p) * 2 + 1) * 32 + lane];
        const uint32_t a0[4] = {f0.x, f0.y, f0.z, f0.w}, a1[4] = {f1.x, f1.y, f1.z, f1.w};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          mma_bf16_m16n8k16(acc[mt][nt], a0, kb[nt].x, kb[nt].y);
          mma_bf16_m16n8k16(acc[mt][nt], a1, kb[nt].z, kb[nt].w);
        }
      }
    }
    // Fragment c of tile (mt, nt): head 16 mt + gid + 8 (c / 2), entry 8 nt + 2 tig + c % 2.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float part[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int mt = 0; mt < kMts; ++mt) {
          part[j] = __fmaf_rn(wh[mt][0], fmaxf(acc[mt][nt][j], 0.0f), part[j]);
          part[j] = __fmaf_rn(wh[mt][1], fmaxf(acc[mt][nt][2 + j], 0.0f), part[j]);
        }
#pragma unroll
      for (int off = 4; off < 32; off <<= 1)
#pragma unroll
        for (int j = 0; j < 2; ++j) part[j] += __shfl_xor_sync(0xffffffffu, part[j], off);
      if (gid == 0)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int e = i * kTileEntries + warp * 16 + nt * 8 + 2 * tig + j;
          if (e < n_blk) scores[e] = part[j] * a.scale;
        }
    }
  }
}

template <int kPairs, int kMts>
void launch_indexer_score_mma_shape(const IndexerArgs& a, dim3 grid, int tiles) {
  static bool opted = false;  // the attribute is per kernel; the most any launch of it asks
  if (!opted) {
    SPARROW_CUDA_CHECK(cudaFuncSetAttribute(indexer_score_mma_kernel<kPairs, kMts>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(indexer_mma_smem(16 * kMts, 32 * kPairs, kMmaStages))));
    opted = true;
  }
  launch(indexer_score_mma_kernel<kPairs, kMts>, grid, kMmaThreads, indexer_mma_smem(a.Hi, a.di, tiles), a, tiles);
}

template <int kPairs>
void launch_indexer_score_mma(const IndexerArgs& a, dim3 grid, int tiles) {
  switch (a.Hi / 16) {
    case 1: launch_indexer_score_mma_shape<kPairs, 1>(a, grid, tiles); break;
    case 2: launch_indexer_score_mma_shape<kPairs, 2>(a, grid, tiles); break;
    case 3: launch_indexer_score_mma_shape<kPairs, 3>(a, grid, tiles); break;
    default: launch_indexer_score_mma_shape<kPairs, 4>(a, grid, tiles); break;
  }
}

__global__ void rows_to_bf16_kernel(const float* const* src, uint16_t* const* dst, int64_t dim) {
  wait_previous_grid();
  const float* s = src[blockIdx.x];
  uint16_t* d = dst[blockIdx.x];
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = __bfloat16_as_ushort(__float2bfloat16_rn(s[i]));
}

// Candidate j of a token: window positions first (older ones from the ring, this batch's from
// batch_kv), then compressed entries (HCA: all visible; CSA: the selection, null for -1).
// (Of the fp32 state, of its bf16 copies, or of the records: the bases passed, rows `stride`
// elements apart.)
// A CSA candidate's entry from its selection w (a slot of AttentionArgs::selected): null for an
// empty slot (-1).
template <class T>
__device__ inline const T* selected_entry(const AttnTokenArgs& tk, int32_t w, const T* entries, int64_t stride) {
  if (w < 0) return nullptr;
  if (w >= tk.n_entries) __trap();  // a selection past the stored entries is a bug upstream
  return entries + static_cast<int64_t>(w) * stride;
}
// q % window (q >= 0), in 32 bits where both fit (a 64-bit remainder is a call).
__device__ inline int64_t ring_slot(int64_t q, int64_t window) {
  return q < (int64_t{1} << 31) && window < (int64_t{1} << 31)
             ? static_cast<int64_t>(static_cast<uint32_t>(q) % static_cast<uint32_t>(window))
             : q % window;
}
template <class T>
__device__ inline const T* candidate_in(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j,
                                        const T* ring, const T* entries, const T* batch_kv, int64_t stride) {
  if (j < tk.n_window) {
    const int64_t q = tk.pos - tk.n_window + 1 + j;
    return q >= tk.first_pos ? batch_kv + (q - tk.first_pos) * stride : ring + ring_slot(q, a.window) * stride;
  }
  const int64_t i = j - tk.n_window;
  if (!a.csa) return entries + i * stride;
  return selected_entry(tk, a.selected[t * a.k + i], entries, stride);
}
template <class T>
__device__ inline const T* candidate_in(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j,
                                        const T* ring, const T* entries, const T* batch_kv) {
  return candidate_in(a, tk, t, j, ring, entries, batch_kv, a.Dh);
}
__device__ inline const uint8_t* candidate_record(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j) {
  return candidate_in(a, tk, t, j, tk.ring_rec, tk.entries_rec, tk.batch_kv_rec, a.rec.bytes);
}
__device__ inline const float* candidate(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j) {
  return candidate_in(a, tk, t, j, tk.ring, tk.entries, tk.batch_kv);
}

// The logits of candidates j_begin .. j_begin + count - 1 into e[0 .. count): a warp per candidate,
// lanes over Dh with coalesced key reads, q in shared memory; -inf for a masked candidate. Returns
// the running max of the logits this thread wrote (lane 0s; -inf for the other lanes).
// kF64 (attention_kernel under weights_bf16): the CPU's logit, fp64 sums times scale_f64, to fp32.
template <bool kF64 = false>
__device__ float warp_logits(const AttentionArgs& a, const AttnTokenArgs& tk, int64_t t, int64_t j_begin, int64_t count,
                             const float* q_smem, float* e) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x / 32; j < count; j += warps) {
    const float* key = candidate(a, tk, t, j_begin + j);
    float logit = -INFINITY;
    if (key) {
      if constexpr (kF64) {
        double d = 0.0;
        for (int64_t i = lane; i < a.Dh; i += 32) d += static_cast<double>(q_smem[i]) * key[i];
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        logit = static_cast<float>(d * a.scale_f64);
      } else {
        float d = 0.0f;
        for (int64_t i = lane; i < a.Dh; i += 32) d += q_smem[i] * key[i];
        logit = warp_sum(d) * a.scale;
      }
    }
    if (lane == 0) {
      e[j] = logit;
      mx = fmaxf(mx, logit);
    }
  }
  return mx;
}

// grid (tokens of the pass from t_base * H; AttentionArgs::kernel_tokens_per_pass): softmax with the
// sink over the token's candidates, K = V; a block's logits and weights in its row of the scratch. The sink joins the max
// and the denominator but carries no value (spec §3.3). The calls with AttentionArgs::weights_bf16
// off the tensor cores come here whatever attn_split says (a split would start its own running max). kWarpDots (the default; off with
// SPARROW_CUDA_DISABLE=attn_warp): a warp per candidate's logit, lanes over Dh with coalesced key
// reads, the query in shared memory; otherwise a thread per candidate, Dh in sequence. Either way a
// (token, head)'s arithmetic does not depend on the other tokens of the batch.
template <bool kWarpDots>
__global__ void attention_kernel(AttentionArgs a, int64_t t_base) {
  wait_previous_grid();
  extern __shared__ float q_smem[];  // [Dh] when kWarpDots
  const int64_t t = t_base + blockIdx.x / a.H, h = blockIdx.x % a.H;
  const AttnTokenArgs tk = a.tokens[t];
  const int64_t n = tk.n_window + tk.n_compressed;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  float* e = a.scratch + blockIdx.x * a.max_candidates;
  const float sink = dev_load(a.sinks, h);
  float mx = -INFINITY;
  if constexpr (kWarpDots) {
    for (int64_t i = threadIdx.x; i < a.Dh; i += blockDim.x) q_smem[i] = q[i];
    __syncthreads();
    mx = a.weights_bf16 ? warp_logits<true>(a, tk, t, 0, n, q_smem, e) : warp_logits(a, tk, t, 0, n, q_smem, e);
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float* key = candidate(a, tk, t, j);
      float logit = -INFINITY;
      if (key && a.weights_bf16) {  // (the CPU's logit: fp64 sums)
        double d = 0.0;
        for (int64_t i = 0; i < a.Dh; ++i) d += static_cast<double>(q[i]) * key[i];
        logit = static_cast<float>(d * a.scale_f64);
      } else if (key) {
        float d = 0.0f;
        for (int64_t i = 0; i < a.Dh; ++i) d += q[i] * key[i];
        logit = d * a.scale;
      }
      e[j] = logit;
      mx = fmaxf(mx, logit);
    }
  }
  mx = fmaxf(block_max(mx), sink);  // (its barrier publishes e[])
  float sum = 0.0f;
  if (a.weights_bf16) {
    // AttentionArgs::weights_bf16: warp 0 takes the candidates in chunks of 32 in order, from the
    // first (a masked one keeps its place, as in the tensor-core kernel and the CPU), with their running max mc,
    // as the CPU does: each weight exp(logit - mc) rounded to bf16, then brought to the block's max
    // (the CPU's rescale of its accumulators as the max grows), and the unrounded exp(logit - mx)
    // summed into the denominator.
    if (threadIdx.x < 32) {
      float mc = -INFINITY;
      for (int64_t c0 = 0; c0 < n; c0 += 32) {
        const int64_t j = c0 + threadIdx.x;
        const float logit = j < n ? e[j] : -INFINITY;
        mc = fmaxf(mc, warp_max(logit));
        if (j < n) {
          const bool masked = logit == -INFINITY;
          sum += masked ? 0.0f : expf(logit - mx);
          // (The CPU's weight: exp in fp64 of the fp32 logit's distance to the running max, to fp32.)
          const float w = masked ? 0.0f : static_cast<float>(exp(static_cast<double>(logit) - static_cast<double>(mc)));
          e[j] = masked ? 0.0f : dev_bf16_round(w) * expf(mc - mx);
        }
      }
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = e[j] == -INFINITY ? 0.0f : expf(e[j] - mx);
      e[j] = v;
      sum += v;
    }
  }
  const float denom = block_sum(sum) + expf(sink - mx);  // block_sum's barrier publishes e[]
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float* key = candidate(a, tk, t, j);
      if (key) acc += e[j] * key[d];
    }
    a.out[(t * a.H + h) * a.Dh + d] = a.round_bf16 ? dev_bf16_round(acc / denom) : acc / denom;
  }
}

// The block of a split kernel: its token t, first head h0 (blocks of `heads` heads on grid x, in
// passes from t_base) and split s (grid y), and the token's candidates.
struct SplitBlock {
  int64_t t, h0, s, n;
  AttnTokenArgs tk;
};
__device__ inline SplitBlock split_block(const AttentionArgs& a, int64_t t_base, int64_t heads) {
  const int64_t groups = a.H / heads;
  SplitBlock b;
  b.t = t_base + blockIdx.x / groups;
  b.h0 = (blockIdx.x % groups) * heads;
  b.s = blockIdx.y;
  b.tk = a.tokens[b.t];
  b.n = b.tk.n_window + b.tk.n_compressed;
  return b;
}

// grid (tokens of the pass * H / kHeads, max_splits): split s of kHeads heads of a token, candidates
// [s * kAttnSplitCandidates, ...) of its n: for each head, the logits (a warp per candidate, lanes
// over Dh, as attention_kernel), their max m, e = exp(logit - m), and into part: sum_j e_j key_j
// [Dh], then m, then sum_j e_j. Splits past the token's n leave. The sink is applied in the combine.
// The heads of a token read the same candidates (K = V, one KV head): a block takes kHeads of them,
// so each key is read once for all of them and each candidate's address is found once (in shared
// memory) rather than once per (output dimension, candidate). Every head's sums are the ones a
// block of one head makes (the same order, the same block_sum), so kHeads does not change a bit.
static_assert(kAttnSplitCandidates <= kAttnThreads, "a thread holds at most one candidate's weight");

template <int kHeads>
__global__ void attention_split_kernel(AttentionArgs a, int64_t t_base, int64_t max_splits) {
  wait_previous_grid();
  extern __shared__ float split_smem[];  // q [kHeads, Dh], then e [kHeads, kAttnSplitCandidates]
  __shared__ const float* keys[kAttnSplitCandidates];
  float* q_smem = split_smem;
  float* e = split_smem + kHeads * a.Dh;
  const SplitBlock blk = split_block(a, t_base, kHeads);
  const int64_t t = blk.t, h0 = blk.h0, s = blk.s, n = blk.n;
  const AttnTokenArgs& tk = blk.tk;
  const int64_t j0 = s * kAttnSplitCandidates;
  if (j0 >= n) return;  // the whole block leaves
  const int64_t cnt = n - j0 < kAttnSplitCandidates ? n - j0 : kAttnSplitCandidates;
  for (int64_t i = threadIdx.x; i < kHeads * a.Dh; i += blockDim.x) q_smem[i] = a.q[(t * a.H + h0) * a.Dh + i];
  for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) keys[j] = candidate(a, tk, t, j0 + j);
  __syncthreads();
  // Logits: warp w takes candidates w, w + warps, ...; lane 0 keeps each head's running max.
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float mx[kHeads];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) mx[hh] = -INFINITY;
  for (int64_t j = threadIdx.x / 32; j < cnt; j += warps) {
    const float* key = keys[j];
    float d[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) d[hh] = 0.0f;
    if (key) {
      for (int64_t i = lane; i < a.Dh; i += 32) {
        const float k = key[i];
#pragma unroll
        for (int hh = 0; hh < kHeads; ++hh) d[hh] += q_smem[hh * a.Dh + i] * k;
      }
    }
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) {
      const float logit = key ? warp_sum(d[hh]) * a.scale : -INFINITY;
      if (lane == 0) {
        e[hh * kAttnSplitCandidates + j] = logit;
        mx[hh] = fmaxf(mx[hh], logit);
      }
    }
  }
  const int64_t th0 = (t - t_base) * a.H + h0;  // the pass-local (token, head) of head h0
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    const float m = block_max(mx[hh]);  // its barrier publishes e[]
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
      v = e[hh * kAttnSplitCandidates + j] == -INFINITY ? 0.0f : expf(e[hh * kAttnSplitCandidates + j] - m);
      e[hh * kAttnSplitCandidates + j] = v;
    }
    const float sum = block_sum(v);  // its barrier publishes e[]
    if (threadIdx.x == 0) {
      float* out = a.split_scratch + ((th0 + hh) * max_splits + s) * (a.Dh + 2);
      out[a.Dh] = m;
      out[a.Dh + 1] = sum;
    }
  }
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) acc[hh] = 0.0f;
    for (int64_t j = 0; j < cnt; ++j) {
      const float* key = keys[j];
      if (!key) continue;
      const float k = key[d];
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) acc[hh] += e[hh * kAttnSplitCandidates + j] * k;
    }
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) a.split_scratch[((th0 + hh) * max_splits + s) * (a.Dh + 2) + d] = acc[hh];
  }
}

// The combine's steps, shared with the tensor-core kernel's one-split tokens: a split's weight
// exp(m - M) (0 for an all-masked split), the denominator's and the output sum's next terms.
__device__ inline float attn_split_weight(float m, float M) { return m == -INFINITY ? 0.0f : expf(m - M); }
// A weight's kTerms bf16 terms for the tensor-core weighted sum, term 0 the smallest: the weight
// rounded (kTerms 1, AttentionArgs::weights_bf16), or lo, mid, hi (hi its rounding, mid the
// remainder's, lo the rest's: hi + mid + lo is the weight to fp32's precision).
template <int kTerms>
__device__ inline void attn_weight_terms(float w, uint16_t (&t)[kTerms]) {
  static_assert(kTerms == 1 || kTerms == 3, "the weights' terms");
  const __nv_bfloat16 hi = __float2bfloat16_rn(w);
  if constexpr (kTerms == 1) {
    t[0] = __bfloat16_as_ushort(hi);
  } else {
    const float r1 = w - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    t[0] = __bfloat16_as_ushort(__float2bfloat16_rn(r1 - __bfloat162float(mid)));
    t[1] = __bfloat16_as_ushort(mid);
    t[2] = __bfloat16_as_ushort(hi);
  }
}
// Two neighbouring candidates' terms as the 32-bit words of an mma A fragment (w0 low, w1 high).
template <int kTerms>
__device__ inline void attn_weight_terms2(float w0, float w1, uint32_t (&out)[kTerms]) {
  uint16_t t0[kTerms], t1[kTerms];
  attn_weight_terms<kTerms>(w0, t0);
  attn_weight_terms<kTerms>(w1, t1);
#pragma unroll
  for (int term = 0; term < kTerms; ++term) out[term] = static_cast<uint32_t>(t0[term]) | (static_cast<uint32_t>(t1[term]) << 16);
}
__device__ inline float attn_combine_denom(float denom, float ws, float sum) { return __fmaf_rn(ws, sum, denom); }
__device__ inline float attn_combine_term(float acc, float ws, float v) { return __fmaf_rn(ws, v, acc); }

// grid (tokens of the pass * H): M = max(sink, m_s), w_s = exp(m_s - M) (0 for an all-masked split),
// out = sum_s w_s acc_s / (exp(sink - M) + sum_s w_s sum_s), splits in order. With a.mma, tokens
// with at most one split were written by attention_mma_kernel itself. Thread 0 forms the weights
// and the denominator (into shared memory: w[0 .. splits), then the denominator at w[max_splits]);
// up to kCombineSplits splits, a thread's partial sums of its kCombineDims dimensions are all
// loaded before the first is used (the loop form, one dimension's splits at a time behind its
// store, spent 216 us of an 8K CSA prefill's 1,020-token pass waiting on them: ncu, H200
// 2026-12-03), then each dimension's terms added in split order as before: the same bits.
constexpr int kCombineSplits = 4, kCombineDims = 4;
__global__ void attention_combine_kernel(AttentionArgs a, int64_t t_base, int64_t max_splits) {
  wait_previous_grid();
  extern __shared__ float w[];  // [max_splits + 1]
  const int64_t th = blockIdx.x, t = t_base + th / a.H, h = th % a.H;
  const AttnTokenArgs tk = a.tokens[t];
  const int64_t n = tk.n_window + tk.n_compressed;
  const int64_t per = a.mma ? a.mma_split : kAttnSplitCandidates;
  const int64_t splits = (n + per - 1) / per;  // 0 when n is
  if (a.mma && splits <= 1) return;
  const int64_t ld = a.Dh + 2;
  const float* part = a.split_scratch + th * max_splits * ld;
  if (threadIdx.x == 0) {
    const float sink = dev_load(a.sinks, h);
    float M = sink;
    for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, part[s * ld + a.Dh]);
    float denom = expf(sink - M);
    for (int64_t s = 0; s < splits; ++s) {
      const float ws = attn_split_weight(part[s * ld + a.Dh], M);
      denom = attn_combine_denom(denom, ws, part[s * ld + a.Dh + 1]);
      w[s] = ws;
    }
    w[max_splits] = denom;
  }
  const auto store = [&](int64_t d, float acc, float denom) {
    a.out[(t * a.H + h) * a.Dh + d] = a.round_bf16 ? dev_bf16_round(acc / denom) : acc / denom;
  };
  if (splits <= kCombineSplits && a.Dh <= kCombineDims * static_cast<int64_t>(blockDim.x)) {
    float v[kCombineDims][kCombineSplits];
#pragma unroll
    for (int k = 0; k < kCombineDims; ++k) {
      const int64_t d = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
#pragma unroll
      for (int s = 0; s < kCombineSplits; ++s) v[k][s] = s < splits && d < a.Dh ? part[s * ld + d] : 0.0f;
    }
    __syncthreads();
    const float denom = w[max_splits];
#pragma unroll
    for (int k = 0; k < kCombineDims; ++k) {
      const int64_t d = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
      if (d >= a.Dh) break;
      float acc = 0.0f;
#pragma unroll
      for (int s = 0; s < kCombineSplits; ++s)
        if (s < splits) acc = attn_combine_term(acc, w[s], v[k][s]);
      store(d, acc, denom);
    }
    return;
  }
  __syncthreads();
  const float denom = w[max_splits];
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < splits; ++s) acc = attn_combine_term(acc, w[s], part[s * ld + d]);
    store(d, acc, denom);
  }
}

// ---- attention on the bf16 tensor cores (the fast profiles: AttentionArgs::mma) ------------------
//
// q and the keys are bf16 values there, so the logits' products are exact in bf16 mma; the
// softmax is fp32 as in the split kernel (each split's max, exp-sum and weighted keys, combined by
// attention_combine_kernel); the weights p stay fp32 exactly, as the sum of three bf16 terms
// (hi = bf16(p), mid = bf16(p - hi), lo = bf16(p - hi - mid): 24 significant bits), each multiplied
// with the keys on the tensor cores. Only the order of the fp32 sums differs from the CPU.
//
// grid (tokens of the pass * H / 32, splits, 1), block 8 warps: 32 heads of one token over one split
// of a.mma_split candidates (a multiple of 32), taken in chunks of 32 (flash-attention's online softmax
// across the chunks). Shared memory: q [32 heads, Dh] and the chunk's keys [32, Dh] as bf16 (rows
// padded by 16 bytes: ldmatrix's 8 row addresses hit distinct banks), the logits [32, 33], the
// weights' three bf16 terms [3, 32, 32 (+8)], per head the running max, sum and rescale factor.
// Per chunk: the candidates' addresses; the keys staged as bf16 (the state's bf16 copies by
// cp.async into a ring of buffers, attention_mma_stages: 2, or 4 on 16-head blocks, the next
// chunks' while one is used, or the fp32 state
// converted); logits, warp w heads 16 (w / 4) .. + 15 x candidates 8 (w % 4) .. + 7 over
// all of Dh; the softmax step, warp w heads 4 w .. 4 w + 3,
// lane = candidate; the weighted sum, warp w the dims w Dh / 8 .. + Dh / 8 - 1 of all 32 heads
// (64 fp32 accumulators a lane at Dh = 512), V's fragments by ldmatrix.trans of the same keys.
// A split depends only on the token's own candidates: batch invariant. The 16-head blocks from the
// bf16 copies (kOverlap, `attn_overlap`) run the phases in two halves side by side: chunk i + 1's
// logits (and chunk i + 3's copies) on warps 0-3 while warps 4-15 take chunk i's softmax and
// weighted sum; the same operations a head, candidate and dim, so the same bits. The 16-head blocks
// of a call that leaves SMs idle come 2 or 4 to a (token, heads, split) (attention_dim_slices): grid z the
// slice, each block with the whole logits and softmax and the weighted sum of its slice of Dh.
// kTerms = 1 (AttentionArgs::weights_bf16, `--attn-weights bf16`; every block shape,
// 16 or 32 heads, the halves side by side or not, any dim slices: the same bits across them as
// with three terms): each weight as one bf16 term, hi, the exp-sum of the unrounded weights as
// before, a third of the weighted sum's mma. The CPU rounds the same weights, exp(logit - running max)
// over chunks of 32 from the first candidate (a CSA selection's masked slots, -1, keeping their
// places, as here); here a token's later splits (past a.mma_split candidates) start their own
// running max, so the chunks' running maxima, and with them a weight's rounding, may differ from
// the CPU's there.
constexpr int kAmThreads = 256, kAmHeads = 32, kAmChunk = 32;
constexpr int kAmPRow = 2 * kAmChunk + 16;  // bytes of a staged row of weights
static_assert(kAmChunk == 32, "the softmax step is a lane per candidate");

// Where the kernel's keys come from (AttentionArgs::keys): converted from the fp32 state as they are
// staged (one key buffer); the state's bf16 copies by cp.async into a ring of key buffers
// (attention_mma_stages) while the chunk before is used; the FP8 KV records (core/kv_record.h) by cp.async into one record
// buffer while the chunk before is used, decoded into the one key buffer at the chunk's start.
enum AmKeys : int { kAmKeysF32 = 0, kAmKeysBf16 = 1, kAmKeysRecord = 2 };

// The key buffers of the bf16 copies' ring: 4 on blocks of 16 heads (the decode batches' form, one
// block an SM: three chunks' copies in flight under a chunk's work, and the CSA selections read a
// chunk ahead; at batch 1 a CSA token's 20 chunks took 54-56 us with 2, 48-50 with 4, `ncu`, H200
// 2026-12-04), else 2 (two blocks an SM; the selections read ahead there spilled 80 bytes). The
// other key sources: one buffer. The same bits at any depth.
__host__ __device__ constexpr int attention_mma_stages(int keys, int64_t heads) {
  return keys == kAmKeysBf16 ? (heads == 16 ? 4 : 2) : 1;
}
// The candidates' address buffers (kptr0): one a key buffer, at least two (the records' chunk
// pointers are double-buffered).
__host__ __device__ constexpr int attention_mma_ptr_bufs(int keys, int64_t heads) {
  return attention_mma_stages(keys, heads) > 2 ? attention_mma_stages(keys, heads) : 2;
}
size_t attention_mma_smem(int64_t Dh, int keys, int64_t rec_bytes, int64_t heads = kAmHeads, bool overlap = false) {
  const size_t rowb = static_cast<size_t>(2 * Dh + 16), stages = static_cast<size_t>(attention_mma_stages(keys, heads));
  const size_t records = keys == kAmKeysRecord ? static_cast<size_t>(kAmChunk * rec_bytes + 15) / 16 * 16 : 0;
  return (heads + stages * kAmChunk) * rowb + records + sizeof(float) * heads * (kAmChunk + 1) * (overlap ? 2 : 1) + 3 * heads * kAmPRow +
         3 * heads * sizeof(float) + static_cast<size_t>(attention_mma_ptr_bufs(keys, heads)) * kAmChunk * sizeof(void*);
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// AttentionArgs::q_prep: a warp's kHeadsW heads (rows of q from `q`, Dh apart) normalised and
// rotated into the staged rows as bf16: put(head of the warp's, element, its bf16 bits). Lane l holds elements l, l + 32,
// ... of a head and sums their squares in that order, then warp_sum: rms_norm_warp_kernel's sums
// (and its register form's); each value times 1 / sqrtf(sum / Dh + eps), rounded to bf16 when
// round_bf16, as rms_norm_write; the last 2 pairs dims rotated pair by pair (the even element's
// lane and its neighbour: a pair never straddles two lanes' chunks) with rope_kernel's fp64 angles
// and rotation (the token's angles computed once into `ang`, shared memory), rounded again when
// round_bf16; then to bf16 as the staging loop converts. Every thread of the block calls it.
// kDepth heads' loads in flight (a ring of register sets; the heads' loop unrolled by kDepth, rolled
// over groups of kDepth heads: 8 heads unrolled thrashed the instruction cache, the prologue 3.7 ms
// of a 7.5 ms kernel): the same operations on each head. Only the last 2 kMaxRopePairs dims can be
// rotated (a RopeTableArg holds no more pairs), so the other chunks carry no rotation code.
template <int Dh, int kHeadsW, int kDepth = 1, class Put>
__device__ inline void attention_mma_q_prep(const AttentionArgs& a, const float* q, double pos, double* ang, Put put, int lane) {
  constexpr int kU = Dh / 32;
  constexpr int kRopeMax = 2 * kMaxRopePairs;  // (RopeTableArg's bound: rope_arg checks it)
  constexpr int kRopeU0 = kU - (kRopeMax < Dh ? kRopeMax : Dh) / 32;  // the first chunk that may rotate
  static_assert(kRopeMax % 32 == 0, "whole chunks rotate");
  static_assert(kDepth >= 1 && kHeadsW % kDepth == 0, "heads in flight: groups of kDepth");
  const int pairs = a.q_rope.pairs, rope0 = Dh - 2 * pairs;
  const int warp = threadIdx.x / 32;
  // (kDepth 1: a head's loads at a time, since two heads' in flight spilled at 128 registers in
  // attention_mma_kernel.) The first heads' loads are issued before the token's angles
  // (rope_kernel's, into `ang`: cosines, then sines) are computed.
  float v[kDepth][kU];
  const auto load = [&](int slot, int hw) {
#pragma unroll
    for (int u = 0; u < kU; ++u) v[slot][u] = q[static_cast<int64_t>(warp * kHeadsW + hw) * Dh + lane + 32 * u];
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d) load(d, d);
  if (threadIdx.x < pairs) rope_angle(pos, a.q_rope, threadIdx.x, false, ang[threadIdx.x], ang[pairs + threadIdx.x]);
  __syncthreads();
#pragma unroll 1
  for (int g = 0; g < kHeadsW; g += kDepth) {
#pragma unroll
    for (int slot = 0; slot < kDepth; ++slot) {
      const int hw = g + slot;
      float ss = 0.0f;
#pragma unroll
      for (int u = 0; u < kU; ++u) ss += v[slot][u] * v[slot][u];
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(Dh) + a.q_eps);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        float y = v[slot][u] * inv;
        const int e = lane + 32 * u;
        // (A value's last rounding to bf16 is the staging's own conversion below: rounding twice to
        // nearest even gives the once-rounded bits, so round_bf16 rounds only the value the
        // rotation takes. y is a product, so a NaN is the canonical one either way.)
        if (u >= kRopeU0 && 32 * u + 32 > rope0) {  // (uniform: the chunk holds rotated dims)
          if (a.round_bf16) y = dev_bf16_round(y);
          const float other = __shfl_xor_sync(0xffffffffu, y, 1);
          if (e >= rope0) {
            const bool even = (e & 1) == 0;
            const int i = (e - rope0) / 2;
            const float2 r =
                even ? rope_rotated(y, other, ang[i], ang[pairs + i]) : rope_rotated(other, y, ang[i], ang[pairs + i]);
            y = even ? r.x : r.y;  // (its rounding, too, is the conversion below)
          }
        }
        put(hw, e, __bfloat16_as_ushort(__float2bfloat16_rn(y)));
      }
      if (hw + kDepth < kHeadsW) load(slot, hw + kDepth);
    }
  }
}

// kKeys: AmKeys, where the keys come from. kHeads (32 or 16) heads a block, kWarps (8 or 16) warps:
// each head's, candidate's and output dimension's arithmetic is the same whatever the two (the same
// mma rows, the same sums in the same order), so the launch picks them by the call's size.
template <int kDh, int kKeys, int kHeads = kAmHeads, int kWarps = kAmThreads / 32, bool kOverlap = false, int kTerms = 3>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 8 ? 2 : 1) attention_mma_kernel(AttentionArgs a, int64_t t_base, int64_t max_splits) {
  wait_previous_grid();
  static_assert((kHeads == 16 || kHeads == 32) && (kWarps == 8 || kWarps == 16), "heads a block and warps");
  constexpr int kH = kHeads, kT = 32 * kWarps, kMt = kHeads / 16;
  static_assert(kDh % (16 * kWarps) == 0, "whole pairs of n8 tiles a warp in the weighted sum");
  extern __shared__ __align__(16) uint8_t am_smem[];
  constexpr bool kBf16Keys = kKeys == kAmKeysBf16, kRecords = kKeys == kAmKeysRecord;
  constexpr int Dh = kDh, rowb = 2 * kDh + 16, kStages = attention_mma_stages(kKeys, kHeads);
  static_assert(!kOverlap || (kBf16Keys && kHeads == 16 && kWarps == 16 && kStages == 4),
                "the two halves side by side: the 16-head form from the bf16 copies");
  static_assert(kTerms == 3 || kTerms == 1, "the weights' terms: 3 (exact), or 1 (AttentionArgs::weights_bf16)");
  // (kOverlap) the logits warps; the other kWarps - kLW take the softmax and the weighted sum.
  constexpr int kLW = 4;
  const int rec_bytes = kRecords ? static_cast<int>(a.rec.bytes) : 0;
  uint8_t* qs = am_smem;
  uint8_t* ks0 = qs + kH * rowb;  // [kStages][kAmChunk rows]
  uint8_t* recs = ks0 + kStages * kAmChunk * rowb;  // [kAmChunk records] (kRecords)
  float* logits = reinterpret_cast<float*>(recs + (kAmChunk * rec_bytes + 15) / 16 * 16);  // [kOverlap ? 2 : 1]
  uint8_t* pw = reinterpret_cast<uint8_t*>(logits + (kOverlap ? 2 : 1) * kH * (kAmChunk + 1));
  float* st_alpha = reinterpret_cast<float*>(pw + 3 * kH * kAmPRow);
  float* st_m = st_alpha + kH;
  float* st_l = st_m + kH;
  const void** kptr0 = reinterpret_cast<const void**>(st_l + kH);  // [attention_mma_ptr_bufs][kAmChunk]

  const SplitBlock blk = split_block(a, t_base, kH);
  const int64_t t = blk.t, h0 = blk.h0, s = blk.s, n = blk.n;
  const AttnTokenArgs& tk = blk.tk;
  const int64_t j_begin = s * a.mma_split;
  if (j_begin >= n) {  // the whole block leaves; a token without candidates gets the combine's 0 / exp(0)
    if (n == 0 && s == 0 && blockIdx.z == 0)
      for (int i = threadIdx.x; i < kH * kDh; i += kT) {
        float v = 0.0f;
        // (o_rope) rope_kernel's rotation of the stored 0, whose sign the cosine's may flip.
        if (const int e = i % kDh, rope0 = kDh - 2 * a.o_rope.pairs; a.o_rope.pairs > 0 && e >= rope0) {
          double c, sn;
          rope_angle(static_cast<double>(tk.pos), a.o_rope, (e - rope0) / 2, true, c, sn);
          const float2 r = rope_rotated(0.0f, 0.0f, c, sn);
          v = (e & 1) ? r.y : r.x;
          if (a.round_bf16) v = dev_bf16_round(v);
        }
        a.out[(t * a.H + h0) * a.Dh + i] = v;
      }
    return;
  }
  const int64_t j_end = n - j_begin < a.mma_split ? n : j_begin + a.mma_split;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;

  if (a.q_prep) {
    // The token's angles go in the logits' space, not used before the chunks.
    static_assert(sizeof(float) * kH * (kAmChunk + 1) >= 2 * sizeof(double) * kMaxRopePairs, "the angles fit");
    uint8_t* const dst = qs + warp * (kH / kWarps) * rowb;
    attention_mma_q_prep<Dh, kH / kWarps>(a, a.q + (t * a.H + h0) * a.Dh, static_cast<double>(tk.pos),
                                           reinterpret_cast<double*>(logits),
                                           [&](int hw, int e, uint16_t v) { reinterpret_cast<uint16_t*>(dst + hw * rowb)[e] = v; },
                                           lane);
  } else {
    const float4* qsrc = reinterpret_cast<const float4*>(a.q + (t * a.H + h0) * a.Dh);
    constexpr int row4 = Dh / 4;  // float4s a row
    for (int i = tid; i < kH * row4; i += kT) {
      const float4 v = qsrc[i];
      *reinterpret_cast<uint2*>(qs + (i / row4) * rowb + 8 * (i % row4)) =
          make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
  }
  if (tid < kH) {
    st_m[tid] = -INFINITY;
    st_l[tid] = 0.0f;
  }
  // The weighted sum's dims: pairs of n8 tiles (16 dims), kPairs in all; my_np of them a warp from
  // pair d0 / 16, none on the logits warps (kOverlap). A dim's sums do not depend on the warp or the
  // block that makes them.
  constexpr int kPairs = Dh / 16, kSW = kWarps - kLW;
  constexpr int kPairsMax = kOverlap ? (kPairs + kSW - 1) / kSW : kPairs / kWarps;
  constexpr int kNts = 2 * kPairsMax;  // n8 tiles a warp holds
  // (16-head blocks) the block's slice of the dims (blockIdx.z of gridDim.z, attention_dim_slices): the
  // weighted sum and the stores of pairs [slice kPairs / slices, + kPairs / slices) only; the
  // logits and softmax are the whole token's in every slice's block (the same operations, so the
  // same values), a dim's sums the same whichever block makes them.
  const int slices = kH == 16 ? static_cast<int>(gridDim.z) : 1, slice = kH == 16 ? static_cast<int>(blockIdx.z) : 0;
  // The slice's pairs over the weighted sum's warps (all of them, or (kOverlap) the kWarps - kLW
  // after the logits warps), attention_pv_pairs: with the whole of Dh, Dh / (16 kWarps) each, or
  // (kOverlap, Dh 512) 8 x 3 + 4 x 2.
  // (The 32-head forms keep the counts compile-time constants: a count known only at run time made
  // ptxas spill their accumulators.)
  const int sw = kOverlap ? warp - kLW : warp, nsw = kOverlap ? kSW : kWarps;
  int my_np = kPairs / kWarps, p0 = warp * (kPairs / kWarps);
  if constexpr (kOverlap || kH == 16) attention_pv_pairs(kPairs, slices, slice, sw, nsw, p0, my_np);
  // The softmax's heads: soft_nh from soft_hb a warp; (kOverlap) 16 heads on 12 warps, the first
  // four two each.
  int soft_hb = warp * (kH / kWarps), soft_nh = kH / kWarps;
  if constexpr (kOverlap) {
    static_assert(kH == 16 && kSW == 12, "16 heads on 12 warps");
    soft_hb = sw < 4 ? 2 * sw : 4 + sw;
    soft_nh = sw < 4 ? 2 : 1;
  }
  const int d0 = 16 * p0;
  float acc[kMt][kNts][4] = {};  // [m16 tile of heads][n8 tile of dims][fragment]

  // The 4-stage ring's form (kSelAhead) reads a CSA candidate's selection a chunk before its address
  // is made (into `sel`, by the lane that fills the address: load_sel), so that no chunk waits for
  // that load (in the 2-stage one, the 32-head prefill form, it made ptxas spill 80 bytes).
  constexpr bool kSelAhead = kBf16Keys && kStages > 2;
  int32_t sel = -1;
  const auto load_sel = [&](int64_t c) {
    const int64_t i = c + tid - tk.n_window;
    sel = tid < kAmChunk && a.csa && c + tid < j_end && i >= 0 ? a.selected[t * a.k + i] : -1;
  };
  // The addresses of chunk c's candidates into kptr0[buffer b] (null: masked, or past the split).
  auto fill_ptrs = [&](int64_t c, int b) {
    if (tid < kAmChunk) {
      const int64_t j = c + tid;
      const void* key = nullptr;
      if (j < j_end) {
        if constexpr (kSelAhead)
          key = j < tk.n_window || !a.csa ? candidate_in(a, tk, t, j, tk.ring_bf16, tk.entries_bf16, tk.batch_kv_bf16)
                                          : selected_entry(tk, sel, tk.entries_bf16, a.Dh);
        else if constexpr (kBf16Keys) key = candidate_in(a, tk, t, j, tk.ring_bf16, tk.entries_bf16, tk.batch_kv_bf16);
        else if constexpr (kRecords) key = candidate_record(a, tk, t, j);
        else key = candidate(a, tk, t, j);
      }
      kptr0[b * kAmChunk + tid] = key;
    }
  };
  constexpr int kPieces = Dh / 8;  // 16-byte pieces of 8 dims a key row
  // The bf16 copies of those keys into key buffer b by cp.async, 8 pieces a thread (a masked
  // candidate's row zero-filled); one commit group.
  auto issue = [&](int b, int from = -1, int threads = 0) {  // (from / threads: all threads by default)
    for (int i = from < 0 ? tid : from; i < kAmChunk * kPieces; i += threads > 0 ? threads : kT) {
      const void* row = kptr0[b * kAmChunk + i / kPieces];
      cp_async(ks0 + (b * kAmChunk + i / kPieces) * rowb + 16 * (i % kPieces),
               row ? static_cast<const void*>(static_cast<const uint4*>(row) + i % kPieces) : static_cast<const void*>(a.q),
               row != nullptr, 16);
    }
    cp_async_commit();
  };
  // The records of chunk pointers b into the record buffer by cp.async, 8 bytes a copy (records are
  // 8-byte multiples; a masked candidate's zero-filled, which decodes to zeros); one commit group.
  auto issue_records = [&](int b) {
    const int pieces = kRecords ? rec_bytes / 8 : 1;  // (only kRecords calls it)
    for (int i = tid; i < kAmChunk * pieces; i += kT) {
      const int r = i / pieces, piece = i % pieces;
      const void* rec = kptr0[b * kAmChunk + r];
      cp_async(recs + r * rec_bytes + 8 * piece,
               rec ? static_cast<const void*>(static_cast<const uint8_t*>(rec) + 8 * piece) : static_cast<const void*>(a.q),
               rec != nullptr, 8);
    }
    cp_async_commit();
  };
  // The bf16 copies: chunks 0 .. kStages - 2 of the split copied in first (a commit group each,
  // empty past the split's end), and the selections of the next chunk read. (kOverlap: chunks 0 and
  // 1, copied by the logits warps; the loop's first round copies chunk 2.)
  if constexpr (kOverlap) {
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      load_sel(j_begin + st * kAmChunk);
      fill_ptrs(j_begin + st * kAmChunk, st);
    }
    load_sel(j_begin + 2 * kAmChunk);
    __syncthreads();
    if (warp < kLW) {
      issue(0, tid, 32 * kLW);
      issue(1, tid, 32 * kLW);
    }
  } else if constexpr (kBf16Keys) {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if constexpr (kSelAhead) load_sel(j_begin + st * kAmChunk);
      fill_ptrs(j_begin + st * kAmChunk, st);
    }
    if constexpr (kSelAhead) load_sel(j_begin + (kStages - 1) * kAmChunk);
    __syncthreads();
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) issue(st);
  } else if constexpr (kRecords) {
    fill_ptrs(j_begin, 0);
    __syncthreads();
    issue_records(0);
  }
  // Logits of heads 16 mt + (0..15) and candidates 8 nt + (0..7) of the chunk whose keys are ks
  // and addresses kptr (null: masked) into lg, by the logits warp w (0 .. 4 kMt - 1).
  const auto logits_of = [&](const uint8_t* ks, const void* const* kptr, float* lg, int w) {
    const int mt = w / 4, nt = w % 4;
    const uint8_t* arow = qs + (16 * mt + (lane % 8) + 8 * ((lane / 8) % 2)) * rowb + 16 * (lane / 16);
    const uint8_t* brow = ks + (8 * nt + (lane % 8)) * rowb + 16 * ((lane / 8) % 2);
    // Two independent sums (even and odd k-steps of 16 dims) halve the chain of dependent mma.
    // The fragments of step s + kAhead are loaded before step s's mma (a ring of kAhead + 1
    // register sets, the loop unrolled so that each set is named): the shared-memory latency
    // runs under the tensor work (`ldmatrix` results used at once held the 8K prefill's launch
    // on its short scoreboard, 3.9 cycles an instruction; ncu, H200 2026-12-04). The same mma
    // in the same order on each sum: the same bits.
    // (One step ahead where the keys are converted from the fp32 state: two spilled there.)
    constexpr int kSteps = Dh / 16, kAhead = kKeys == kAmKeysF32 ? 1 : 2;
    float d[2][4] = {};
    uint32_t af[kAhead + 1][4], bf[kAhead + 1][2];
#pragma unroll
    for (int p = 0; p < kAhead; ++p) {
      ldmatrix_x4(af[p], arow + 2 * 16 * p);
      ldmatrix_x2(bf[p], brow + 2 * 16 * p);
    }
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if (st + kAhead < kSteps) {
        ldmatrix_x4(af[(st + kAhead) % (kAhead + 1)], arow + 2 * 16 * (st + kAhead));
        ldmatrix_x2(bf[(st + kAhead) % (kAhead + 1)], brow + 2 * 16 * (st + kAhead));
      }
      const int b = st % (kAhead + 1);
      mma_bf16_m16n8k16(d[st % 2], af[b], bf[b][0], bf[b][1]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int h = 16 * mt + gid + 8 * (c / 2), j = 8 * nt + 2 * tig + c % 2;
      lg[h * (kAmChunk + 1) + j] = kptr[j] ? (d[0][c] + d[1][c]) * a.scale : -INFINITY;
    }
  };
  // Online softmax of the chunk's logits lg: heads hb .. hb + nh - 1 (nh <= kHw) a warp, lane =
  // candidate. The heads side by side: each step (the max's shuffles, the exps, the sum's shuffles)
  // taken for all of them before the next, so their dependent shuffle chains overlap; each head's
  // operations and their order are the one-head loop's (the same bits; a slot past nh repeats head
  // hb and writes nothing). The stats are rewritten by lane 0 after every lane has read them (the
  // __syncwarp).
  const auto softmax_of = [&](const float* lg, int hb, int nh) {
    constexpr int kHw = kOverlap ? 2 : kH / kWarps;
    float v[kHw], m_old[kHw], mx[kHw], p[kHw], alpha[kHw], sum[kHw];
#pragma unroll
    for (int hh = 0; hh < kHw; ++hh) {
      const int h = hb + (hh < nh ? hh : 0);
      v[hh] = lg[h * (kAmChunk + 1) + lane];
      m_old[hh] = st_m[h];
      mx[hh] = v[hh];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int hh = 0; hh < kHw; ++hh) mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], o));  // (warp_max)
#pragma unroll
    for (int hh = 0; hh < kHw; ++hh) {
      const float m_new = fmaxf(m_old[hh], mx[hh]);
      mx[hh] = m_new;
      p[hh] = 0.0f, alpha[hh] = 1.0f;
      if (m_new != -INFINITY) {  // the same for the whole warp
        p[hh] = v[hh] == -INFINITY ? 0.0f : expf(v[hh] - m_new);
        alpha[hh] = m_old[hh] == -INFINITY ? 0.0f : expf(m_old[hh] - m_new);
      }
      sum[hh] = p[hh];
    }
    // The exp-sum of each half of the chunk (candidates 0..15, 16..31: lanes 8, 4, 2, 1 apart),
    // then the halves added: attention_wg_kernel's order, where a warpgroup sums one half.
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
      for (int hh = 0; hh < kHw; ++hh) sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], o);
#pragma unroll
    for (int hh = 0; hh < kHw; ++hh) sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 16);
#pragma unroll
    for (int hh = 0; hh < kHw; ++hh) {
      if (hh >= nh) continue;
      const int h = hb + hh;
      // (AttentionArgs::weights_bf16, kTerms 1: the weight rounded, the sum above not.)
      uint16_t terms[kTerms];
      attn_weight_terms<kTerms>(p[hh], terms);
#pragma unroll
      for (int term = 0; term < kTerms; ++term) *reinterpret_cast<uint16_t*>(pw + (term * kH + h) * kAmPRow + 2 * lane) = terms[term];
    }
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int hh = 0; hh < kHw; ++hh) {
        if (hh >= nh) continue;
        const int h = hb + hh;
        st_alpha[h] = alpha[hh];
        st_m[h] = mx[hh];
        st_l[h] = st_l[h] * alpha[hh] + sum[hh];
      }
    }
  };
  // Weighted sum of the chunk whose keys are ks: this warp's accumulators (my_np pairs of n8 tiles
  // from dim d0) rescaled to the new max, then + p V for the chunk (the terms small to large).
  const auto pv_of = [&](const uint8_t* ks) {
    if constexpr (kOverlap || kH == 16)
      if (my_np == 0) return;  // (a warp without dims in this block's slice)
    float al[kMt][2];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) al[mt][h] = st_alpha[16 * mt + gid + 8 * h];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNts; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] *= al[mt][c / 2];
#pragma unroll
    for (int kk = 0; kk < kAmChunk; kk += 16) {
      uint32_t pa[kTerms][kMt][4];
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
          ldmatrix_x4(pa[term][mt], pw + (term * kH + 16 * mt + (lane % 8) + 8 * ((lane / 8) % 2)) * kAmPRow +
                                        2 * (kk + 8 * (lane / 16)));
#pragma unroll
      for (int np = 0; np < kPairsMax; ++np) {
        if (np >= my_np) break;
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, ks + (kk + (lane % 8) + 8 * ((lane / 8) % 2)) * rowb + 2 * (d0 + 16 * np + 8 * (lane / 16)));
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
          for (int term = 0; term < kTerms; ++term) {
            mma_bf16_m16n8k16(acc[mt][2 * np], pa[term][mt], vb[0], vb[1]);
            mma_bf16_m16n8k16(acc[mt][2 * np + 1], pa[term][mt], vb[2], vb[3]);
          }
      }
    }
  };
  if constexpr (kOverlap) {
    // The two halves side by side (kOverlap): iteration i, the logits warps (0 .. kLW - 1) give chunk
    // i + 3 its addresses (warp 0) and copies (cp.async by their 128 threads, into chunk i - 1's
    // buffer, which every warp left before the last block barrier), wait for chunk i + 1's keys and
    // make its logits into the other logits buffer; the other warps take chunk i's softmax and
    // weighted sum. One block barrier an iteration; each half's own steps behind a named barrier.
    const int64_t chunks = (j_end - j_begin + kAmChunk - 1) / kAmChunk;
    for (int64_t i = -1; i < chunks; ++i) {
      if (warp < kLW) {
        const int64_t ahead = j_begin + (i + 3) * kAmChunk;
        const int ab = static_cast<int>((i + 3) % kStages);
        if (ahead < j_end) {
          fill_ptrs(ahead, ab);
          load_sel(ahead + kAmChunk);
        }
        named_barrier_sync(1, 32 * kLW);  // its addresses written
        if (ahead < j_end) issue(ab, tid, 32 * kLW);
        else cp_async_commit();  // (an empty group: chunk i + 1's stays two groups from the newest)
        cp_async_wait<2>();
        named_barrier_sync(1, 32 * kLW);  // chunk i + 1's keys landed, every logits thread's copies
        if (i + 1 < chunks) {
          const int b = static_cast<int>((i + 1) % kStages);
          logits_of(ks0 + b * kAmChunk * rowb, kptr0 + b * kAmChunk, logits + ((i + 1) & 1) * kH * (kAmChunk + 1), warp);
        }
      } else if (i >= 0) {
        softmax_of(logits + (i & 1) * kH * (kAmChunk + 1), soft_hb, soft_nh);
        named_barrier_sync(2, 32 * (kWarps - kLW));  // every head's weights and stats written
        pv_of(ks0 + static_cast<int>(i % kStages) * kAmChunk * rowb);
      }
      __syncthreads();
    }
  } else {
  int buf = 0;  // the chunk's key buffer (kRecords: its pointer buffer)
  for (int64_t c0 = j_begin; c0 < j_end;
       c0 += kAmChunk, buf = kBf16Keys ? (buf + 1) % kStages : kRecords ? 1 - buf : 0) {
    if constexpr (kRecords) {
      // This chunk's records landed (everyone's copies; everyone is done with the key buffer), then
      // decoded into the key buffer 16 bytes (8 dims) a piece: a nope piece from its 8 codes and
      // its block's scale, code x scale exact in fp32 and in bf16 (the state's bf16 copy's bits); a
      // RoPE piece as stored. Meanwhile the next chunk's addresses; then its records are copied in
      // under this chunk's work.
      const bool more = c0 + kAmChunk < j_end;
      cp_async_wait<0>();
      __syncthreads();
      const int pb = buf;
      if (more) fill_ptrs(c0 + kAmChunk, 1 - pb);
      constexpr int kPieces = Dh / 8;
      for (int i = tid; i < kAmChunk * kPieces; i += kT) {
        const int r = i / kPieces, piece = i % kPieces, d = 8 * piece;
        const uint8_t* rec = recs + r * rec_bytes;
        uint4 v;
        if (d < a.rec.nope) {
          const uint2 codes = *reinterpret_cast<const uint2*>(rec + d);
          const float sc = dev_e8m0(rec[a.rec.scales_at + d / kKvRecordBlock]);
          const uint32_t w[2] = {codes.x, codes.y};
          uint32_t o[4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[h] & 0xffffu), __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[h] >> 16), __NV_E4M3);
            const float2 flo = __half22float2(__half2(lo)), fhi = __half22float2(__half2(hi));
            o[2 * h] = pack_bf16x2(flo.x * sc, flo.y * sc);
            o[2 * h + 1] = pack_bf16x2(fhi.x * sc, fhi.y * sc);
          }
          v = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
          const uint2* rp = reinterpret_cast<const uint2*>(rec + a.rec.rope_at + 2 * (d - a.rec.nope));
          const uint2 lo = rp[0], hi = rp[1];
          v = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
        *reinterpret_cast<uint4*>(ks0 + r * rowb + 16 * piece) = v;
      }
      __syncthreads();  // the keys decoded (the record buffer free), the next addresses written
      if (more) issue_records(1 - pb);
    } else if constexpr (kBf16Keys) {
      // Chunk c0 + kStages - 1's keys copied in under this chunk's work, into the buffer of the
      // chunk before this one; the selections of the chunk after it read.
      const int64_t ahead = c0 + (kStages - 1) * kAmChunk;
      const int ab = (buf + kStages - 1) % kStages;
      const bool more = ahead < j_end;
      if (more) {
        fill_ptrs(ahead, ab);
        if constexpr (kSelAhead) load_sel(ahead + kAmChunk);
      }
      __syncthreads();  // its addresses written; every warp done with the buffer it goes into
      if (more) issue(ab);
      else cp_async_commit();  // (an empty group: this chunk's stays kStages - 1 groups from the newest)
      cp_async_wait<kStages - 1>();
      __syncthreads();  // this chunk's keys landed, everyone's copies
    } else {
      __syncthreads();  // the last chunk's keys and weights are read (and q, the stats staged)
      fill_ptrs(c0, 0);
      __syncthreads();
      // The chunk's keys converted from the fp32 state to bf16 (exact: bf16 values) in 16-byte
      // pieces of 8 dims, two float4 a piece, 4 pieces a thread in flight; a masked row is zero.
      constexpr int total = kAmChunk * kPieces, kU = 4;
      for (int i0 = tid; i0 < total; i0 += kU * kT) {
        uint4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = i0 + u * kT;
          const void* row = i < total ? kptr0[i / kPieces] : nullptr;
          if (!row) {
            v[u] = make_uint4(0u, 0u, 0u, 0u);
          } else {
            const float4 lo = static_cast<const float4*>(row)[2 * (i % kPieces)];
            const float4 hi = static_cast<const float4*>(row)[2 * (i % kPieces) + 1];
            v[u] = make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w), pack_bf16x2(hi.x, hi.y),
                              pack_bf16x2(hi.z, hi.w));
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = i0 + u * kT;
          if (i < total) *reinterpret_cast<uint4*>(ks0 + (i / kPieces) * rowb + 16 * (i % kPieces)) = v[u];
        }
      }
      __syncthreads();
    }
    const uint8_t* ks = ks0 + (kRecords ? 0 : buf) * kAmChunk * rowb;
    const void* const* kptr = kptr0 + buf * kAmChunk;
    if (warp < 4 * kMt) logits_of(ks, kptr, logits, warp);
    __syncthreads();
    softmax_of(logits, warp * (kH / kWarps), kH / kWarps);
    __syncthreads();
    pv_of(ks);
  }
  }  // (the chunk loop of the other forms)
  if (n <= a.mma_split) {
    // The token's only split: attention_combine_kernel's arithmetic for one split, here (no scratch,
    // and the combine skips the token). Per head ws = exp(m - M) and denom = exp(sink - M) + ws l,
    // M = max(sink, m); out = (0 + ws acc) / denom.
    __syncthreads();  // the last chunk's readers of st_alpha are done
    // (o_rope) The token's inverse angles, rope_kernel's (rope_angle), after the denominators in the
    // logits' space, made by the threads after the first kH beside them.
    const int o_pairs = a.o_rope.pairs, o_rope0 = Dh - 2 * o_pairs;
    static_assert(sizeof(float) * kH * (kAmChunk + 1) >= sizeof(float) * 2 * kH + 2 * sizeof(double) * kMaxRopePairs &&
                      kT >= kH + kMaxRopePairs,
                  "the output's angles fit after the denominators, a thread each");
    double* const o_ang = reinterpret_cast<double*>(logits + 2 * kH);  // cosines [kMaxRopePairs], then sines
    if (tid < kH) {
      const float sink = dev_load(a.sinks, h0 + tid), m = st_m[tid];
      const float M = fmaxf(sink, m);
      const float ws = attn_split_weight(m, M);
      st_alpha[tid] = ws;
      logits[tid] = attn_combine_denom(expf(sink - M), ws, st_l[tid]);
    } else if (tid - kH < o_pairs) {
      rope_angle(static_cast<double>(tk.pos), a.o_rope, tid - kH, true, o_ang[tid - kH], o_ang[kMaxRopePairs + tid - kH]);
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNts; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (nt >= 2 * my_np) break;
          const int head = 16 * mt + gid + 8 * h;
          const float ws = st_alpha[head], denom = logits[head];
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            v[c] = attn_combine_term(0.0f, ws, acc[mt][nt][2 * h + c]) / denom;
            if (a.round_bf16) v[c] = dev_bf16_round(v[c]);
          }
          // (o_rope) A pair of rotated dims, (d, d + 1) with d even, rotated back as rope_kernel rotates
          // the stored pair.
          if (const int d = d0 + 8 * nt + 2 * tig; o_pairs > 0 && d >= o_rope0) {
            const int i = (d - o_rope0) / 2;
            const float2 r = rope_rotated(v[0], v[1], o_ang[i], o_ang[kMaxRopePairs + i]);
            v[0] = a.round_bf16 ? dev_bf16_round(r.x) : r.x;
            v[1] = a.round_bf16 ? dev_bf16_round(r.y) : r.y;
          }
          *reinterpret_cast<float2*>(a.out + (t * a.H + h0 + head) * a.Dh + d0 + 8 * nt + 2 * tig) = make_float2(v[0], v[1]);
        }
    return;
  }
  // This split's weighted keys, max and exp-sum per head (attention_combine_kernel's layout).
  const int64_t th0 = (t - t_base) * a.H + h0;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNts; ++nt) {
      if (nt >= 2 * my_np) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = 16 * mt + gid + 8 * h;
        float* out = a.split_scratch + ((th0 + head) * max_splits + s) * (a.Dh + 2) + d0 + 8 * nt + 2 * tig;
        *reinterpret_cast<float2*>(out) = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
  if (tid < kH && slice == 0) {  // (every slice's block has the same stats)
    float* out = a.split_scratch + ((th0 + tid) * max_splits + s) * (a.Dh + 2);
    out[a.Dh] = st_m[tid];
    out[a.Dh + 1] = st_l[tid];
  }
}


// ---- attention on wgmma: 64 heads of a token a block (the tensor-core attention's large calls) ----
//
// attention_mma_kernel's arithmetic on the warpgroup instructions, for every head, candidate and
// output dim the same operations in the same order, so the same bits (the tests compare the forms):
// the logits as two sums of bf16 products (the even and the odd k16 steps of Dh, each in order from
// zero) added and scaled; the softmax in chunks of 32 candidates (a chunk's max; the weights
// exp(logit - running max); their sum as each half's (candidates 0..15, 16..31) in a butterfly's
// order, the halves then added; the running sum l alpha + sum); the weights as three bf16 terms (or
// one: kTerms, one under bf16 weights);
// the weighted sum rescaled by alpha, then per k16 step of the chunk the terms small to large.
//
// grid (tokens of the pass * H / 64, splits), 2 warpgroups: 64 heads of one token over one split
// (wgmma's M = the heads). Shared memory (from a 1024-byte boundary): q [64 heads, Dh] and a ring of
// kAwStages chunks' keys [32, Dh], both bf16 in 64-dim atoms of 128-byte rows with the 128-byte
// swizzle (the layout both wgmma operands read: q and the keys K-major for the logits, the same key
// bytes MN-major as V for the weighted sum); the logits' exchange [2][64][kAwXRow] fp32; the
// candidates' addresses [kAwPtrBufs][32]; the token's RoPE angles (q_prep). Per chunk: warpgroup g
// makes the logits' sum of the k16 steps g, g + 2, ... (wgmma m64n32k16, both operands in shared
// memory), the two swap them through shared memory, and each then holds the whole logits of its 64
// heads x 32 candidates: the chunk's max (a row's 32 candidates on a quad of lanes), then the
// weights, their terms and their sum for the candidates of its own k16 step only (half the chunk),
// the terms as wgmma's A fragments in registers; the halves' fragments and sums are swapped through
// shared memory (the running max and sum in registers, the same in both); warpgroup g then adds the chunk's weighted keys into its half of Dh (wgmma m64nNk16,
// N = 128 or Dh / 2, V from the key buffer). The next chunks' keys are copied in by cp.async under
// the work (a ring of kAwStages, kAwStages - 1 chunks ahead).
constexpr int kAwHeads = 64, kAwThreads = 256, kAwStages = 3, kAwPtrBufs = kAwStages + 1;
constexpr int kAwXRow = kAmChunk + 8;  // floats a row of the logits' exchange (padded against bank conflicts)
// 32-bit words a thread in the weights' exchange: 4 fragment registers a term (up to three) and two
// half sums, padded to 80 bytes (a quarter warp's 16-byte stores then hit distinct banks).
constexpr int kAwPx = 20;

// The pair form (kPair): a ring of kAwPairStages chunks' keys, kAwPairPtrBufs chunks' addresses;
// the exchange a thread writes: its chunk's weights' fragments (kTerms terms of two k16 steps, 4
// registers each), its chunk's two exp-sums and its two chunk maxima (kAwPairPx(kTerms) words:
// 48 or 112 bytes, so a quarter warp's 16-byte stores hit distinct banks).
constexpr int kAwPairStages = 4, kAwPairPtrBufs = 8;
template <int kTerms>
constexpr int kAwPairPx = 8 * kTerms + 4;

size_t attention_wg_smem(int64_t Dh, bool pair, int terms) {
  const int64_t q = Dh / 64 * kAwHeads * 128, keys = Dh / 64 * kAmChunk * 128;
  if (pair)
    return static_cast<size_t>(1024 + q + kAwPairStages * keys) + 2 * 128 * (terms == 1 ? kAwPairPx<1> : kAwPairPx<3>) * sizeof(uint32_t) +
           128 * sizeof(float2) + kAwPairPtrBufs * kAmChunk * sizeof(void*) + 2 * kMaxRopePairs * sizeof(double) +
           kAwPairPtrBufs * sizeof(uint32_t);
  return static_cast<size_t>(1024 + q + kAwStages * keys) + 4 * kAwHeads * kAwXRow * sizeof(float) +
         kAwPtrBufs * kAmChunk * sizeof(void*) + 2 * kMaxRopePairs * sizeof(double) + (kAwPtrBufs + 3) / 4 * 4 * sizeof(uint32_t) +
         2 * 128 * kAwPx * sizeof(uint32_t);
}
// The byte of (row r, dim d) in rows of 128 bytes cut into 64-dim atoms `sub` bytes apart (the
// 128-byte swizzle: 16-byte piece p of row r at p ^ (r % 8)).
__device__ inline int aw_at(int r, int d, int sub) {
  return (d / 64) * sub + r * 128 + ((((d % 64) / 8) ^ (r % 8)) << 4) + (d % 8) * 2;
}
__device__ inline void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " SPARROW_WGMMA_P16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : SPARROW_WGMMA_D16
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
// A from registers (a row's k16 fragment as mma.m16n8k16's), B MN-major.
template <int kN>
__device__ inline void wgmma_bf16_rs_mn(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc) {
  if constexpr (kN == 128)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SPARROW_WGMMA_P64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : SPARROW_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SPARROW_WGMMA_P32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : SPARROW_WGMMA_D32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <int kDh, int kTerms = 3, bool kAhead = false, bool kPair = false>
__global__ void __launch_bounds__(kAwThreads, 1) attention_wg_kernel(AttentionArgs a, int64_t t_base, int64_t max_splits) {
  wait_previous_grid();
  static_assert(kDh == 128 || kDh == 256 || kDh == 512, "Dh");
  static_assert(kTerms == 3 || kTerms == 1, "the weights' terms");
  static_assert(!(kAhead && kPair), "the pair form has no logits-ahead variant");
  constexpr int kQSub = kAwHeads * 128, kKSub = kAmChunk * 128;  // bytes of a 64-dim atom column of q, of a chunk
  constexpr int kKBytes = kDh / 64 * kKSub;
  constexpr int kSteps = kDh / 16;                        // the logits' k16 steps
  constexpr int kWgDims = kDh / 2;                        // the weighted sum's dims a warpgroup
  constexpr int kN = kWgDims < 128 ? kWgDims : 128, kNi = kWgDims / kN;  // its wgmma's N, and instructions a step
  constexpr int kPieces = kDh / 8;                        // 16-byte pieces of a key row
  constexpr int kStages = kPair ? kAwPairStages : kAwStages, kPtrBufs = kPair ? kAwPairPtrBufs : kAwPtrBufs;
  extern __shared__ __align__(16) uint8_t aw_raw[];
  uint8_t* qs = smem_align_1024(aw_raw);
  uint8_t* ks0 = qs + kDh / 64 * kQSub;  // [kStages][kKBytes]
  // The other forms: the logits' exchange [2][2][64][kAwXRow] and the weights' [2][128][kAwPx];
  // the pair form: the weights' exchange [2][128][kAwPairPx] and the first chunk's maxima [128].
  float* xch = reinterpret_cast<float*>(ks0 + kStages * kKBytes);
  uint32_t* pair_x = reinterpret_cast<uint32_t*>(xch);
  float2* pair_mx = reinterpret_cast<float2*>(pair_x + 2 * 128 * kAwPairPx<kTerms>);
  const void** kptr0 = kPair ? reinterpret_cast<const void**>(pair_mx + 128)
                             : reinterpret_cast<const void**>(xch + 4 * kAwHeads * kAwXRow);  // [kPtrBufs][kAmChunk]
  double* ang = reinterpret_cast<double*>(kptr0 + kPtrBufs * kAmChunk);          // [2 kMaxRopePairs]
  uint32_t* kmask = reinterpret_cast<uint32_t*>(ang + 2 * kMaxRopePairs);         // [kPtrBufs]
  uint32_t* pxch = kmask + (kPtrBufs + 3) / 4 * 4;  // [2][128][kAwPx] (the other forms)

  const SplitBlock blk = split_block(a, t_base, kAwHeads);
  const int64_t t = blk.t, h0 = blk.h0, s = blk.s, n = blk.n;
  const AttnTokenArgs& tk = blk.tk;
  const int64_t j_begin = s * a.mma_split;
  if (j_begin >= n) {  // as attention_mma_kernel
    if (n == 0 && s == 0)
      for (int i = threadIdx.x; i < kAwHeads * kDh; i += kAwThreads) a.out[(t * a.H + h0) * a.Dh + i] = 0.0f;
    return;
  }
  const int64_t j_end = n - j_begin < a.mma_split ? n : j_begin + a.mma_split;
  const int chunks = static_cast<int>((j_end - j_begin + kAmChunk - 1) / kAmChunk);  // (at most 8192 / 32)
  // (The warpgroup and warp through lane 0, so that the compiler knows them uniform across a warp:
  // the wgmma descriptors and copy addresses made from them then stay in uniform registers.)
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int row0 = 16 * (warp % 4) + gid;  // this thread's heads: row0 and row0 + 8 (of the block's 64)

  if (a.q_prep) {
    attention_mma_q_prep<kDh, kAwHeads / 8, 4>(
        a, a.q + (t * a.H + h0) * a.Dh, static_cast<double>(tk.pos), ang,
        [&](int hw, int e, uint16_t v) { *reinterpret_cast<uint16_t*>(qs + aw_at(8 * warp + hw, e, kQSub)) = v; }, lane);
  } else {
    const float4* qsrc = reinterpret_cast<const float4*>(a.q + (t * a.H + h0) * a.Dh);
    constexpr int row4 = kDh / 4;
    for (int i = tid; i < kAwHeads * row4; i += kAwThreads) {
      const float4 v = qsrc[i];
      *reinterpret_cast<uint2*>(qs + aw_at(i / row4, 4 * (i % row4), kQSub)) =
          make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
  }
  // Chunk c's candidates' addresses (null: masked, or past the split) into address buffer b, and
  // which are not null as the bits of kmask[b].
  // Warp w writes them (warp 0 unless said).
  const auto fill_ptrs = [&](int64_t c, int b, int w = 0) {
    if (warp == w) {
      const int64_t j = c + lane;
      const void* key =
          j < j_end ? static_cast<const void*>(candidate_in(a, tk, t, j, tk.ring_bf16, tk.entries_bf16, tk.batch_kv_bf16))
                    : nullptr;
      kptr0[b * kAmChunk + lane] = key;
      const uint32_t bits = __ballot_sync(0xffffffffu, key != nullptr);
      if (lane == 0) kmask[b] = bits;
    }
  };
  // The bf16 copies of the keys of address buffer pb into key buffer kb (a masked row zero-filled);
  // one group. A thread copies piece cp_p of rows cp_r0 + kRowStep k (k < kCopies).
  constexpr int kRowStep = kAwThreads / kPieces, kCopies = kAmChunk / kRowStep;
  static_assert(kAwThreads % kPieces == 0 && kCopies * kAwThreads == kAmChunk * kPieces, "whole rounds of copies");
  const int cp_p = tid % kPieces, cp_r0 = tid / kPieces;
  const int cp_dst = (cp_p / 8) * kKSub + cp_r0 * 128;
  const auto issue = [&](int kb, int pb) {
    uint8_t* const base = ks0 + kb * kKBytes + cp_dst;
    const void* const* rows = kptr0 + pb * kAmChunk + cp_r0;
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const void* row = rows[k * kRowStep];
      cp_async(base + k * kRowStep * 128 + (((cp_p % 8) ^ ((cp_r0 + k * kRowStep) % 8)) << 4),
               row ? static_cast<const void*>(static_cast<const uint4*>(row) + cp_p) : static_cast<const void*>(a.q),
               row != nullptr, 16);
    }
    cp_async_commit();
  };
  if constexpr (kPair) {
    // Chunks 0..3's addresses (a warp each), then pair 0's copies (one group a chunk).
    fill_ptrs(j_begin + (warp % 4) * kAmChunk, warp % 4, warp < 4 ? warp : -1);
    __syncthreads();
    issue(0, 0);
    if (chunks > 1) issue(1, 1);
  } else if constexpr (!kAhead) {
    // Chunks 0..kAwStages - 1's addresses (a warp each), then the first kAwStages - 1 chunks' copies.
    fill_ptrs(j_begin + warp * kAmChunk, warp, warp < kAwStages ? warp : -1);
    __syncthreads();
#pragma unroll
    for (int st = 0; st < kAwStages - 1; ++st) issue(st, st);
  } else {
#pragma unroll
    for (int st = 0; st < kAwStages - 1; ++st) fill_ptrs(j_begin + st * kAmChunk, st);
    __syncthreads();
#pragma unroll
    for (int st = 0; st < kAwStages - 1; ++st) issue(st, st);
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads row0, row0 + 8
  float acc[kNi][kN / 2];
#pragma unroll
  for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
    for (int r = 0; r < kN / 2; ++r) acc[ni][r] = 0.0f;
  const auto fence_acc = [&] {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
      for (int r = 0; r < kN / 2; ++r) wgmma_fence_operand(acc[ni][r]);
  };
  // The exchange of chunk c: xch + (c % 2) 2 64 kAwXRow, this warpgroup's partial sums at wg 64 kAwXRow
  // (two, so that a warpgroup may write chunk c + 1's before the other has read chunk c's).
  const auto mine = [&](int c) { return xch + ((c % 2) * 2 + wg) * kAwHeads * kAwXRow; };
  const auto theirs = [&](int c) { return xch + ((c % 2) * 2 + 1 - wg) * kAwHeads * kAwXRow; };
  const auto keys_of = [&](int c) { return ks0 + (c % kStages) * kKBytes; };

  // This warpgroup's sum of the logits' k16 steps wg, wg + 2, ... of chunk keys ks, in order from
  // zero, into d (issued and committed; the caller waits).
  const auto qk_issue = [&](float (&d)[16], const uint8_t* ks) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      d[r] = 0.0f;
      wgmma_fence_operand(d[r]);
    }
    wgmma_fence();
    // (The descriptors as a base and the steps' offsets in 16-byte units.)
    const uint64_t qd = wgmma_desc_sw128(qs + wg * 32), kd = wgmma_desc_sw128(ks + wg * 32);
#pragma unroll
    for (int i = 0; i < kSteps / 2; ++i) {
      const int st = 2 * i;  // (+ wg, in the bases)
      wgmma_m64n32k16_bf16(d, qd + static_cast<uint64_t>(((st / 4) * kQSub + (st % 4) * 32) >> 4),
                           kd + static_cast<uint64_t>(((st / 4) * kKSub + (st % 4) * 32) >> 4));
    }
    wgmma_commit();
  };
  // d[4 i + 2 h + e]: head row0 + 8 h, candidate 8 i + 2 tig + e. Into the exchange (the caller's
  // barrier follows), then the logits from it and d (masked: -inf).
  const auto put_partial = [&](const float (&d)[16], int c) {
    float* const x = mine(c);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(x + (row0 + 8 * h) * kAwXRow + 8 * i + 2 * tig) = make_float2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
  };
  const auto logits_from = [&](const float (&d)[16], int c, float (&v)[2][4][2]) {
    const float* const x = theirs(c);
    const uint32_t live = kmask[c % kAwPtrBufs] >> (2 * tig);  // (bit 8 i + e: candidate 8 i + 2 tig + e)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 o = *reinterpret_cast<const float2*>(x + (row0 + 8 * h) * kAwXRow + 8 * i + 2 * tig);
        v[h][i][0] = (live >> (8 * i)) & 1u ? (d[4 * i + 2 * h] + o.x) * a.scale : -INFINITY;
        v[h][i][1] = (live >> (8 * i + 1)) & 1u ? (d[4 * i + 2 * h + 1] + o.y) * a.scale : -INFINITY;
      }
  };
  // The online softmax of both heads (a head's 32 candidates on the quad's 4 lanes): the max over
  // all 32 (both warpgroups hold every logit), the weights and their terms of this warpgroup's k16
  // step only (candidates 16 wg ..: i = 2 wg, 2 wg + 1), their sum in the tree of
  // attention_mma_kernel's half (candidates 8, 4, 2, 1 apart); the terms into pa[term][wg] (wgmma's
  // A fragments) and, with the half's sum, into the exchange for the other warpgroup, whose half
  // comes back after the barrier into pa[term][1 - wg]; the sum is the halves' (the caller's
  // barrier, then take_half).
  const auto softmax = [&](const float (&v)[2][4][2], float (&alpha)[2], uint32_t (&own)[kTerms][4], float (&half)[2],
                           float (&m_new)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = v[h][0][0];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) mx = fmaxf(mx, v[h][i][e]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      m_new[h] = fmaxf(m[h], mx);
      float p[2][2] = {}, al = 1.0f;
      if (m_new[h] != -INFINITY) {  // (the same for the quad)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = wg == 0 ? v[h][ii][e] : v[h][2 + ii][e];  // (selected, not indexed: registers)
            p[ii][e] = x == -INFINITY ? 0.0f : expf(x - m_new[h]);
          }
        al = m[h] == -INFINITY ? 0.0f : expf(m[h] - m_new[h]);
      }
      // The half's tree: candidate bit 3 is ii, bits 2 and 1 tig's (lanes 2 and 1 apart), 0 is e.
      float q2[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) q2[e] = p[0][e] + p[1][e];
#pragma unroll
      for (int e = 0; e < 2; ++e) q2[e] += __shfl_xor_sync(0xffffffffu, q2[e], 2);
#pragma unroll
      for (int e = 0; e < 2; ++e) q2[e] += __shfl_xor_sync(0xffffffffu, q2[e], 1);
      half[h] = q2[0] + q2[1];
      alpha[h] = al;
      // The terms (hi, and mid and lo: attention_mma_kernel's split), term 0 the smallest.
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        // Regs 0 / 1 the candidates 2 tig (+1) of heads row0 / row0 + 8, regs 2 / 3 those + 8.
        uint32_t w[kTerms];
        attn_weight_terms2<kTerms>(p[ii][0], p[ii][1], w);
#pragma unroll
        for (int term = 0; term < kTerms; ++term) own[term][2 * ii + h] = w[term];
      }
    }
    // Into the exchange: this thread's fragments and half sums, at its place in its warpgroup.
    uint32_t* const x = pxch + (wg * 128 + tid % 128) * kAwPx;
#pragma unroll
    for (int term = 0; term < kTerms; ++term)
      *reinterpret_cast<uint4*>(x + 4 * term) = make_uint4(own[term][0], own[term][1], own[term][2], own[term][3]);
    *reinterpret_cast<float2*>(x + 4 * kTerms) = make_float2(half[0], half[1]);
  };
  // After the barrier: pa[term][k16 step] from this warpgroup's fragments (`own`, its step wg) and
  // the other's, the sums (the halves added, low + high) into the running sums and max.
  const auto take_half = [&](uint32_t (&pa)[kTerms][2][4], const uint32_t (&own)[kTerms][4], const float (&half)[2],
                             const float (&alpha)[2], const float (&m_new)[2]) {
    const uint32_t* const x = pxch + ((1 - wg) * 128 + tid % 128) * kAwPx;
#pragma unroll
    for (int term = 0; term < kTerms; ++term) {
      const uint4 f = *reinterpret_cast<const uint4*>(x + 4 * term);
      const uint32_t oth[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // (selected, not indexed by wg: registers)
        pa[term][0][r] = wg == 0 ? own[term][r] : oth[r];
        pa[term][1][r] = wg == 0 ? oth[r] : own[term][r];
      }
    }
    const float2 o = *reinterpret_cast<const float2*>(x + 4 * kTerms);
    const float other[2] = {o.x, o.y};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = wg == 0 ? half[h] + other[h] : other[h] + half[h];
      l[h] = l[h] * alpha[h] + sum;
      m[h] = m_new[h];
    }
  };
  // The weighted sum: rescaled, then per k16 step the terms small to large (V: the key buffer ks read
  // MN-major, this warpgroup's dims from wg kWgDims); issued and committed.
  // (rescale false: every alpha is 1, known to the caller; the code that would rescale is left out,
  // since the sums may still be in flight.)
  const auto pv_issue = [&](const uint8_t* ks, const float (&alpha)[2], const uint32_t (&pa)[kTerms][2][4],
                            auto rescale) {
    // (A warp whose rows all keep their max skips the products by 1: the same values.)
    if constexpr (decltype(rescale)::value) {
      if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
          for (int r = 0; r < kN / 2; ++r) acc[ni][r] *= alpha[(r / 2) % 2];
      }
    }
    fence_acc();
    // (A's fragments made before the fence, not between the chain's wgmma.)
    uint32_t fa[kTerms][2][4];
#pragma unroll
    for (int term = 0; term < kTerms; ++term)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          fa[term][kk][r] = pa[term][kk][r];
          wgmma_fence_operand(fa[term][kk][r]);
        }
    wgmma_fence();
    const uint64_t vd = wgmma_desc_sw128_mn(ks + wg * (kWgDims / 64) * kKSub, kKSub);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni)
          wgmma_bf16_rs_mn<kN>(acc[ni], fa[term][kk], vd + static_cast<uint64_t>(((ni * kN / 64) * kKSub + 16 * kk * 128) >> 4));
    wgmma_commit();
  };
  const auto fence_all = [&](float (&d)[16]) {
#pragma unroll
    for (int r = 0; r < 16; ++r) wgmma_fence_operand(d[r]);
    fence_acc();
  };

  if constexpr (kPair) {
    // Two chunks a round, 2i and 2i + 1: warpgroup g makes the whole logits of chunk 2i + g (both
    // of the sums above, the even and the odd k16 steps, as two chains), their max, weights, terms
    // and exp-sum; warpgroup 1 takes chunk 2i's maxima first (a one-way barrier), since its weights
    // are relative to the max after both. The softmax's state after each chunk is made in both
    // warpgroups from the same values, and the weighted sum adds chunk 2i then chunk 2i + 1 (each
    // rescaled first), so every operation is the chunk-a-round form's: the same bits.
    // (The rescale from max m_old to m_new: 1 while every logit so far is masked.)
    const auto step_alpha = [](float m_old, float m_new) { return m_new == -INFINITY ? 1.0f : attn_split_weight(m_old, m_new); };
    constexpr int kPx = kAwPairPx<kTerms>;
    const int pairs = (chunks + 1) / 2;
    // Pair i - 1's weights, rescales and flags, carried into round i, whose start issues their
    // weighted sums (after the last pair, the loop's exit). Issued there rather than at the end of
    // round i - 1, the same point in the instruction stream, no wgmma is in flight across the loop's
    // back-edge: with one in flight there, ptxas kept the descriptors in ordinary registers and
    // moved them to uniform ones before each wgmma (98 R2UR in the kernel, 13 so, 11 with the sums
    // waited for in their own round; 10.9 % more instructions executed; sixty-first and sixty-second
    // sessions, bench/sass_ops.py).
    uint32_t pa[kTerms][2][4], pb[kTerms][2][4];
    float al_a[2], al_b[2];
    bool prev_b = false, prev_keeps = false;
    for (int i = 0;; ++i) {
      if (i > 0) {
        pv_issue(keys_of(2 * i - 2), al_a, pa, std::true_type{});
        if (prev_b) {
          if (prev_keeps) {
            pv_issue(keys_of(2 * i - 1), al_b, pb, std::false_type{});
          } else {  // (its rescaling needs chunk 2i - 2's sums)
            wgmma_wait<0>();
            fence_acc();
            pv_issue(keys_of(2 * i - 1), al_b, pb, std::true_type{});
          }
        }
      }
      if (i == pairs) break;
      const int ca = 2 * i, cb = ca + 1, own_c = ca + wg;
      const bool has_b = cb < chunks, have = own_c < chunks;
      // Pair i's keys landed (the only copies in flight), everyone's, and visible to the tensor
      // cores; every thread done with pair i - 1's exchange. Pair i - 1's weighted sums may still
      // be in flight (they read its key buffers, so pair i + 1's copies wait for the barrier after
      // both warpgroups' waits below); this round's logits queue behind them.
      cp_async_wait<0>();
      fence_proxy_async_smem();
      __syncthreads();
      float de[16], dd[16];  // the even and the odd k16 steps' sums
      if (have) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          de[r] = 0.0f;
          dd[r] = 0.0f;
          wgmma_fence_operand(de[r]);
          wgmma_fence_operand(dd[r]);
        }
        wgmma_fence();
        const uint64_t qd = wgmma_desc_sw128(qs), kd = wgmma_desc_sw128(keys_of(own_c));
#pragma unroll
        for (int st = 0; st < kSteps; st += 2) {
          const auto at = [](int s, int sub) { return static_cast<uint64_t>(((s / 4) * sub + (s % 4) * 32) >> 4); };
          wgmma_m64n32k16_bf16(de, qd + at(st, kQSub), kd + at(st, kKSub));
          wgmma_m64n32k16_bf16(dd, qd + at(st + 1, kQSub), kd + at(st + 1, kKSub));
        }
        wgmma_commit();
      }
      // Pair i + 2's addresses (warps 0 and 1), under the products.
      if (ca + 4 < chunks) fill_ptrs(j_begin + int64_t{ca + 4} * kAmChunk, (ca + 4) % kPtrBufs, 0);
      if (ca + 5 < chunks) fill_ptrs(j_begin + int64_t{ca + 5} * kAmChunk, (ca + 5) % kPtrBufs, 1);
      // v[h][i][e]: head row0 + 8 h, candidate 8 i + 2 tig + e of chunk own_c (masked: -inf);
      // mx its max over the chunk (a head's 32 candidates on the quad).
      float v[2][4][2], mx[2] = {-INFINITY, -INFINITY};
      // (The wait also ends pair i - 1's weighted sums: wgmma groups complete in order.)
      wgmma_wait<0>();
      fence_acc();
      if (have) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          wgmma_fence_operand(de[r]);
          wgmma_fence_operand(dd[r]);
        }
        const uint32_t live = kmask[own_c % kPtrBufs] >> (2 * tig);
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              v[h][k][e] = (live >> (8 * k + e)) & 1u ? (de[4 * k + 2 * h + e] + dd[4 * k + 2 * h + e]) * a.scale : -INFINITY;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float x = v[h][0][0];
#pragma unroll
          for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int e = 0; e < 2; ++e) x = fmaxf(x, v[h][k][e]);
          x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
          mx[h] = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        }
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int h = 0; h < 2; ++h) v[h][k][0] = v[h][k][1] = -INFINITY;
      }
      // The max after chunk 2i (m_a) and, in warpgroup 1, after chunk 2i + 1 (m_b).
      float m_a[2], m_b[2];
      if (wg == 0) {
        pair_mx[tid] = make_float2(mx[0], mx[1]);
        named_barrier_arrive(1, kAwThreads);
#pragma unroll
        for (int h = 0; h < 2; ++h) m_a[h] = m_b[h] = fmaxf(m[h], mx[h]);  // (m_b: set from the exchange below)
      } else {
        named_barrier_sync(1, kAwThreads);
        const float2 o = pair_mx[tid - 128];
        m_a[0] = fmaxf(m[0], o.x);
        m_a[1] = fmaxf(m[1], o.y);
#pragma unroll
        for (int h = 0; h < 2; ++h) m_b[h] = fmaxf(m_a[h], mx[h]);
      }
      // This chunk's weights against its max (m_a in warpgroup 0, m_b in 1), their terms as wgmma's A
      // fragments (own[term][k16 step][reg]), and their sum in the tree of the other forms' halves.
      uint32_t own[kTerms][2][4];
      float sum[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mref = wg == 0 ? m_a[h] : m_b[h];
        float p[4][2];
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            p[k][e] = mref == -INFINITY || v[h][k][e] == -INFINITY ? 0.0f : expf(v[h][k][e] - mref);
        float half[2];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          float q2[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) q2[e] = p[2 * kk][e] + p[2 * kk + 1][e];
#pragma unroll
          for (int e = 0; e < 2; ++e) q2[e] += __shfl_xor_sync(0xffffffffu, q2[e], 2);
#pragma unroll
          for (int e = 0; e < 2; ++e) q2[e] += __shfl_xor_sync(0xffffffffu, q2[e], 1);
          half[kk] = q2[0] + q2[1];
        }
        sum[h] = half[0] + half[1];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int ii = 0; ii < 2; ++ii) {
            uint32_t w[kTerms];
            attn_weight_terms2<kTerms>(p[2 * kk + ii][0], p[2 * kk + ii][1], w);
#pragma unroll
            for (int term = 0; term < kTerms; ++term) own[term][kk][2 * ii + h] = w[term];
          }
      }
      {
        uint32_t* const x = pair_x + (wg * 128 + tid % 128) * kPx;
#pragma unroll
        for (int term = 0; term < kTerms; ++term)
#pragma unroll
          for (int kk = 0; kk < 2; ++kk)
            *reinterpret_cast<uint4*>(x + 8 * term + 4 * kk) =
                make_uint4(own[term][kk][0], own[term][kk][1], own[term][kk][2], own[term][kk][3]);
        *reinterpret_cast<float4*>(x + 8 * kTerms) = make_float4(sum[0], sum[1], mx[0], mx[1]);
      }
      // Every weight and sum written; whether every head keeps its max over chunk 2i + 1 (warpgroup
      // 1 knows: then its weighted sum follows chunk 2i's without a wait).
      // (Both warpgroups past their waits: pair i - 1's key buffers are free for pair i + 1's
      // copies, whose addresses were written a round before.)
      const bool b_keeps =
          __syncthreads_and(wg == 0 || (step_alpha(m_a[0], m_b[0]) == 1.0f && step_alpha(m_a[1], m_b[1]) == 1.0f)) != 0;
      if (ca + 2 < chunks) issue((ca + 2) % kStages, (ca + 2) % kPtrBufs);
      if (ca + 3 < chunks) issue((ca + 3) % kStages, (ca + 3) % kPtrBufs);
      const uint32_t* const xo = pair_x + ((1 - wg) * 128 + tid % 128) * kPx;
      uint32_t other[kTerms][2][4];
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const uint4 f = *reinterpret_cast<const uint4*>(xo + 8 * term + 4 * kk);
          other[term][kk][0] = f.x;
          other[term][kk][1] = f.y;
          other[term][kk][2] = f.z;
          other[term][kk][3] = f.w;
        }
      const float4 so = *reinterpret_cast<const float4*>(xo + 8 * kTerms);
      if (wg == 0) {  // chunk 2i + 1's maxima from warpgroup 1
        m_b[0] = fmaxf(m_a[0], so.z);
        m_b[1] = fmaxf(m_a[1], so.w);
      }
      const float sum_a[2] = {wg == 0 ? sum[0] : so.x, wg == 0 ? sum[1] : so.y};
      const float sum_b[2] = {wg == 0 ? so.x : sum[0], wg == 0 ? so.y : sum[1]};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        al_a[h] = step_alpha(m[h], m_a[h]);
        al_b[h] = step_alpha(m_a[h], m_b[h]);
        l[h] = l[h] * al_a[h] + sum_a[h];
        l[h] = l[h] * al_b[h] + sum_b[h];
        m[h] = m_b[h];
      }
      // (Selected, not indexed by wg: registers.)
#pragma unroll
      for (int term = 0; term < kTerms; ++term)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            pa[term][kk][r] = wg == 0 ? own[term][kk][r] : other[term][kk][r];
            pb[term][kk][r] = wg == 0 ? other[term][kk][r] : own[term][kk][r];
          }
      prev_b = has_b;
      prev_keeps = b_keeps;
    }
    wgmma_wait<0>();
    fence_acc();
  } else if constexpr (!kAhead) {
    for (int c = 0; c < chunks; ++c) {
      // Chunk c's keys landed (chunk c + 1's may still be in flight), everyone's, and visible to
      // the tensor cores; every thread done with chunk c - 1 (its key buffer refilled next); chunk
      // c + kAwStages - 1's addresses (written a chunk before) visible. Then that chunk's copies,
      // chunk c's logits, and under them chunk c + kAwStages's addresses (warp 0: a global load the
      // block no longer waits for at the barrier).
      cp_async_wait<kAwStages - 2>();
      fence_proxy_async_smem();
      __syncthreads();
      const int ahead = c + kAwStages - 1;
      if (ahead < chunks) issue(ahead % kAwStages, ahead % kAwPtrBufs);
      else cp_async_commit();  // (an empty group: the next chunk's stays kAwStages - 2 groups from the newest)
      float d[16];
      qk_issue(d, keys_of(c));
      if (ahead + 1 < chunks) fill_ptrs(j_begin + int64_t{ahead + 1} * kAmChunk, (ahead + 1) % kAwPtrBufs);
      wgmma_wait<0>();
      fence_all(d);
      put_partial(d, c);
      __syncthreads();
      float v[2][4][2], alpha[2], half[2], m_new[2];
      uint32_t own[kTerms][4], pa[kTerms][2][4];
      logits_from(d, c, v);
      softmax(v, alpha, own, half, m_new);
      __syncthreads();
      take_half(pa, own, half, alpha, m_new);
      pv_issue(keys_of(c), alpha, pa, std::true_type{});
      wgmma_wait<0>();
      fence_all(d);
    }
  } else {
    // Chunk c + 1's logits on the tensor cores while chunk c's softmax runs: per chunk c, with its
    // logits' partial sum in d, (1) d into the exchange; a barrier (everyone's weighted sum of chunk
    // c - 1 done, so its key buffer is free, and chunk c + kAwStages - 1's addresses, written in the
    // round before, visible); that chunk's copies; (2) chunk c + 1's keys landed (a second barrier),
    // its logits issued into dn; (3) chunk c's logits from the exchange and d, its softmax, its
    // weighted sum issued; (4) both waited for, chunk c + kAwStages's addresses written.
    float d[16];
    cp_async_wait<kAwStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    qk_issue(d, keys_of(0));
    wgmma_wait<0>();
    fence_all(d);
    if (kAwStages - 1 < chunks) fill_ptrs(j_begin + (kAwStages - 1) * kAmChunk, (kAwStages - 1) % kAwPtrBufs);
    for (int c = 0; c < chunks; ++c) {
      put_partial(d, c);
      __syncthreads();
      const int ahead = c + kAwStages - 1;
      if (ahead < chunks) issue(ahead % kAwStages, ahead % kAwPtrBufs);
      else cp_async_commit();  // (empty: chunk c + 1's stays kAwStages - 2 groups from the newest)
      float dn[16];
      if (c + 1 < chunks) {
        cp_async_wait<kAwStages - 2>();
        fence_proxy_async_smem();
        __syncthreads();
        qk_issue(dn, keys_of(c + 1));
      }
      float v[2][4][2], alpha[2], half[2], m_new[2];
      uint32_t own[kTerms][4], pa[kTerms][2][4];
      logits_from(d, c, v);
      softmax(v, alpha, own, half, m_new);
      __syncthreads();
      take_half(pa, own, half, alpha, m_new);
      pv_issue(keys_of(c), alpha, pa, std::true_type{});
      wgmma_wait<0>();
      if (c + 1 < chunks) {
#pragma unroll
        for (int r = 0; r < 16; ++r) d[r] = dn[r];
      }
      fence_all(d);
      if (ahead + 1 < chunks) fill_ptrs(j_begin + int64_t{ahead + 1} * kAmChunk, (ahead + 1) % kAwPtrBufs);
    }
  }
  // acc[ni][4 j + 2 h + e]: head row0 + 8 h, dim wg kWgDims + ni kN + 8 j + 2 tig + e.
  if (n <= a.mma_split) {  // the token's only split: attention_mma_kernel's ending
    // The sums staged in shared memory (q's and the keys' space, free now), [64 heads][kDh + 8]
    // (rows 32 bytes of banks apart: a warp's 8-byte stores in two wavefronts), with each head's
    // weight ws, denominator, its reciprocal and whether the reciprocal may stand for it; then a
    // thread's outputs two quarter warps' float4s at a time, a loop of few instructions (unrolled,
    // the 128 divisions a thread were most of the kernel's code and its time after the loop went to
    // instruction fetch and their dependent chains). The 8 quotients of a step come from the
    // reciprocal (dev_div_recip: the division's bits, three operations and no branch each) where
    // all 8 numerators and the denominator are in its range, as they are unless the values are
    // extreme; else from 8 divisions.
    constexpr int kRow = kDh + 8;
    static_assert(kAwHeads * kRow * sizeof(float) + 4 * kAwHeads * sizeof(float) <= kDh / 64 * kQSub + kAwStages * kKBytes,
                  "the staged sums fit in q's and the keys' space");
    float* const st = reinterpret_cast<float*>(qs);
    float* const head_w = st + kAwHeads * kRow;  // [64][4]: ws, denom, 1 / denom, fits (1 or 0)
    __syncthreads();  // every warp done reading q and the keys (its wgmma waited for)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (wg == 0 && tig == 0) {
        const float sink = dev_load(a.sinks, h0 + row0 + 8 * h);
        const float M = fmaxf(sink, m[h]);
        const float ws = attn_split_weight(m[h], M);
        const float denom = attn_combine_denom(expf(sink - M), ws, l[h]);
        *reinterpret_cast<float4*>(head_w + 4 * (row0 + 8 * h)) =
            make_float4(ws, denom, __frcp_rn(denom), dev_div_recip_divisor_fits(denom) ? 1.0f : 0.0f);
      }
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
          *reinterpret_cast<float2*>(st + (row0 + 8 * h) * kRow + wg * kWgDims + ni * kN + 8 * j + 2 * tig) =
              make_float2(acc[ni][4 * j + 2 * h], acc[ni][4 * j + 2 * h + 1]);
    }
    __syncthreads();
    constexpr int kQuads = kDh / 4;  // float4 a row
    static_assert(kAwHeads * kQuads % (2 * kAwThreads) == 0, "whole steps of two float4s a thread");
    float* const out = a.out + (t * a.H + h0) * a.Dh;
    for (int i0 = tid; i0 < kAwHeads * kQuads; i0 += 2 * kAwThreads) {
      float o[2][4], den[2], rcp[2];
      bool fits = true;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = i0 + u * kAwThreads, head = i / kQuads, q4 = i % kQuads;
        const float4 x = *reinterpret_cast<const float4*>(st + head * kRow + 4 * q4);
        const float4 w = *reinterpret_cast<const float4*>(head_w + 4 * head);  // ws, denom, 1 / denom, fits
        const float xs[4] = {x.x, x.y, x.z, x.w};
        den[u] = w.y;
        rcp[u] = w.z;
        fits = fits && w.w != 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          o[u][e] = attn_combine_term(0.0f, w.x, xs[e]);
          fits = fits && dev_div_recip_fits(o[u][e]);
        }
      }
      if (fits) {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[u][e] = dev_div_recip(o[u][e], den[u], rcp[u]);
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[u][e] = o[u][e] / den[u];
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = i0 + u * kAwThreads, head = i / kQuads, q4 = i % kQuads;
        if (a.round_bf16) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[u][e] = dev_bf16_round(o[u][e]);
        }
        *reinterpret_cast<float4*>(out + static_cast<int64_t>(head) * a.Dh + 4 * q4) =
            make_float4(o[u][0], o[u][1], o[u][2], o[u][3]);
      }
    }
    return;
  }
  const int64_t th0 = (t - t_base) * a.H + h0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* part = a.split_scratch + ((th0 + row0 + 8 * h) * max_splits + s) * (a.Dh + 2);
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
        *reinterpret_cast<float2*>(part + wg * kWgDims + ni * kN + 8 * j + 2 * tig) =
            make_float2(acc[ni][4 * j + 2 * h], acc[ni][4 * j + 2 * h + 1]);
    if (wg == 0 && tig == 0) {
      part[a.Dh] = m[h];
      part[a.Dh + 1] = l[h];
    }
  }
}

}  // namespace

void launch_compressor(const CompressorArgs& a) {
  if (a.nseq <= 0) return;
  if (!a.parallel) {
    launch(compressor_kernel, static_cast<unsigned>(a.nseq), kThreads, 0, a);
    return;
  }
  if (a.n_jobs > 0) launch(compressor_entries_kernel, static_cast<unsigned>(a.n_jobs), kThreads, 0, a);
  if (a.ape.dtype == DType::kF32) launch(compressor_state_kernel<true>, static_cast<unsigned>(a.nseq), kThreads, 0, a);
  else launch(compressor_state_kernel<false>, static_cast<unsigned>(a.nseq), kThreads, 0, a);
}

void launch_key_sim(const KeySimArgs& a) {
  if (a.n > 0 && a.dim > 0 && a.precision != KeyPrecision::kF32)
    launch(key_sim_kernel, static_cast<unsigned>(a.n), kKeySimThreads, 0, a);
}

void launch_indexer_topk(const IndexerArgs& a) {
  if (a.T == 0 || a.C == 0) return;
  const dim3 grid(static_cast<unsigned>(a.T), blocks_for(a.C, kThreads));
  const size_t score_smem = static_cast<size_t>(a.Hi * (a.di + 1) + kScoreWarps * a.di + kScoreWarps * a.Hi) * sizeof(float);
  static const bool fast = cuda_feature_on("indexer_fast"), tiled = cuda_feature_on("indexer_tiled");
  const size_t tile_smem = indexer_tile_smem(a.di);
  if (a.keys_bf16 && !a.bf16_scores && indexer_mma_fits(a.Hi, a.di)) {
    // As many tiles a block as still leave kMmaMinBlocks blocks (q staged once for them, and the
    // ring filled once: a block's first tile waits for HBM with nothing under it); the entries'
    // scores do not depend on it.
    const int64_t tile_blocks = a.T * ((a.C + kTileEntries - 1) / kTileEntries);
    int tiles = 1;
    while (tiles < kMmaMaxTiles && tile_blocks / (2 * tiles) >= kMmaMinBlocks) tiles *= 2;
    if (a.mma_tiles >= 1 && a.mma_tiles <= kMmaMaxTiles) tiles = a.mma_tiles;
    const dim3 mgrid(static_cast<unsigned>(a.T * blocks_for(a.C, tiles * kTileEntries)));
    if (a.di == 128) launch_indexer_score_mma<4>(a, mgrid, tiles);
    else if (a.di == 64) launch_indexer_score_mma<2>(a, mgrid, tiles);
    else launch_indexer_score_mma<1>(a, mgrid, tiles);
  } else if (fast && tiled && !a.bf16_scores && a.Hi <= kTileHeads && a.di % 4 == 0 && tile_smem <= 200 * 1024 &&
      reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
    static bool opted = false;  // the attribute is per kernel; 200 KB is the most this launch asks
    if (!opted) {
      SPARROW_CUDA_CHECK(
          cudaFuncSetAttribute(indexer_score_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
      opted = true;
    }
    const dim3 tgrid(static_cast<unsigned>(a.T), blocks_for(a.C, kTileEntries));
    launch(indexer_score_tiled_kernel, tgrid, kTileThreads, tile_smem, a);
  } else if (fast && !a.bf16_scores && score_smem <= 48 * 1024) {
    const dim3 sgrid(static_cast<unsigned>(a.T), blocks_for(a.C, kScoreEntries));
    launch(indexer_score_smem_kernel, sgrid, 32 * kScoreWarps, score_smem, a);
  } else {
    launch(indexer_score_kernel, grid, kThreads, 0, a);
  }
  launch_indexer_select(a);
}

void launch_indexer_select(const IndexerArgs& a) {
  if (a.T == 0 || a.C == 0 || a.k <= 0) return;
  static const bool fast = cuda_feature_on("indexer_fast");
  static const bool rank = cuda_feature_on("select_rank");
  const dim3 grid(static_cast<unsigned>(a.T), blocks_for(a.C, kThreads));
  int64_t pow2 = 1;
  while (pow2 < a.k) pow2 <<= 1;
  const bool radix_fits = pow2 <= kSelectCap && a.C < (int64_t{1} << 31);
  // The rank kernel's grid and shared memory for a row of C rounded up to a power of two: a captured
  // step's kernel nodes then keep their shape as the entries grow one by one, so the kept graph is
  // updated in place, not instantiated anew (step_graph.cpp; sized by C itself, the longest visible
  // row, a CSA layer's node changed with every entry, every 4 tokens, and
  // CudaModelParity.StepGraphsGiveTheSameBits found kept graphs seldom reused). Blocks past a
  // token's entries leave at once.
  int64_t c_pow2 = 32;
  while (c_pow2 < a.C) c_pow2 <<= 1;
  IndexerSelectKernel kernel = a.select;
  if (kernel == IndexerSelectKernel::kAuto)
    kernel = fast && rank && indexer_rank_select_fits(a.T, c_pow2) ? IndexerSelectKernel::kRank
             : fast && radix_fits                                ? IndexerSelectKernel::kRadix
                                                                 : IndexerSelectKernel::kCount;
  if (kernel == IndexerSelectKernel::kRank) {
    SPARROW_CHECK_LE(c_pow2, kRankSelectMaxC);
    launch(indexer_rank_select_kernel, dim3(static_cast<unsigned>(a.T), blocks_for(c_pow2, 32)), 32 * kRankWarps,
           c_pow2 * sizeof(uint32_t), a);
  } else if (kernel == IndexerSelectKernel::kRadix) {
    SPARROW_CHECK(radix_fits);
    launch(indexer_radix_select_kernel, static_cast<unsigned>(a.T), kSelectThreads, kSelectCap * sizeof(uint64_t), a, pow2);
  } else {
    SPARROW_CUDA_CHECK(cudaMemsetAsync(a.out_indices, 0xff, a.T * a.k * sizeof(int32_t), 0));  // -1: unranked slots
    launch(indexer_select_kernel, grid, kThreads, 0, a);
  }
}

void launch_rows_to_bf16(const float* const* src, uint16_t* const* dst, int64_t n, int64_t dim) {
  if (n > 0 && dim > 0) launch(rows_to_bf16_kernel, static_cast<unsigned>(n), 128, 0, src, dst, dim);
}

// The combine's weights w[max_splits] and its denominator, rounded up to whole 16-byte words (at
// least kCombineSplits + 1 words: the unrolled form reads w[s] for s < kCombineSplits under its
// guards): ptxas hoists a loop remainder's three guarded w[s] reads above their guards as one
// 12-byte load (compute-sanitizer's memcheck saw it read past a 4-byte allocation at one split;
// 2026-12-02).
namespace {
size_t combine_smem(int64_t max_splits) {
  const int64_t words = std::max<int64_t>(max_splits + 1, kCombineSplits + 1);
  return static_cast<size_t>((words + 3) / 4 * 4) * sizeof(float);
}
}  // namespace

// Whether the 16-head blocks from the bf16 copies run a chunk's logits beside the chunk before's
// softmax and weighted sum: set_attention_overlap's choice where set (1 yes, -1 no), else yes unless
// SPARROW_CUDA_DISABLE=attn_overlap. The same bits either way.
namespace {
// A test's choice where set (1 on, -1 off), else the process's.
bool forced_or(const std::atomic<int>& forced, bool process) {
  const int n = forced.load();
  return n != 0 ? n > 0 : process;
}
std::atomic<int> g_attention_overlap{0};
bool attention_overlap() {
  static const bool on = cuda_feature_on("attn_overlap");
  return forced_or(g_attention_overlap, on);
}
}  // namespace
void set_attention_overlap(int n) { g_attention_overlap.store(n); }

// The dim slices of a call's 16-head blocks (the grid's z, which the kernel reads as gridDim.z): set_attention_dim_slices's
// where set, else 1 with SPARROW_CUDA_DISABLE=attn_dims, else the most of 4 and 2 that keeps the
// call's blocks within the SMs (a decode batch leaves most of them idle: at batch 1 a token's 4
// blocks walk its chunks on 4 SMs), else 1. The same bits any way.
namespace {
std::atomic<int> g_attention_dim_slices{0}, g_last_attention_dim_slices{0};
int attention_dim_slices(int64_t blocks) {
  if (const int n = g_attention_dim_slices.load(); n != 0) return n;
  static const bool on = cuda_feature_on("attn_dims");
  return on ? attention_dim_slices_for(blocks, sm_count()) : 1;
}
}  // namespace
void set_attention_dim_slices(int n) {
  SPARROW_CHECK(n == 0 || n == 1 || n == 2 || n == 4);
  g_attention_dim_slices.store(n);
}
int last_attention_dim_slices() { return g_last_attention_dim_slices.load(); }
namespace {
std::atomic<bool> g_last_attention_wgmma{false};
std::atomic<int> g_last_attention_wg_form{0};
std::atomic<int> g_attention_wg_ahead{0};
// Whether attention_wg_kernel issues a chunk's logits before the chunk before's softmax (kAhead):
// set_attention_wg_ahead's choice where set (1 yes, -1 no), else no unless
// SPARROW_CUDA_ENABLE=attn_wg_ahead (an 8K CSA prefill's attention 6.82 ms without, 8.43 with on
// the H200, 2026-12-05: its second barrier a chunk and 16 more live registers). The same bits
// either way.
bool attention_wg_ahead() {
  static const bool on = cuda_feature_enabled("attn_wg_ahead");
  return forced_or(g_attention_wg_ahead, on);
}
}  // namespace
void set_attention_wg_ahead(int n) { g_attention_wg_ahead.store(n); }
namespace {
std::atomic<int> g_attention_wg_pair{0};
// Whether attention_wg_kernel takes two chunks a round, a warpgroup's whole logits each (kPair):
// set_attention_wg_pair's choice where set (1 yes, -1 no), else yes unless
// SPARROW_CUDA_DISABLE=attn_wg_pair (with the short prologue and ending, the 8K prefill's kernel
// 4.09 ms against the chunk-a-round form's 4.55 on an H200, 2026-12-06: docs/perf.md, fifty-seventh
// session). The same bits either way; it takes precedence over kAhead.
bool attention_wg_pair() {
  static const bool on = cuda_feature_on("attn_wg_pair");
  return forced_or(g_attention_wg_pair, on);
}
}  // namespace
void set_attention_wg_pair(int n) { g_attention_wg_pair.store(n); }
bool last_attention_wgmma() { return g_last_attention_wgmma.load(); }
int last_attention_wg_form() { return g_last_attention_wg_form.load(); }

int64_t attn_mma_split_candidates() {
  static const int64_t per = cuda_env_int(
      "SPARROW_CUDA_ATTN_MMA_SPLIT", kAttnMmaSplitDefault,
      [](int64_t n) { return n >= kAmChunk && n <= 8192 && n % kAmChunk == 0; },
      "the tensor-core attention's candidates a split must be a multiple of 32 from 32 to 8192");
  return per;
}

bool launch_attention(const AttentionArgs& args) {
  if (args.T * args.H == 0) return false;
  AttentionArgs a = args;
  a.mma_split = attn_mma_split_candidates();
  a.o_rope = RopeTableArg{};  // (kept below only where attention_mma_kernel finishes every token)
  if (a.mma) {  // (split_scratch null when no token has two splits)
    const int64_t max_splits = attention_splits(a.max_candidates, true);
    // The output's inverse rope in attention_mma_kernel's stores: every token one split, so that the
    // kernel finishes it (the 64-head blocks and the combine leave it to the caller), and one pass, so
    // that the call's tokens take one block shape and are rotated all or none (a pass on the 64-head
    // blocks beside one on the 16-head blocks would leave the caller to rotate some twice).
    const bool o_rope = args.o_rope.pairs > 0 && max_splits == 1 && a.split_tokens_per_pass >= a.T &&
                        2 * args.o_rope.pairs <= args.Dh;
    bool o_rope_done = o_rope;
    const int keys = a.records ? kAmKeysRecord : a.bf16_keys ? kAmKeysBf16 : kAmKeysF32;
    const int64_t rec_bytes = a.records ? a.rec.bytes : 0;
    // The attribute is per kernel: the most any launch of it asks (records: at most 2 Dh bytes).
    static bool opted = false;
    if (!opted) {
      const auto opt_in = [](auto kernel, int64_t Dh, int k, int64_t heads, bool overlap = false) {
        SPARROW_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(attention_mma_smem(Dh, k, 2 * Dh, heads, overlap))));
      };
      opt_in(attention_mma_kernel<128, kAmKeysF32>, 128, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<256, kAmKeysF32>, 256, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<512, kAmKeysF32>, 512, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<128, kAmKeysBf16>, 128, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<256, kAmKeysBf16>, 256, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<512, kAmKeysBf16>, 512, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<128, kAmKeysRecord>, 128, kAmKeysRecord, 32);
      opt_in(attention_mma_kernel<256, kAmKeysRecord>, 256, kAmKeysRecord, 32);
      opt_in(attention_mma_kernel<512, kAmKeysRecord>, 512, kAmKeysRecord, 32);
      opt_in(attention_mma_kernel<256, kAmKeysF32, 16, 16>, 256, kAmKeysF32, 16);
      opt_in(attention_mma_kernel<512, kAmKeysF32, 16, 16>, 512, kAmKeysF32, 16);
      opt_in(attention_mma_kernel<256, kAmKeysBf16, 16, 16>, 256, kAmKeysBf16, 16);
      opt_in(attention_mma_kernel<512, kAmKeysBf16, 16, 16>, 512, kAmKeysBf16, 16);
      opt_in(attention_mma_kernel<256, kAmKeysBf16, 16, 16, true>, 256, kAmKeysBf16, 16, true);
      opt_in(attention_mma_kernel<512, kAmKeysBf16, 16, 16, true>, 512, kAmKeysBf16, 16, true);
      opt_in(attention_mma_kernel<256, kAmKeysRecord, 16, 16>, 256, kAmKeysRecord, 16);
      opt_in(attention_mma_kernel<512, kAmKeysRecord, 16, 16>, 512, kAmKeysRecord, 16);
      opt_in(attention_mma_kernel<256, kAmKeysF32, 16, 16, false, 1>, 256, kAmKeysF32, 16);
      opt_in(attention_mma_kernel<512, kAmKeysF32, 16, 16, false, 1>, 512, kAmKeysF32, 16);
      opt_in(attention_mma_kernel<256, kAmKeysBf16, 16, 16, false, 1>, 256, kAmKeysBf16, 16);
      opt_in(attention_mma_kernel<512, kAmKeysBf16, 16, 16, false, 1>, 512, kAmKeysBf16, 16);
      opt_in(attention_mma_kernel<256, kAmKeysBf16, 16, 16, true, 1>, 256, kAmKeysBf16, 16, true);
      opt_in(attention_mma_kernel<512, kAmKeysBf16, 16, 16, true, 1>, 512, kAmKeysBf16, 16, true);
      opt_in(attention_mma_kernel<256, kAmKeysRecord, 16, 16, false, 1>, 256, kAmKeysRecord, 16);
      opt_in(attention_mma_kernel<512, kAmKeysRecord, 16, 16, false, 1>, 512, kAmKeysRecord, 16);
      opt_in(attention_mma_kernel<128, kAmKeysF32, 32, 8, false, 1>, 128, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<256, kAmKeysF32, 32, 8, false, 1>, 256, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<512, kAmKeysF32, 32, 8, false, 1>, 512, kAmKeysF32, 32);
      opt_in(attention_mma_kernel<128, kAmKeysBf16, 32, 8, false, 1>, 128, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<256, kAmKeysBf16, 32, 8, false, 1>, 256, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<512, kAmKeysBf16, 32, 8, false, 1>, 512, kAmKeysBf16, 32);
      opt_in(attention_mma_kernel<128, kAmKeysRecord, 32, 8, false, 1>, 128, kAmKeysRecord, 32);
      opt_in(attention_mma_kernel<256, kAmKeysRecord, 32, 8, false, 1>, 256, kAmKeysRecord, 32);
      opt_in(attention_mma_kernel<512, kAmKeysRecord, 32, 8, false, 1>, 512, kAmKeysRecord, 32);
      const auto opt_in_wg = [](auto kernel, int64_t Dh, bool pair = false, int terms = 3) {
        SPARROW_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(attention_wg_smem(Dh, pair, terms))));
      };
      opt_in_wg(attention_wg_kernel<128>, 128);
      opt_in_wg(attention_wg_kernel<256>, 256);
      opt_in_wg(attention_wg_kernel<512>, 512);
      opt_in_wg(attention_wg_kernel<128, 1>, 128);
      opt_in_wg(attention_wg_kernel<256, 1>, 256);
      opt_in_wg(attention_wg_kernel<512, 1>, 512);
      opt_in_wg(attention_wg_kernel<128, 3, true>, 128);
      opt_in_wg(attention_wg_kernel<256, 3, true>, 256);
      opt_in_wg(attention_wg_kernel<512, 3, true>, 512);
      opt_in_wg(attention_wg_kernel<128, 1, true>, 128);
      opt_in_wg(attention_wg_kernel<256, 1, true>, 256);
      opt_in_wg(attention_wg_kernel<512, 1, true>, 512);
      opt_in_wg(attention_wg_kernel<128, 3, false, true>, 128, true, 3);
      opt_in_wg(attention_wg_kernel<256, 3, false, true>, 256, true, 3);
      opt_in_wg(attention_wg_kernel<512, 3, false, true>, 512, true, 3);
      opt_in_wg(attention_wg_kernel<128, 1, false, true>, 128, true, 1);
      opt_in_wg(attention_wg_kernel<256, 1, false, true>, 256, true, 1);
      opt_in_wg(attention_wg_kernel<512, 1, false, true>, 512, true, 1);
      opted = true;
    }
    if (a.records)
      SPARROW_CHECK(a.rec.bytes > 0 && a.rec.bytes % 8 == 0 && a.rec.bytes <= 2 * a.Dh && a.rec.nope % 8 == 0 &&
                    a.rec.dim == a.Dh && a.rec.rope_at % 8 == 0);
    // A call of few blocks (a decode batch) on 16 heads and 16 warps a block: twice the blocks, and
    // each chunk's softmax and weighted sum spread over twice the warps; the same bits (`attn_narrow`
    // off: 32 heads and 8 warps always).
    static const bool narrow_on = cuda_feature_on("attn_narrow");
    // On those blocks from the bf16 copies, each chunk's logits beside the chunk before's softmax and
    // weighted sum (attention_mma_kernel's kOverlap; the same bits): attention_overlap().
    const bool overlap = keys == kAmKeysBf16 && attention_overlap();
    // 64 heads a block on wgmma (attention_wg_kernel; the same bits) from the bf16 copies, where H
    // takes them and the call does not go to the 16-head blocks (`attn_wgmma` off: never).
    static const bool wgmma_on = cuda_feature_on("attn_wgmma");
    g_last_attention_wgmma.store(false);
    for (int64_t t_base = 0; t_base < a.T; t_base += a.split_tokens_per_pass) {
      const int64_t tp = a.T - t_base < a.split_tokens_per_pass ? a.T - t_base : a.split_tokens_per_pass;
      const bool narrow = a.Dh >= 256 &&
                          (a.block_heads == 16 || (a.block_heads == 0 && narrow_on &&
                                                   tp * (a.H / kAmHeads) * max_splits < sm_count()));
      const bool wide = keys == kAmKeysBf16 && a.H % kAwHeads == 0 &&
                        (a.block_heads == kAwHeads || (a.block_heads == 0 && wgmma_on && !narrow));
      if (wide) {
        o_rope_done = false;
        g_last_attention_wgmma.store(true);
        g_last_attention_dim_slices.store(1);
        const dim3 grid(static_cast<unsigned>(tp * a.H / kAwHeads), static_cast<unsigned>(max_splits));
        const bool pair = attention_wg_pair();
        const size_t smem = attention_wg_smem(a.Dh, pair, a.weights_bf16 ? 1 : 3);
        const auto run = [&](auto kernel) { launch(kernel, grid, kAwThreads, smem, a, t_base, max_splits); };
        const auto pick_wg = [&](auto terms_c, auto ahead_c, auto pair_c) {
          constexpr int kT = decltype(terms_c)::value;
          constexpr bool kA = decltype(ahead_c)::value, kP = decltype(pair_c)::value;
          if (a.Dh == 512) run(attention_wg_kernel<512, kT, kA, kP>);
          else if (a.Dh == 256) run(attention_wg_kernel<256, kT, kA, kP>);
          else run(attention_wg_kernel<128, kT, kA, kP>);
        };
        const auto pick_ahead = [&](auto terms_c) {
          const bool ahead = !pair && attention_wg_ahead();
          g_last_attention_wg_form.store(pair ? 2 : ahead ? 1 : 0);
          if (pair) pick_wg(terms_c, std::false_type{}, std::true_type{});
          else if (ahead) pick_wg(terms_c, std::true_type{}, std::false_type{});
          else pick_wg(terms_c, std::false_type{}, std::false_type{});
        };
        if (a.weights_bf16) pick_ahead(std::integral_constant<int, 1>{});
        else pick_ahead(std::integral_constant<int, 3>{});
        if (max_splits > 1)
          launch(attention_combine_kernel, static_cast<unsigned>(tp * a.H), kAttnThreads, combine_smem(max_splits), a,
                 t_base, max_splits);
        continue;
      }
      const int heads = narrow ? 16 : kAmHeads;
      a.o_rope = o_rope ? args.o_rope : RopeTableArg{};
      const size_t smem = attention_mma_smem(a.Dh, keys, rec_bytes, heads, narrow && overlap);
      // The dim slices of a 16-head block (grid z; the kernel reads gridDim.z).
      const int slices = narrow ? attention_dim_slices(tp * (a.H / heads) * max_splits) : 1;
      g_last_attention_dim_slices.store(slices);
      const dim3 grid(static_cast<unsigned>(tp * a.H / heads), static_cast<unsigned>(max_splits),
                      static_cast<unsigned>(slices));
      const auto run = [&](auto kernel, int warps) { launch(kernel, grid, 32 * warps, smem, a, t_base, max_splits); };
      // (The weights' terms: 3, exact, or 1 under AttentionArgs::weights_bf16; every block shape.)
      const auto pick_terms = [&](auto keys_c, auto terms_c) {
        constexpr int k = decltype(keys_c)::value, w = decltype(terms_c)::value;
        if (narrow && overlap) {
          if constexpr (k == kAmKeysBf16) {
            if (a.Dh == 512) run(attention_mma_kernel<512, k, 16, 16, true, w>, 16);
            else run(attention_mma_kernel<256, k, 16, 16, true, w>, 16);
          }
        } else if (narrow) {
          if (a.Dh == 512) run(attention_mma_kernel<512, k, 16, 16, false, w>, 16);
          else run(attention_mma_kernel<256, k, 16, 16, false, w>, 16);
        } else {
          if (a.Dh == 512) run(attention_mma_kernel<512, k, 32, 8, false, w>, 8);
          else if (a.Dh == 256) run(attention_mma_kernel<256, k, 32, 8, false, w>, 8);
          else run(attention_mma_kernel<128, k, 32, 8, false, w>, 8);
        }
      };
      const auto pick = [&](auto keys_c) {
        if (a.weights_bf16) pick_terms(keys_c, std::integral_constant<int, 1>{});
        else pick_terms(keys_c, std::integral_constant<int, 3>{});
      };
      if (keys == kAmKeysRecord) pick(std::integral_constant<int, kAmKeysRecord>{});
      else if (keys == kAmKeysBf16) pick(std::integral_constant<int, kAmKeysBf16>{});
      else pick(std::integral_constant<int, kAmKeysF32>{});
      if (max_splits > 1)  // (one split: every token written by the kernel)
        launch(attention_combine_kernel, static_cast<unsigned>(tp * a.H), kAttnThreads, combine_smem(max_splits), a,
               t_base, max_splits);
    }
    return o_rope_done;
  }
  if (a.split_scratch) {
    SPARROW_CHECK(!a.weights_bf16);  // (attention_kernel's: one running max over all of a token's candidates)
    const int64_t max_splits = attention_splits(a.max_candidates);
    // Eight heads a block where they divide H and fit in shared memory (48 KB), else one. (16 heads
    // a block measured slower on the H200: 0.09 -> 0.17 ms at batch 1, fewer blocks.)
    const auto fits = [&](int h) { return a.H % h == 0 && h * (a.Dh + kAttnSplitCandidates) * sizeof(float) <= 48 * 1024; };
    const int heads = fits(8) ? 8 : 1;
    const size_t smem = static_cast<size_t>(heads * (a.Dh + kAttnSplitCandidates)) * sizeof(float);
    for (int64_t t_base = 0; t_base < a.T; t_base += a.split_tokens_per_pass) {
      const int64_t tp = a.T - t_base < a.split_tokens_per_pass ? a.T - t_base : a.split_tokens_per_pass;
      const dim3 grid(static_cast<unsigned>(tp * a.H / heads), static_cast<unsigned>(max_splits));
      if (heads == 8) launch(attention_split_kernel<8>, grid, kAttnThreads, smem, a, t_base, max_splits);
      else launch(attention_split_kernel<1>, grid, kAttnThreads, smem, a, t_base, max_splits);
      launch(attention_combine_kernel, static_cast<unsigned>(tp * a.H), kAttnThreads, combine_smem(max_splits), a,
             t_base, max_splits);
    }
    return false;
  }
  const size_t q_bytes = static_cast<size_t>(a.Dh) * sizeof(float);
  static const bool warp_dots = cuda_feature_on("attn_warp");
  const int64_t per_pass = a.kernel_tokens_per_pass > 0 ? a.kernel_tokens_per_pass : a.T;
  for (int64_t t_base = 0; t_base < a.T; t_base += per_pass) {
    const unsigned blocks = static_cast<unsigned>((a.T - t_base < per_pass ? a.T - t_base : per_pass) * a.H);
    if (warp_dots && q_bytes <= 16 * 1024) launch(attention_kernel<true>, blocks, kAttnThreads, q_bytes, a, t_base);
    else launch(attention_kernel<false>, blocks, kAttnThreads, 0, a, t_base);
  }
  return false;
}

// This translation unit's trace region (kernels.h set_kernel_trace).
cudaError_t set_kernel_trace_attention(KernelTraceSlot* region) { return set_kernel_trace_here(region); }

}  // namespace sparrow::cuda
