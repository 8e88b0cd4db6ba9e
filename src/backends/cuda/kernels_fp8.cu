// Activation quantisation for the FP8 block-scaled linear (LinearFp8BlockParams): the device twin of
// the reference's act_quant (core/quant_sim.cpp fp8_pow2_quant_sim, block 128), bit for bit, written
// in the padded layout cuBLASLt's FP8 GEMM reads (kernels.h ActQuantFp8Args); and its exact
// dequantisation, the input of the fallback GEMM.
//
// Bit-exactness: amax is a max (order-free), the scale exponent is one IEEE division and frexpf
// (dev_pow2_scale_exponent), x / s is one IEEE division or the product with the exact 1 / s (no
// fast math: no flush to zero), and the e4m3 encoder is the integer twin of core/quant.cpp (device_common.cuh).
#include "backends/cuda/device_common.cuh"
#include "core/check.h"

namespace sparrow::cuda {
namespace {

constexpr int kQuantWarps = 4;                                  // (row, block) pairs per CTA
constexpr int kValuesPerLane = static_cast<int>(kFp8ActBlock) / 32;  // 4
constexpr int kDequantThreads = 256;

static_assert(kFp8ActBlock == 32 * kValuesPerLane, "one warp covers one block of 128 inputs");

__device__ inline float load_input(const ActQuantFp8Args& a, int64_t i) {
  return a.in_dtype == DType::kBF16 ? dev_bf16(static_cast<const uint16_t*>(a.in)[i])
                                    : static_cast<const float*>(a.in)[i];
}

// Where lane's 4 codes of block b go in a row: inputs 32 t + 8 i + 4 h + 0..3 with t = lane / 8,
// i = lane % 8 / 2, h = lane % 2; in the W4A8 order (ActQuantFp8Args::w4a8_order) at 32 i + 16 h + 4 t
// of the block.
__device__ inline int64_t act_quant_code_at(const ActQuantFp8Args& a, int64_t b, int lane) {
  return a.w4a8_order ? b * kFp8ActBlock + 32 * (lane % 8 / 2) + 16 * (lane % 2) + 4 * (lane / 8)
                      : b * kFp8ActBlock + lane * kValuesPerLane;
}

// The (row m, block b) pair's codes and scale from lane's inputs v (columns k0 .. k0 + 3 of the block,
// 0 past K), all 32 lanes of the warp calling it.
__device__ inline void act_quant_pair(const ActQuantFp8Args& a, int64_t m, int64_t b, int lane,
                                      const float (&v)[kValuesPerLane]) {
  float s;
  *reinterpret_cast<uint32_t*>(a.codes + m * a.k_pad + act_quant_code_at(a, b, lane)) = act_quant_lane(v, s);
  if (lane == 0) a.scales[b * a.rows_pad + m] = s;
}

// A padding row's pair (m >= rows): zero codes, scale 1.
__device__ inline void act_quant_pad(const ActQuantFp8Args& a, int64_t m, int64_t b, int lane) {
  *reinterpret_cast<uint32_t*>(a.codes + m * a.k_pad + act_quant_code_at(a, b, lane)) = 0u;
  if (lane == 0) a.scales[b * a.rows_pad + m] = 1.0f;
}

// grid ceil(rows_pad * nblocks / kQuantWarps), block 32 * kQuantWarps: warp w of CTA c quantises
// block b of row m, pair = c * kQuantWarps + w = m * nblocks + b; lane l holds inputs
// b*128 + 4l .. 4l+3. Every branch is uniform across a warp (m and b are per warp), so the
// warp_max shuffle sees all 32 lanes. act_quant_warp_pair gives this warp's pair; false when the
// warp has none or the row is padding (then written here).
struct QuantPair {
  int lane;
  int64_t m, b, k0;  // k0: the lane's first input column
};
__device__ inline bool act_quant_warp_pair(const ActQuantFp8Args& a, QuantPair& p,
                                           uint32_t pair = blockIdx.x * kQuantWarps + threadIdx.x / 32) {
  p.lane = threadIdx.x % 32;
  // (32-bit divisions: the launches check that the pairs fit.)
  const uint32_t nblocks = static_cast<uint32_t>(a.k_pad / kFp8ActBlock);
  if (static_cast<int64_t>(pair) >= a.rows_pad * static_cast<int64_t>(nblocks)) return false;
  const uint32_t m = pair / nblocks;
  p.m = m, p.b = pair - m * nblocks;
  if (p.m >= a.rows) {
    act_quant_pad(a, p.m, p.b, p.lane);
    return false;
  }
  p.k0 = p.b * kFp8ActBlock + p.lane * kValuesPerLane;
  return true;
}

// A warp takes kPer consecutive pairs (the inputs of a row's neighbouring blocks), their loads all
// issued before the first pair's arithmetic: 4 for calls of many waves (with one pair a warp, an
// 8192 x 4096 input took about 80 us, 2.1 TB/s; with four the FP8 linears at M = 8192 with their
// act_quant 7-8 us faster at K = 4096 and 14 at wo_b's 8192, an 8K prefill layer 0.05-0.06 ms: H200,
// 2026-12-04), 1 for small ones (a decode step's, where a warp's four pairs in a row would lengthen
// the kernel). Each pair's operations are the one-pair kernel's, so the same bits either way.
constexpr int64_t kQuantManyPairs = 1 << 17;  // pairs from which a warp takes 4
// Pairs from which act_quant_fp8_half_kernel takes a call (below: one pair a warp). On an H100
// (2026-12-05, `ncu`, every act_quant of layer 0's bench cells) against one pair a warp: 65,536
// pairs (8192 x 1024) 22.3 -> 17.5 us, 32,768 12.4 -> 11.3; but 16,384 7.9 -> 8.4, 8,192 5.3 ->
// 6.1 and a decode step's few pairs 3.4-3.9 -> 4.3-5.2.
constexpr int64_t kQuantHalfPairs = 1 << 15;
template <int kPer>
__global__ void act_quant_fp8_kernel(ActQuantFp8Args a) {
  wait_previous_grid();
  QuantPair p[kPer];
  bool ok[kPer];
  float v[kPer][kValuesPerLane];
  const uint32_t first = (blockIdx.x * kQuantWarps + threadIdx.x / 32) * kPer;
  const bool vec = a.in_dtype == DType::kF32 && a.in_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.in) % 16 == 0;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    ok[u] = act_quant_warp_pair(a, p[u], first + u);
    if (!ok[u]) continue;
    const int64_t k0 = p[u].k0, at = p[u].m * a.in_stride + k0;
    if (vec && k0 + kValuesPerLane <= a.K) {
      const float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(a.in) + at);
      v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
    } else {
#pragma unroll
      for (int i = 0; i < kValuesPerLane; ++i) v[u][i] = k0 + i < a.K ? load_input(a, at + i) : 0.0f;
    }
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (ok[u]) act_quant_pair(a, p[u].m, p[u].b, p[u].lane, v[u]);
}

// The routed experts' h = bf16(g silu(min(h1, L)) clamp(h3, -L, L)) quantised as act_quant_fp8_kernel
// quantises its input, in one pass: swiglu_kernel, route_scale_bf16_kernel and act_quant_fp8_kernel
// in turn wrote and read h [R, F] in fp32 twice more (an 8K prefill: 1.08 ms a layer on the H200).
// The same operations on the same values (dev_swiglu, dev_route_scale_bf16, act_quant_pair): the
// same bits. h itself is not written (the W4A8 kernels read the codes).
__global__ void swiglu_quant_fp8_kernel(SwigluQuantArgs s) {
  wait_previous_grid();
  const ActQuantFp8Args& a = s.q;
  QuantPair p;
  if (!act_quant_warp_pair(a, p)) return;
  const int64_t m = p.m, k0 = p.k0, at = m * a.K + k0;
  float x[kValuesPerLane], y[kValuesPerLane];
  if (k0 + kValuesPerLane <= a.K && a.K % 4 == 0 && s.four_wide) {
    const float4 g1 = dev_parts_at4(s.h1, at), g3 = dev_parts_at4(s.h3, at);
    x[0] = g1.x, x[1] = g1.y, x[2] = g1.z, x[3] = g1.w;
    y[0] = g3.x, y[1] = g3.y, y[2] = g3.z, y[3] = g3.w;
  } else {
#pragma unroll
    for (int i = 0; i < kValuesPerLane; ++i) {
      x[i] = k0 + i < a.K ? dev_parts_at(s.h1, at + i) : 0.0f;
      y[i] = k0 + i < a.K ? dev_parts_at(s.h3, at + i) : 0.0f;
    }
  }
  const double g = s.weights ? static_cast<double>(s.weights[s.slots[m]]) * s.scale : 1.0;
  float v[kValuesPerLane];
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i)
    v[i] = k0 + i < a.K ? dev_route_scale_bf16(dev_swiglu(x[i], y[i], s.limit), g) : 0.0f;
  act_quant_pair(a, m, p.b, p.lane, v);
}

// grid ceil(rows * K / kDequantThreads): thread per (t, k).
__global__ void act_dequant_fp8_kernel(ActDequantFp8Args a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x;
  if (i >= a.rows * a.K) return;
  const int64_t t = i / a.K, k = i % a.K;
  a.out[i] = dev_e4m3(a.codes[t * a.k_pad + k]) * a.scales[(k / kFp8ActBlock) * a.rows_pad + t];
}

constexpr int kRowSimThreads = 128;
constexpr int kElementThreads = 256;

// The block-scaled roundings of fp8_pow2_quant_sim (e4m3, code range ±448, amax floored at 1e-4)
// and the fp4 pow2 simulation (e2m1, ±6, floored at 6 * 2^-126): a block's scale from its amax
// (fmaxf-accumulated, which skips NaN as std::max(amax, |x|) does), s = 2^ceil(log2(amax / max)),
// then each value x <- code(clamp(x / s, ±max)) * s, the clamp in std::clamp's order (NaN passes).
__device__ inline float sim_amax_floor(bool fp8) { return fp8 ? 1e-4f : 6.0f * 0x1p-126f; }
__device__ inline float sim_scale(float amax, bool fp8) {
  return dev_e8m0(static_cast<uint8_t>(dev_pow2_scale_exponent(amax, fp8 ? 448.0f : 6.0f) + 127));
}
__device__ inline float sim_clamped(float x, float s, float m) {
  const float q = x / s;
  return q < -m ? -m : (m < q ? m : q);
}
// x's e4m3 code at scale s (the KV record's bytes, kv_record_encode_kernel; sim_round's fp8 value).
__device__ inline uint8_t sim_fp8_code(float x, float s) { return dev_f32_to_e4m3(sim_clamped(x, s, 448.0f)); }
__device__ inline float sim_round(float x, float s, bool fp8) {
  return fp8 ? dev_e4m3(sim_fp8_code(x, s)) * s : dev_e2m1(dev_f32_to_e2m1(sim_clamped(x, s, 6.0f))) * s;
}

// grid (n), block kRowSimThreads: block r rounds row r. Threads own disjoint values (bf16: a
// strided channel each; fp8/fp4: whole scale blocks; Hadamard: thread 0 the whole row), so no
// barrier is needed and nothing is read that another thread writes.
__global__ void row_sim_kernel(RowSimArgs a) {
  wait_previous_grid();
  float* row = a.rows ? a.rows[blockIdx.x] : a.x + static_cast<int64_t>(blockIdx.x) * a.row_stride;
  const float* in = a.src ? a.src + static_cast<int64_t>(blockIdx.x) * a.row_stride : row;
  const int64_t dims = a.dims;
  switch (a.kind) {
    case RowSimKind::kBf16:
      // 8 values a thread loaded before any store (load_ahead_store; in place, one at a time each
      // load waited for the store before it: the batch-1 step's embedding rows took 7.3 us, H100
      // kernel trace, 2026-12-07).
      load_ahead_store<8>(threadIdx.x, blockDim.x, dims, [&](int64_t c) { return in[c]; },
                          [&](int64_t c, float v) { row[c] = dev_bf16_round(v); });
      return;
    case RowSimKind::kFp8Pow2:
    case RowSimKind::kFp4Pow2Block32: {
      const bool fp8 = a.kind == RowSimKind::kFp8Pow2;
      const int64_t block = fp8 ? a.block : 32;
      for (int64_t b = threadIdx.x * block; b < dims; b += static_cast<int64_t>(blockDim.x) * block) {
        const int64_t e = b + block < dims ? b + block : dims;
        float amax = sim_amax_floor(fp8);
        for (int64_t i = b; i < e; ++i) amax = fmaxf(amax, fabsf(in[i]));
        const float s = sim_scale(amax, fp8);
        for (int64_t i = b; i < e; ++i) row[i] = sim_round(in[i], s, fp8);
      }
      return;
    }
    case RowSimKind::kHadamardBf16: {
      // hadamard_transform: the same fp64 butterflies in the same order, one fp64 scale, one
      // rounding to fp32, then bf16. dims <= kMaxHadamard, a power of two (checked on the host).
      if (threadIdx.x != 0 || dims > kMaxHadamard) return;
      double v[kMaxHadamard];
      for (int64_t i = 0; i < dims; ++i) v[i] = in[i];
      for (int64_t h = 1; h < dims; h *= 2)
        for (int64_t i = 0; i < dims; i += 2 * h)
          for (int64_t j = i; j < i + h; ++j) {
            const double x0 = v[j], x1 = v[j + h];
            v[j] = x0 + x1;
            v[j + h] = x0 - x1;
          }
      const double scale = 1.0 / sqrt(static_cast<double>(dims));
      for (int64_t i = 0; i < dims; ++i) row[i] = dev_bf16_round(__double2float_rn(v[i] * scale));
      return;
    }
  }
}

// The block-scaled kinds (fp8 / fp4 pow2) with a warp a scale block: grid over (row, block) pairs,
// kRowSimThreads / 32 a CTA. Lane l holds the block's values l, l + 32, ... (at most
// kSimBlockMax / 32), the block's amax is their fmaxf over the warp (max is exact in any order, and
// fmaxf skips NaN as the one-thread loop does), and every value goes through sim_round as in
// row_sim_kernel: the same bits. (A thread a block, row_sim_kernel's way, left a batch-1 row of
// 4096 to 32 threads each walking 128 values in turn: the MoE input's pass took 35 us on the H200.)
constexpr int64_t kSimBlockMax = 128;
// A warp's block [b, e) (e - b <= kSimBlockMax) through the block-scaled rounding: lane l holds the
// values b + l, b + l + 32, ... (value(i) gives value i), the block's amax their fmaxf over the warp,
// and store(i, r) takes each rounded value. All 32 lanes call it (warp_max).
template <class Value, class Store>
__device__ inline void sim_block_warp(int64_t b, int64_t e, int lane, bool fp8, Value value, Store store) {
  constexpr int kPer = static_cast<int>(kSimBlockMax / 32);
  float v[kPer];
  float amax = sim_amax_floor(fp8);
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = b + lane + 32 * u;
    v[u] = i < e ? value(i) : 0.0f;
    if (i < e) amax = fmaxf(amax, fabsf(v[u]));
  }
  const float s = sim_scale(warp_max(amax), fp8);
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = b + lane + 32 * u;
    if (i < e) store(i, sim_round(v[u], s, fp8));
  }
}

__global__ void row_sim_block_kernel(RowSimArgs a, int64_t blocks_per_row) {
  wait_previous_grid();
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kRowSimThreads / 32) + threadIdx.x / 32;
  if (w >= a.n * blocks_per_row) return;  // the whole warp leaves together
  const int64_t r = w / blocks_per_row, b = (w % blocks_per_row) * a.block;
  float* row = a.rows ? a.rows[r] : a.x + r * a.row_stride;
  const float* in = a.src ? a.src + r * a.row_stride : row;
  const int64_t e = b + a.block < a.dims ? b + a.block : a.dims;
  sim_block_warp(b, e, threadIdx.x % 32, a.kind == RowSimKind::kFp8Pow2, [&](int64_t i) { return in[i]; },
                 [&](int64_t i, float v) { row[i] = v; });
}

// grid (rows), kKvRecordThreads: warp w encodes the nope blocks w, w + 8, ...; then every thread the
// RoPE dims i = tid, tid + 256, ... and the padding bytes.
constexpr int kKvRecordThreads = 256;
__global__ void kv_record_encode_kernel(KvRecordArgs a) {
  wait_previous_grid();
  const KvRecordLayout& l = a.layout;
  const int64_t r = blockIdx.x;
  const float* in = a.in + r * a.in_stride;
  uint8_t* rec = a.rec_rows ? a.rec_rows[r] : a.rec + r * a.rec_stride;
  if (rec == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t b = warp; b < l.blocks; b += kKvRecordThreads / 32) {
    const float v0 = in[64 * b + lane], v1 = in[64 * b + lane + 32];
    const float amax = warp_max(fmaxf(sim_amax_floor(true), fmaxf(fabsf(v0), fabsf(v1))));
    const int k = dev_pow2_scale_exponent(amax, 448.0f);
    const float s = dev_e8m0(static_cast<uint8_t>(k + 127));
    rec[64 * b + lane] = sim_fp8_code(v0, s);
    rec[64 * b + lane + 32] = sim_fp8_code(v1, s);
    if (lane == 0) rec[l.scales_at + b] = static_cast<uint8_t>(k + 127);
  }
  for (int64_t p = l.scales_at + l.blocks + threadIdx.x; p < l.rope_at; p += blockDim.x) rec[p] = 0;
  for (int64_t i = threadIdx.x; i < l.rope_dim; i += blockDim.x) {
    const uint16_t h = dev_f32_to_bf16(in[l.nope + i]);  // (core/dtype.h f32_to_bf16's bits)
    rec[l.rope_at + 2 * i] = static_cast<uint8_t>(h & 0xffu);
    rec[l.rope_at + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
}

// grid (rows), kKvRecordThreads: thread per value.
__global__ void kv_record_decode_kernel(KvRecordArgs a) {
  wait_previous_grid();
  const KvRecordLayout& l = a.layout;
  const int64_t r = blockIdx.x;
  const uint8_t* rec = a.rec_in + r * a.rec_stride;
  float* out = a.out + r * a.out_stride;
  for (int64_t i = threadIdx.x; i < l.nope + l.rope_dim; i += blockDim.x) {
    if (i < l.nope) {
      // (A NaN operand's bits as the host's product keeps them, the code's first: the GPU's product
      // would give its canonical NaN.)
      const float c = dev_e4m3(rec[i]), s = dev_e8m0(rec[l.scales_at + i / 64]);
      out[i] = c != c ? c : s != s ? s : c * s;
    } else {
      const int64_t j = i - l.nope;
      out[i] = dev_bf16(static_cast<uint16_t>(rec[l.rope_at + 2 * j] | (rec[l.rope_at + 2 * j + 1] << 8)));
    }
  }
}

// kVec: four values a thread through 16-byte loads and stores (n a multiple of 4, x 16-byte aligned).
template <bool kVec>
__global__ void bf16_round_kernel(float* x, int64_t n) {
  wait_previous_grid();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kElementThreads + threadIdx.x) * (kVec ? 4 : 1);
  if (i >= n) return;
  if constexpr (kVec) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v = make_float4(dev_bf16_round(v.x), dev_bf16_round(v.y), dev_bf16_round(v.z), dev_bf16_round(v.w));
    *reinterpret_cast<float4*>(x + i) = v;
  } else {
    x[i] = dev_bf16_round(x[i]);
  }
}

// Block b copies chunk b % chunks ((kVec ? 4 : 1) x kElementThreads columns) of row b / chunks,
// each thread its column(s) from whichever part holds them (a search of at most kSplitColsParts
// widths): no division an element (a thread an element with i / width took 0.71 ms of a CSA layer's
// 8K prefill, this form 0.27; H200, 2026-12-04), and a row's chunks in parallel (a block a row made
// batch 1 slower). kVec: four columns a thread, where every part's width and the pointers allow
// 16-byte accesses (a part then never splits a thread's four); the stacks' widths are multiples of
// 8 (launch_split_cols' callers), so the one-column form is a fallback no test reaches.
template <bool kVec>
__global__ void split_cols_kernel(SplitColsArgs a, int64_t width, int chunks) {
  wait_previous_grid();
  constexpr int kPer = kVec ? 4 : 1;
  const int64_t r = blockIdx.x / chunks;
  int64_t c = (static_cast<int64_t>(blockIdx.x % chunks) * kElementThreads + threadIdx.x) * kPer;
  if (c >= width) return;
  const int64_t src = r * width + c;
  // The part holding column c: a walk over the parts with constant indices (unrolled), so the
  // arguments' arrays stay in the constant bank (an index known only at run time copied them to
  // the stack: a 96-byte frame).
  float* base = a.dst[0];
  int64_t cols = a.cols[0];
#pragma unroll
  for (int q = 1; q < kSplitColsParts; ++q) {
    if (q < a.parts && c >= cols) {
      c -= cols;
      base = a.dst[q];
      cols = a.cols[q];
    }
  }
  float* dst = base + r * cols + c;
  if constexpr (kVec) {
    float4 v = dev_parts_at4(a.src, src);
    if (a.round_bf16) v = make_float4(dev_bf16_round(v.x), dev_bf16_round(v.y), dev_bf16_round(v.z), dev_bf16_round(v.w));
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    const float v = dev_parts_at(a.src, src);
    *dst = a.round_bf16 ? dev_bf16_round(v) : v;
  }
}

// swiglu_kernel, route_scale_bf16_kernel and row_sim_block_kernel's fp8 rounding in one pass: a warp
// a (row, block), lane l the block's values l, l + 32, ... (as row_sim_block_kernel), each value the
// same operations (dev_swiglu, dev_route_scale_bf16, sim_round with the block's fmaxf amax): the same
// bits. Each value is read and written by one lane, so out may be a (in place).
__global__ void swiglu_sim_fp8_kernel(SwigluSimArgs a, int64_t blocks_per_row) {
  wait_previous_grid();
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kRowSimThreads / 32) + threadIdx.x / 32;
  if (w >= a.R * blocks_per_row) return;  // the whole warp leaves together
  const int64_t r = w / blocks_per_row, b = (w % blocks_per_row) * a.block;
  const int64_t e = b + a.block < a.F ? b + a.block : a.F;
  const double g = a.weights ? static_cast<double>(a.weights[a.slots[r]]) * a.scale : 1.0;
  const int64_t row = r * a.stride;
  float* out = a.out + r * a.F;
  sim_block_warp(b, e, threadIdx.x % 32, true,
                 [&](int64_t i) {
                   return dev_route_scale_bf16(dev_swiglu(dev_parts_at(a.a, row + i), dev_parts_at(a.b, row + i), a.limit), g);
                 },
                 [&](int64_t i, float v) { out[i] = v; });
}

__global__ void route_scale_bf16_kernel(RouteScaleArgs a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kElementThreads + threadIdx.x;
  if (i >= a.R * a.F) return;
  const int64_t r = i / a.F;
  const double g = a.weights ? static_cast<double>(a.weights[a.slots[r]]) * a.scale : 1.0;
  a.h[i] = dev_route_scale_bf16(a.h[i], g);
}

}  // namespace

void launch_row_sim(const RowSimArgs& a) {
  if (a.n <= 0 || a.dims <= 0) return;
  SPARROW_CHECK(a.src == nullptr || (a.rows == nullptr && a.dims == a.row_stride));
  const int64_t block = a.kind == RowSimKind::kFp8Pow2 ? a.block : a.kind == RowSimKind::kFp4Pow2Block32 ? 32 : 0;
  static const bool warp_blocks = cuda_feature_on("sim_warp");
  if (warp_blocks && block > 0 && block <= kSimBlockMax) {
    RowSimArgs b = a;
    b.block = block;
    const int64_t per_row = (a.dims + block - 1) / block;
    launch(row_sim_block_kernel, blocks_for(a.n * per_row, kRowSimThreads / 32), kRowSimThreads, 0, b, per_row);
    return;
  }
  launch(row_sim_kernel, static_cast<unsigned>(a.n), kRowSimThreads, 0, a);
}

void launch_bf16_round(float* x, int64_t n) {
  if (n <= 0) return;
  if (four_wide(n, x))
    launch(bf16_round_kernel<true>, blocks_for(n / 4, kElementThreads), kElementThreads, 0, x, n);
  else
    launch(bf16_round_kernel<false>, blocks_for(n, kElementThreads), kElementThreads, 0, x, n);
}

void launch_split_cols(const SplitColsArgs& a) {
  int64_t width = 0;
  bool vec = parts_view_four_wide(a.src);
  for (int p = 0; p < a.parts; ++p) {
    width += a.cols[p];
    vec = vec && a.cols[p] % 4 == 0 && aligned16(a.dst[p]);
  }
  if (a.rows * width <= 0) return;
  const int chunks = static_cast<int>(blocks_for(width, (vec ? 4 : 1) * kElementThreads));
  SPARROW_CHECK(a.rows * chunks < (int64_t{1} << 31) && "split_cols' grid");
  const unsigned blocks = static_cast<unsigned>(a.rows * chunks);
  if (vec)
    launch(split_cols_kernel<true>, blocks, kElementThreads, 0, a, width, chunks);
  else
    launch(split_cols_kernel<false>, blocks, kElementThreads, 0, a, width, chunks);
}

void launch_route_scale_bf16(const RouteScaleArgs& a) {
  if (a.R * a.F > 0) launch(route_scale_bf16_kernel, blocks_for(a.R * a.F, kElementThreads), kElementThreads, 0, a);
}

void launch_swiglu_sim_fp8(const SwigluSimArgs& a) {
  SPARROW_CHECK(a.block > 0 && a.block <= kSimBlockMax);
  if (a.R <= 0 || a.F <= 0) return;
  const int64_t per_row = (a.F + a.block - 1) / a.block;
  launch(swiglu_sim_fp8_kernel, blocks_for(a.R * per_row, kRowSimThreads / 32), kRowSimThreads, 0, a, per_row);
}

namespace {
// The many-pair form (calls of kQuantHalfPairs or more; `act_quant_half` off: act_quant_fp8_kernel<4>
// from kQuantManyPairs, one pair a warp below): a half-warp a pair, 8 values a lane (lane l of half
// h: inputs 8 (l % 16) .. + 7 of its block, the one-pair kernel's lanes 2 (l % 16) and
// 2 (l % 16) + 1), two pairs at once and kPer such steps a warp, every step's
// loads issued before the first one's arithmetic. The max over 16 lanes, the scale, each value's
// code and where it goes are the one-pair kernel's, so the same codes and scales; a warp's fixed
// work (its pair's place, the max's shuffles, the scale) serves 8 values a lane instead of 4. (At
// 8192 x 4096 the four-pair form issues about 230 instructions a warp per pair and is bound by
// them: 72 us, 2.25 TB/s, on an H100, 2026-12-05.)
constexpr int kHalfValues = 2 * kValuesPerLane;  // 8
template <int kPer>
__global__ void act_quant_fp8_half_kernel(ActQuantFp8Args a) {
  wait_previous_grid();
  const int lane = threadIdx.x % 32, hl = lane % 16;
  // (32-bit pair numbers and divisions: the launch checks that the pairs fit.)
  const uint32_t nblocks = static_cast<uint32_t>(a.k_pad / kFp8ActBlock);
  const uint32_t total = static_cast<uint32_t>(a.rows_pad * nblocks);
  const uint32_t first = ((blockIdx.x * kQuantWarps + threadIdx.x / 32) * kPer) * 2 + lane / 16;
  const bool vec = a.in_dtype == DType::kF32 && a.in_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.in) % 16 == 0;
  int64_t m[kPer], b[kPer];
  bool ok[kPer];
  float v[kPer][kHalfValues];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const uint32_t pair = first + 2 * u;
    ok[u] = false;
    m[u] = 0, b[u] = 0;
#pragma unroll
    for (int i = 0; i < kHalfValues; ++i) v[u][i] = 0.0f;
    if (pair >= total) continue;
    const uint32_t mm = pair / nblocks;
    m[u] = mm, b[u] = pair - mm * nblocks;
    if (m[u] >= a.rows) {  // a padding row: the one-pair kernel's lanes 2 hl and 2 hl + 1 (scale 1 by hl 0)
      act_quant_pad(a, m[u], b[u], 2 * hl);
      act_quant_pad(a, m[u], b[u], 2 * hl + 1);
      continue;
    }
    ok[u] = true;
    const int64_t k0 = b[u] * kFp8ActBlock + hl * kHalfValues, at = m[u] * a.in_stride + k0;
    if (vec && k0 + kHalfValues <= a.K) {
      const float4 q0 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.in) + at);
      const float4 q1 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.in) + at + 4);
      v[u][0] = q0.x, v[u][1] = q0.y, v[u][2] = q0.z, v[u][3] = q0.w;
      v[u][4] = q1.x, v[u][5] = q1.y, v[u][6] = q1.z, v[u][7] = q1.w;
    } else {
#pragma unroll
      for (int i = 0; i < kHalfValues; ++i) v[u][i] = k0 + i < a.K ? load_input(a, at + i) : 0.0f;
    }
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    // Every lane takes part in the shuffles (a half without a pair brings the floor, unused).
    float amax = 1e-4f;
#pragma unroll
    for (int i = 0; i < kHalfValues; ++i) amax = fmaxf(amax, fabsf(v[u][i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (!ok[u]) continue;
    float s, inv;
    act_quant_scale(amax, s, inv);
    const uint32_t c0 = act_quant_codes4(v[u], inv), c1 = act_quant_codes4(v[u] + kValuesPerLane, inv);
    uint8_t* row = a.codes + m[u] * a.k_pad;
    if (a.w4a8_order) {
      *reinterpret_cast<uint32_t*>(row + act_quant_code_at(a, b[u], 2 * hl)) = c0;
      *reinterpret_cast<uint32_t*>(row + act_quant_code_at(a, b[u], 2 * hl + 1)) = c1;
    } else {  // (8 contiguous bytes: k_pad and the block's offset are multiples of 128)
      *reinterpret_cast<uint2*>(row + b[u] * kFp8ActBlock + hl * kHalfValues) = make_uint2(c0, c1);
    }
    if (hl == 0) a.scales[b[u] * a.rows_pad + m[u]] = s;
  }
}

// The (row, block) pairs of a call, which the kernels count in 32 bits.
int64_t quant_pairs(const ActQuantFp8Args& a) {
  const int64_t pairs = a.rows_pad * (a.k_pad / kFp8ActBlock);
  SPARROW_CHECK(pairs < (int64_t{1} << 31) && "act_quant's (row, block) pairs are counted in 32 bits");
  return pairs;
}
}  // namespace

// SPARROW_CUDA_REPEAT_ACT_QUANT=n (0 to 8, default 0): n more launches of each act_quant, writing the
// same codes and scales (its input is never its output): add_parts' probe of a launch's cost.
void launch_act_quant_fp8(const ActQuantFp8Args& a) {
  static const int repeat = cuda_probe_repeats("SPARROW_CUDA_REPEAT_ACT_QUANT");
  static const bool half_on = cuda_feature_on("act_quant_half");
  // The pairs from which the half-warp form takes a call (tuning: SPARROW_CUDA_ACT_QUANT_HALF_FROM).
  static const int64_t half_from =
      cuda_env_int("SPARROW_CUDA_ACT_QUANT_HALF_FROM", kQuantHalfPairs, [](int64_t n) { return n >= 1; },
                   "act_quant's half-warp form needs a positive count of (row, block) pairs to start from");
  const int64_t pairs = quant_pairs(a);
  for (int r = 0; r <= repeat; ++r) {
    if (pairs >= half_from && half_on)
      launch(act_quant_fp8_half_kernel<2>, blocks_for(pairs, kQuantWarps * 2 * 2), 32 * kQuantWarps, 0, a);
    else if (pairs >= kQuantManyPairs) launch(act_quant_fp8_kernel<4>, blocks_for(pairs, kQuantWarps * 4), 32 * kQuantWarps, 0, a);
    else if (pairs > 0) launch(act_quant_fp8_kernel<1>, blocks_for(pairs, kQuantWarps), 32 * kQuantWarps, 0, a);
  }
}

void launch_swiglu_quant_fp8(const SwigluQuantArgs& a) {
  const int64_t pairs = quant_pairs(a.q);
  SwigluQuantArgs s = a;
  s.four_wide = parts_view_four_wide(a.h1) && parts_view_four_wide(a.h3);
  if (pairs > 0) launch(swiglu_quant_fp8_kernel, blocks_for(pairs, kQuantWarps), 32 * kQuantWarps, 0, s);
}

void launch_kv_record_encode(const KvRecordArgs& a) {
  if (a.rows > 0) launch(kv_record_encode_kernel, static_cast<unsigned>(a.rows), kKvRecordThreads, 0, a);
}
void launch_kv_record_decode(const KvRecordArgs& a) {
  if (a.rows > 0) launch(kv_record_decode_kernel, static_cast<unsigned>(a.rows), kKvRecordThreads, 0, a);
}

void launch_act_dequant_fp8(const ActDequantFp8Args& a) {
  if (a.rows * a.K > 0) launch(act_dequant_fp8_kernel, blocks_for(a.rows * a.K, kDequantThreads), kDequantThreads, 0, a);
}

// This translation unit's trace region (kernels.h set_kernel_trace).
cudaError_t set_kernel_trace_fp8(KernelTraceSlot* region) { return set_kernel_trace_here(region); }

}  // namespace sparrow::cuda
