// Linear layers over weights in their checkpoint formats (float, FP8 block-scaled, packed FP4),
// dequantised element by element as they are read. One warp per output row n and a tile of up to
// kTokenTile tokens: the lanes stride over K, so each weight element is decoded once per tile and
// the reduction order is fixed (a token's result does not depend on the other tokens).
#include <cuda_bf16.h>
#include <cuda.h>  // CUtensorMap (the map is encoded through the runtime's driver entry point)
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/wgmma.cuh"
#include "backends/cuda/tile_raster.h"
#include "core/check.h"

namespace sparrow::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kTokenTile = 8;
static_assert(kTokenTile == kMoeTileRows, "a grouped-expert work item is one token tile");

// The input rows of a tile's tokens (row-group offset applied; tokens past a.T repeat the first
// and are not written); returns how many of the kTokenTile tokens are real.
__device__ inline int64_t tile_inputs(const LinearArgs& a, int64_t n, int64_t t0, const float* (&x)[kTokenTile]) {
  const int64_t nt = a.T - t0 < kTokenTile ? a.T - t0 : kTokenTile;
  const int64_t col0 = (n / a.rows_per_group) * a.w.in;
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const int64_t t = t0 + (j < nt ? j : 0);
    const int64_t row = a.in_rows ? a.in_rows[t] : t;
    x[j] = a.in + row * a.in_stride + col0;
  }
  return nt;
}

// One warp: output row n for the tokens t0 .. t0 + kTokenTile - 1 below a.T. Lane l sums inputs
// l, l + 32, l + 64, ... in that order; it decodes kElementUnroll of its weights before adding any
// (at batch 1 a row of 4096 is 128 weights a lane, and one load at a time left the warp waiting on
// memory latency: the router's and the compressors' float weights ran at about 0.1 TB/s).
constexpr int kElementUnroll = 8;

// Weight (n, k) as weight_at decodes it; kFloatDtype (a float weight of a dtype known at compile
// time: 1 BF16, 2 F32) reads it directly instead of through weight_at's format and dtype switches
// (the same value: the router's and compressors' weights spent ~56 instructions an element there).
template <int kFloatDtype>
__device__ inline float tile_weight(const DevWeight& w, int64_t n, int64_t k) {
  if constexpr (kFloatDtype == 1) return dev_bf16(static_cast<const uint16_t*>(w.data)[n * w.in + k]);
  else if constexpr (kFloatDtype == 2) return static_cast<const float*>(w.data)[n * w.in + k];
  else return weight_at(w, n, k);
}

template <int kFloatDtype>
__device__ void linear_tile(const LinearArgs& a, int64_t n, int64_t t0, int lane) {
  const int64_t K = a.w.in;
  const float* x[kTokenTile];
  const int64_t nt = tile_inputs(a, n, t0, x);
  float acc[kTokenTile] = {};
  for (int64_t k0 = lane; k0 < K; k0 += 32 * kElementUnroll) {
    float w[kElementUnroll];
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const int64_t k = k0 + 32 * u;
      w[u] = k < K ? tile_weight<kFloatDtype>(a.w, n, k) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const int64_t k = k0 + 32 * u;
      if (k >= K) break;
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j)
        if (j < nt) acc[j] += w[u] * x[j][k];
    }
  }
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const float v = warp_sum(acc[j]);
    if (lane == 0 && j < nt) a.out[(t0 + j) * a.w.out + n] = v;
  }
}

// The vectorized kernel (LinearArgs::vectorized): the same warp-per-row, token-tile layout; lane l
// takes 16-byte chunks c = l, l + 32, ... of its row (16 FP8 inputs or 32 FP4 inputs, all under one
// scale), sums the chunk's products against each token's inputs (float4 loads), scales that sum
// once and adds it to the token's accumulator. A token's arithmetic does not depend on the others.
// The weight loads of kChunkUnroll consecutive chunks are issued before any is used (a GEMV at
// batch 1 waits on memory latency, one load at a time otherwise); the chunks are then summed in
// the same order as before, so the results are the same bits.
constexpr int kChunkUnroll = 4;

template <bool kFp4>
__device__ void linear_vec_tile(const LinearArgs& a, int64_t n, int64_t t0, int lane) {
  constexpr int kIn = kFp4 ? 32 : 16;  // inputs per 16-byte chunk
  const int64_t K = a.w.in;
  const float* x[kTokenTile];
  const int64_t nt = tile_inputs(a, n, t0, x);
  const int64_t row_bytes = kFp4 ? K / 2 : K;
  // (MXFP4: chunk c at fp4_offset(.., n, 16 c), the rows tiled where a.w.fp4_tiled.)
  const bool tiled = kFp4 && a.w.fp4_tiled;
  const uint8_t* wrow = static_cast<const uint8_t*>(a.w.data) + fp4_offset(tiled, row_bytes, n, 0);
  const int64_t group_step = fp4_group_step(tiled);
  const DevView scales{a.w.scale, a.w.scale_dtype};
  const int64_t scale_row = (kFp4 ? n : n / a.w.block_out) * a.w.scale_cols;
  const int64_t chunks = K / kIn;
  float acc[kTokenTile] = {};
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kChunkUnroll) {
    uint4 vs[kChunkUnroll];
    float ss[kChunkUnroll];
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < chunks) {
        vs[u] = __ldg(reinterpret_cast<const uint4*>(wrow + (c / 4) * group_step + 16 * (c % 4)));
        ss[u] = dev_load(scales, scale_row + c * kIn / a.w.block_in);
      }
    }
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      const int64_t k0 = c * kIn;
      if constexpr (kFp4) {  // (the device layout's words in the released one: fp4_layout.h)
        vs[u].x = fp4_word_released(vs[u].x), vs[u].y = fp4_word_released(vs[u].y);
        vs[u].z = fp4_word_released(vs[u].z), vs[u].w = fp4_word_released(vs[u].w);
      }
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&vs[u]);
      float w[kIn];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if constexpr (kFp4) {
          w[2 * i] = dev_e2m1(b[i] & 0xf);  // low nibble: the even input
          w[2 * i + 1] = dev_e2m1(b[i] >> 4);
        } else {
          w[i] = dev_e4m3(b[i]);
        }
      }
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j) {
        if (j < nt) {
          const float4* xv = reinterpret_cast<const float4*>(x[j] + k0);
          float part = 0.0f;
#pragma unroll
          for (int q = 0; q < kIn / 4; ++q) {
            const float4 xx = xv[q];
            part += w[4 * q] * xx.x + w[4 * q + 1] * xx.y + w[4 * q + 2] * xx.z + w[4 * q + 3] * xx.w;
          }
          acc[j] += part * ss[u];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const float v = warp_sum(acc[j]);
    if (lane == 0 && j < nt) a.out[(t0 + j) * a.w.out + n] = v;
  }
}

// grid (ceil(N / kWarpsPerBlock), ceil(T / kTokenTile)), block (32 * kWarpsPerBlock).
// 0: element-wise, 1: vectorized FP8, 2: vectorized FP4, 3 and 4: element-wise over a BF16 or F32
// float weight (0's arithmetic, the same bits).
template <int kPath>
__device__ inline void tile(const LinearArgs& a, int64_t n, int64_t t0) {
  if constexpr (kPath == 0) linear_tile<0>(a, n, t0, threadIdx.x % 32);
  else if constexpr (kPath == 3) linear_tile<1>(a, n, t0, threadIdx.x % 32);
  else if constexpr (kPath == 4) linear_tile<2>(a, n, t0, threadIdx.x % 32);
  else linear_vec_tile<kPath == 2>(a, n, t0, threadIdx.x % 32);
}

// The kernel path for a launch: element-wise unless the caller asked for and allows vectorized.
int kernel_path(bool vectorized, WeightFormat f) {
  static const bool on = cuda_feature_on("vec_linear");
  if (!vectorized || !on) return 0;
  return f == WeightFormat::kFp4Packed ? 2 : 1;
}

// The element-wise path specialised for a float weight's dtype where there is one.
int element_path(const DevWeight& w) {
  if (w.format != WeightFormat::kFloat) return 0;
  return w.dtype == DType::kBF16 ? 3 : w.dtype == DType::kF32 ? 4 : 0;
}

template <int kPath>
__global__ void linear_kernel(LinearArgs a) {
  wait_previous_grid();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= a.w.out) return;  // the whole warp leaves together
  tile<kPath>(a, n, static_cast<int64_t>(blockIdx.y) * kTokenTile);
}

// grid (max_items, ceil(N / kWarpsPerBlock)), the same block: work item x = (expert, first row of
// its tile) from the plan (on grid x, which allows 2^31 - 1 blocks: a long prefill has more than
// grid y's 65,535 items); blocks past *n_items leave.
template <int kPath>
__global__ void grouped_expert_linear_kernel(GroupedExpertLinearArgs g) {
  wait_previous_grid();
  const int64_t item = blockIdx.x;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= g.N) return;
  LinearArgs a{.out = g.out + r0 * g.N, .in = g.in_rows ? g.in : g.in + r0 * g.in_stride,
               .in_rows = g.in_rows ? g.in_rows + r0 : nullptr, .w = g.w[e], .T = R, .in_stride = g.in_stride,
               .rows_per_group = g.N};
  tile<kPath>(a, n, t0);
}

// ---- W4A8 routed experts on the tensor cores -------------------------------------------------
//
// sm_90 has no FP8 mma.sync (only wgmma): ptxas lowers mma.sync.m16n8k32.e4m3 to an e4m3 -> f16
// conversion of both operands and two f16 HMMA.16816 (seen in the SASS on the H200, 2026-12-01), so
// these kernels do that themselves, once per operand value: the e4m3 activation codes become f16
// (exact), the MXFP4 weights f16 straight from e2m1 (exact, times 2^-14), and each 32-input block is
// two mma.sync.m16n8k16 f16 -> fp32 steps, the second accumulating on the first.
//
// The arithmetic of one output (row r, column n), shared by both kernels (so their bits agree):
// K's 128-input groups are cut in kW4A8Warps contiguous quarters (w4a8_quarter); in each quarter,
// group by group: gs = 0; for each 32-input block j of the group, d = the block's two-step mma
// result, gs = fma(d, ws_j, gs) (ws_j: the weight's block scale times 2^14, exact); then
// acc_q = fma(gs, sa, acc_q) (sa: the row's activation scale of the group). The output is
// ((acc_0 + acc_1) + acc_2) + acc_3. Every order depends on K alone, never on the rows or the batch.
//
// Operand layout. The mma's M (16) is 16 output columns, its N (8) is 8 rows, so a decode tile of
// up to 8 rows fills it. Lane l (gid = l / 4, tig = l % 4) holds, of each 32-input block, inputs
// 8 tig .. 8 tig + 7 (k0..k7 below) of its columns gid and gid + 8 and of its row gid: one 4-byte
// word of each packed weight row, 8 bytes of the code row. Both become four f16x2 words pairing
// (k0, k2), (k4, k6), (k1, k3), (k5, k7); step 0 takes the first two as its k-slots (2 tig, 2 tig + 1)
// and (2 tig + 8, 2 tig + 9), step 1 the last two. Which input a slot stands for only has to agree
// between the two operands: the mma sums all 16 slots of a step.

constexpr int kW4A8Warps = 4;     // K quarters (split-K, fixed)
constexpr int kW4A8GroupK = 128;  // inputs of a group: 4 MXFP4 blocks, one activation scale
static_assert(kW4A8GroupK == kFp8ActBlock && kW4A8GroupK / 32 == 4, "a group is one activation block of 4 MXFP4 blocks");
static_assert(kMoeTileRows == 8, "a work item's tile of 8 rows is the mma's N");

// Quarter p of G groups is [w4a8_quarter(p, G), w4a8_quarter(p + 1, G)) (some empty when G < 4).
__device__ inline int w4a8_quarter(int p, int groups) { return p * groups / kW4A8Warps; }

// e2m1 -> f16 times 2^-14 from a device word (fp4_layout.h): the code's sign to bit 15, its
// exponent and mantissa bits to 11..9 (an f16 exponent field of e, mantissa m: (1 + m / 2) 2^(e -
// 15) = v 2^-14; e = 0, m = 1 is the f16 subnormal 2^-15 = 0.5 2^-14), all in the f16's high byte:
// s000eem0. The even inputs' high bytes come out of one shift-and-mask pass over the word (the
// magnitudes) and a byte permute of w and w << 4 (the signs: inputs 0, 2 at bits 7, 23 of w, 4, 6 at
// bits 7, 23 of w << 4), the odd ones' likewise, and a byte permute each sets two of them over zero
// low bytes. Words: (k0, k2), (k4, k6), (k1, k3), (k5, k7), the first of each pair in the low half.
__device__ inline void e2m1x8_to_f16x8(uint32_t w, uint32_t (&r)[4]) {
  const uint32_t w4 = w << 4;
  const uint32_t even = (__byte_perm(w, w4, 0x6420) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);  // bytes: inputs 0, 2, 4, 6
  const uint32_t odd = (__byte_perm(w, w4, 0x7531) & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);   // bytes: inputs 1, 3, 5, 7
  r[0] = __byte_perm(even, 0u, 0x1404);
  r[1] = __byte_perm(even, 0u, 0x3424);
  r[2] = __byte_perm(odd, 0u, 0x1404);
  r[3] = __byte_perm(odd, 0u, 0x3424);
}
constexpr float kE2m1F16Scale = 16384.0f;  // 2^14: what the weight scales carry for the e2m1 -> f16 shift

// Eight e4m3 codes (x: k0..k3, y: k4..k7) as f16 (exact), paired as the weights are.
__device__ inline uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
__device__ inline void e4m3x8_to_f16x8(uint2 c, uint32_t (&r)[4]) {
  const uint32_t lo = __byte_perm(c.x, c.y, 0x6420);  // k0, k2, k4, k6
  const uint32_t hi = __byte_perm(c.x, c.y, 0x7531);  // k1, k3, k5, k7
  r[0] = e4m3x2_to_f16x2(lo & 0xffffu);
  r[1] = e4m3x2_to_f16x2(lo >> 16);
  r[2] = e4m3x2_to_f16x2(hi & 0xffffu);
  r[3] = e4m3x2_to_f16x2(hi >> 16);
}

// d = A (16 x 16, f16, row) x B (16 x 8, f16, col) + c, fp32.
__device__ inline void mma_f16_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1, const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// One 32-input block for a 16 x 8 tile: wa / wb the f16 words of the lane's columns gid / gid + 8,
// x its row's. d's slots: (column gid, rows 2 tig, 2 tig + 1), (column gid + 8, the same rows).
__device__ inline void w4a8_block(float (&d)[4], const uint32_t (&wa)[4], const uint32_t (&wb)[4], const uint32_t (&x)[4]) {
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_f16_16x8x16(d, wa[0], wb[0], wa[1], wb[1], x[0], x[1], zero);
  mma_f16_16x8x16(d, wa[2], wb[2], wa[3], wb[3], x[2], x[3], d);
}

// The weight block scale the f16 weights need (x 2^14), for the packed e8m0 layout or any other.
__device__ inline float w4a8_weight_scale(const DevWeight& W, int64_t n, int64_t b) {
  return dev_load(DevView{W.scale, W.scale_dtype}, n * W.scale_cols + b) * kE2m1F16Scale;
}
__device__ inline float w4a8_e8m0_scale(uint32_t four, int j) {
  return dev_e8m0(static_cast<uint8_t>(four >> (8 * j))) * kE2m1F16Scale;
}
// Whether every byte of a packed word is plain, 1..240, and block j's scale from such a word: for
// those bytes 2^(e - 127) 2^14 is the float with exponent field e + 14, written directly (the same
// value as w4a8_e8m0_scale's). A word with another byte (0: a subnormal scale, 241..254: an infinite
// product, 255: NaN) goes through w4a8_e8m0_scale; the kernels check a group's words at once.
__device__ inline bool w4a8_plain_scales(uint32_t four) {
  return __vcmpgeu4(__vsub4(four, 0x01010101u), 0xf0f0f0f0u) == 0u;
}
__device__ inline float w4a8_plain_scale(uint32_t four, int j) {
  return __uint_as_float((((four >> (8 * j)) & 0xffu) + 14u) << 23);
}
// Packed e8m0 scales (a column's 4 block scales of a group in one aligned word): every group whole.
__device__ inline bool w4a8_packed_scales(const DevWeight& W) {
  return W.scale_dtype == DType::kF8E8M0 && W.scale_cols % 4 == 0;
}
// Block j of a group's weight scale for column col (block index `block`): from the column's packed
// word (kPlain: every byte of the group's words plain, w4a8_plain_scale), or for other layouts from
// the weight's scale tensor (0 past N).
template <bool kPlain>
__device__ inline float w4a8_group_scale(bool packed, uint32_t word, int j, const DevWeight& W, int col, int N, int block) {
  if (kPlain) return w4a8_plain_scale(word, j);
  if (packed) return w4a8_e8m0_scale(word, j);
  return col < N ? w4a8_weight_scale(W, col, block) : 0.0f;
}

// Small kernel: a block is 16 kTiles output columns (kTiles m16 tiles: each code converted once
// for all of them) x one 8-row tile; warp w takes quarter w of the groups and streams them through
// its own kSmallStages-deep ring in shared memory (cp.async: the loads of the next two groups are in
// flight while one is computed, without holding registers); the quarters' sums are added in warp
// order through shared memory. The width is not part of the arithmetic (every output's sums are the
// same for any kTiles): 32 columns for large batches (two tiles share each converted code and the
// per-group work), 16 for small ones (twice the blocks: at batch 1 on the H200, w1 and w3 took
// 0.051 ms at 16 columns against 0.066 at 32).
constexpr int kSmallStages = 3;
constexpr int kSmallWStride = 80;   // bytes of a staged column (64 + 16: the 8 x 4 lanes' words hit distinct banks)
constexpr int kSmallXStride = 160;  // bytes of a staged row (128 + 32: the lanes' 8-byte loads hit distinct banks)
template <int kTiles>
struct SmallStage {
  static constexpr int kCols = 16 * kTiles;
  uint8_t w[kCols * kSmallWStride];         // the columns' 64 bytes of the group
  uint8_t x[kMoeTileRows * kSmallXStride];  // the 8 rows' 128 codes
  uint32_t ws[32];                          // packed e8m0 scales: a column's 4 blocks (lane < kCols)
  float sa[kMoeTileRows];                   // activation scales of the group
};
static_assert(sizeof(SmallStage<1>) % 16 == 0 && sizeof(SmallStage<2>) % 16 == 0, "stages stay 16-byte aligned");
template <int kTiles>
constexpr size_t small_smem_bytes() { return sizeof(SmallStage<kTiles>) * kSmallStages * kW4A8Warps; }

template <int kTiles>
__global__ void __launch_bounds__(32 * kW4A8Warps) grouped_w4a8_kernel(GroupedW4A8Args g) {
  wait_previous_grid();
  constexpr int kCols = SmallStage<kTiles>::kCols;
  using Stage = SmallStage<kTiles>;
  const int64_t item = blockIdx.x;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int N = static_cast<int>(g.N), K = static_cast<int>(g.K);
  const int n0 = static_cast<int>(blockIdx.y) * kCols;
  const DevWeight W = g.w[e];
  const bool packed = w4a8_packed_scales(W);
  const int blocks = K / 32, groups = (K + kW4A8GroupK - 1) / kW4A8GroupK;
  const int first = w4a8_quarter(warp, groups), last = w4a8_quarter(warp + 1, groups);
  extern __shared__ __align__(16) uint8_t small_smem[];
  Stage* ring = reinterpret_cast<Stage*>(small_smem) + warp * kSmallStages;
  __shared__ float part[kW4A8Warps][32][4 * kTiles];

  // What this lane copies per group: weight pieces p = lane + 32 i (column p / 4, block p % 4 =
  // lane % 4), code pieces p = lane, lane + 32 (row p / 8, 16 bytes p % 8), column lane's scales,
  // lanes 0..7 also a row's activation scale.
  const auto* wdata = static_cast<const uint8_t*>(W.data);
  const auto src_of = [&](int64_t tr) { return tr < R ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : int64_t{-1}; };
  constexpr int kWPieces = kCols * 4 / 32;
  const int wblk = lane % 4;
  const uint8_t* wsrc[kWPieces];
  bool wcol_ok[kWPieces];
  const int64_t wgroup_step = fp4_group_step(W.fp4_tiled);  // (fp4_layout.h: the rows tiled or not)
#pragma unroll
  for (int i = 0; i < kWPieces; ++i) {
    const int col = n0 + (lane + 32 * i) / 4;
    wcol_ok[i] = col < N;
    wsrc[i] = wdata + fp4_offset(W.fp4_tiled, K / 2, wcol_ok[i] ? col : 0, 16 * wblk);
  }
  const uint8_t* xsrc[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int p = lane + 32 * i;
    const int64_t src = src_of(t0 + p / 8);
    xsrc[i] = src >= 0 ? g.codes + src * g.k_pad + 16 * (p % 8) : nullptr;
  }
  const int scol = n0 + lane;
  const bool scol_ok = lane < kCols && scol < N && packed;
  const uint8_t* ssrc = static_cast<const uint8_t*>(W.scale) + static_cast<int64_t>(scol_ok ? scol : 0) * W.scale_cols;
  const int64_t arow_src = lane < kMoeTileRows ? src_of(t0 + lane) : -1;
  auto issue = [&](int kg) {
    if (kg < last) {
      Stage& st = ring[kg % kSmallStages];
#pragma unroll
      for (int i = 0; i < kWPieces; ++i)
        cp_async(st.w + ((lane + 32 * i) / 4) * kSmallWStride + 16 * wblk, wsrc[i] + wgroup_step * kg,
                 wcol_ok[i] && 4 * kg + wblk < blocks, 16);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int p = lane + 32 * i;
        cp_async(st.x + (p / 8) * kSmallXStride + 16 * (p % 8), xsrc[i] ? xsrc[i] + kW4A8GroupK * kg : g.codes,
                 xsrc[i] != nullptr, 16);
      }
      cp_async(&st.ws[lane], ssrc + 4 * kg, scol_ok, 4);
      if (lane < kMoeTileRows)
        cp_async(&st.sa[lane], g.scales + static_cast<int64_t>(kg) * g.rows_pad + (arow_src >= 0 ? arow_src : 0),
                 arow_src >= 0, 4);
    }
    cp_async_commit();  // (an empty group past the quarter's end keeps the wait count uniform)
  };

  // This lane's columns: tile mt's A rows gid, gid + 8, i.e. n0 + 16 mt + gid (+ 8).
  float acc[kTiles][4] = {};
  for (int i = 0; i < kSmallStages - 1; ++i) issue(first + i);
  for (int kg = first; kg < last; ++kg) {
    issue(kg + kSmallStages - 1);
    cp_async_wait<kSmallStages - 1>();
    __syncwarp();
    const Stage& st = ring[kg % kSmallStages];
    uint32_t sw[kTiles][2];  // packed scales of this lane's columns 16 mt + gid (+ 8 for h = 1)
    bool plain = packed && 4 * kg + 4 <= blocks;
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sw[mt][h] = st.ws[16 * mt + gid + 8 * h];
        plain = plain && w4a8_plain_scales(sw[mt][h]);
      }
    const float sa[2] = {st.sa[2 * tig], st.sa[2 * tig + 1]};
    float gs[kTiles][4] = {};
    // One group's block sums: kPlain a whole group whose packed scales are all direct (branch-free);
    // else any group, any scale layout.
    const auto group_sums = [&](auto plain_tag) {
      constexpr bool kPlain = decltype(plain_tag)::value;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (!kPlain && 4 * kg + j >= blocks) break;  // the same for the whole block
        uint32_t fx[4];
        e4m3x8_to_f16x8(*reinterpret_cast<const uint2*>(st.x + gid * kSmallXStride + 32 * j + 8 * tig), fx);
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          uint32_t fa[4], fb[4];
          e2m1x8_to_f16x8(*reinterpret_cast<const uint32_t*>(st.w + (16 * mt + gid) * kSmallWStride + 16 * j + 4 * tig), fa);
          e2m1x8_to_f16x8(*reinterpret_cast<const uint32_t*>(st.w + (16 * mt + gid + 8) * kSmallWStride + 16 * j + 4 * tig), fb);
          float ws[2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
            ws[h] = w4a8_group_scale<kPlain>(packed, sw[mt][h], j, W, n0 + 16 * mt + gid + 8 * h, N, 4 * kg + j);
          float d[4];
          w4a8_block(d, fa, fb, fx);
#pragma unroll
          for (int c = 0; c < 4; ++c) gs[mt][c] = __fmaf_rn(d[c], ws[c / 2], gs[mt][c]);
        }
      }
    };
    if (__all_sync(0xffffffffu, plain)) group_sums(std::true_type{});
    else group_sums(std::false_type{});
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][c] = __fmaf_rn(gs[mt][c], sa[c & 1], acc[mt][c]);
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) part[warp][lane][4 * mt + c] = acc[mt][c];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t tr = t0 + 2 * tig + (c & 1);
      const int n = n0 + 16 * mt + gid + (c < 2 ? 0 : 8);
      float v = part[0][lane][4 * mt + c];
#pragma unroll
      for (int w = 1; w < kW4A8Warps; ++w) v += part[w][lane][4 * mt + c];
      if (tr < R && n < N) g.out[(r0 + tr) * g.N + n] = v;
    }
}

// Tiled kernel (many rows an expert, as in prefill): a block computes rows t0 .. t0 + 63 of one
// expert (its tile: w4a8_find_tile) times 128 output columns with kTiledWarps warps, each owning
// kTiledMt m16 tiles of columns and four n8 tiles of rows (32 rows). The raw bytes of each group of
// 128 inputs (the columns' 64 bytes, the rows' 128 codes, their scales) stream through a
// kTiledStages-deep ring in shared memory (cp.async, two groups ahead; one barrier a group), laid
// out as the small kernel's stages, and each warp converts the pieces it multiplies in registers,
// as the small kernel does. Every output goes through the small kernel's arithmetic (the same
// slots, mma steps and fma order); a quarter's sums are folded into the finished quarters' at its
// end (kept in shared memory, in a thread's own slots), so every row is the same bits either way.
// Measured in an 8K prefill on the H200 (ncu, one w1 launch): the first tiled kernel (each group
// converted once into f16 shared memory, 64 x 64 tiles, 8 warps) issued 4.4 G instructions with 54 %
// of the issue slots busy, w1 + w3 17.4 ms; this one 2.8 G, 52 % busy (2 warps a scheduler: 255
// registers, 97 KB of shared memory a block), 11.5 ms; with 8 warps of 2 m16 tiles each (128
// registers, twice the warps) 3.2 G, 59 % busy, 11.8 ms.
constexpr int kTiledRows = static_cast<int>(kW4A8TileRows), kTiledCols = 128, kTiledWarps = 4,
              kTiledThreads = 32 * kTiledWarps;
constexpr int kTiledNt = 4, kTiledMt = kTiledCols * kTiledRows / (kTiledWarps * 16 * 8 * kTiledNt);
constexpr int kTiledColWarps = kTiledCols / (16 * kTiledMt);
constexpr int kTiledStages = 3;
constexpr int kTiledSlots = kTiledMt * kTiledNt * 4;  // a thread's outputs
constexpr int kTiledWPieces = kTiledCols * 4 / kTiledThreads, kTiledXPieces = kTiledRows * 8 / kTiledThreads;
static_assert(kTiledRows == 64 && kTiledColWarps * (kTiledRows / (8 * kTiledNt)) == kTiledWarps &&
                  kTiledWPieces * kTiledThreads == kTiledCols * 4 && kTiledXPieces * kTiledThreads == kTiledRows * 8 &&
                  kTiledThreads >= kTiledCols,
              "the tile is whole warps and whole copy pieces");
struct TiledStage {
  uint8_t w[kTiledCols * kSmallWStride];  // column c's 64 bytes of the group at kSmallWStride c
  uint8_t x[kTiledRows * kSmallXStride];  // row r's 128 codes at kSmallXStride r
  uint32_t ws[kTiledCols];                // packed e8m0 scales: a column's 4 blocks
  float sa[kTiledRows];                   // activation scales of the group
};
struct TiledSmem {
  TiledStage ring[kTiledStages];
  float total[kTiledSlots][kTiledThreads];  // the finished quarters' sums, slot-major (no bank conflicts)
  int64_t src[kTiledRows];
};
static_assert(sizeof(TiledStage) % 16 == 0, "stages stay 16-byte aligned");
constexpr size_t kTiledSmemBytes = sizeof(TiledSmem);

// Block b's 64-row tile: expert e with c(e) <= b < c(e + 1), c(e) = sum over f < e of
// ceil(R_f / 64), and its first row 64 (b - c(e)); e = -1 past the last tile. Warp 0 finds it, 256
// experts a pass: each lane loads the row offsets of 8 consecutive experts at once (independent
// loads, in flight together: the loop over E / 32 experts it replaced waited for each load in turn,
// and its blocks' other warps waited at the barrier after it), counts their tiles, a scan over the
// lanes, and the lane whose range holds b walks its 8. (A grid over the plan's 8-row items had 7 of
// every 8 blocks leave at once: 180,000 empty blocks a projection in an 8K prefill.)
// (kRows: the tile's rows; 128 for the expanded form's TMA tiles, launch_w4a8_expanded.)
template <int kRows = kTiledRows>
__device__ inline void w4a8_find_tile(const int64_t* offsets, int64_t experts, int64_t b, int& e_out, int64_t& t0_out) {
  constexpr int kPer = 8;  // a lane's experts a pass
  const int lane = threadIdx.x % 32;
  int found_e = -1;
  int64_t found_t0 = 0, before = 0;  // before: the tiles of the earlier passes' experts
  for (int64_t e0 = 0; e0 < experts; e0 += 32 * kPer) {
    const int64_t first = e0 + static_cast<int64_t>(lane) * kPer;
    int64_t off[kPer + 1];
#pragma unroll
    for (int i = 0; i <= kPer; ++i) off[i] = first + i <= experts ? offsets[first + i] : 0;
    int64_t n[kPer], count = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      n[i] = first + i < experts ? (off[i + 1] - off[i] + kRows - 1) / kRows : 0;
      count += n[i];
    }
    int64_t inclusive = count;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    int64_t c = before + inclusive - count;
    if (b >= c && b < before + inclusive) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (found_e < 0 && b < c + n[i]) found_e = static_cast<int>(first + i), found_t0 = (b - c) * kRows;
        c += n[i];
      }
    }
    if (__any_sync(0xffffffffu, found_e >= 0)) break;
    before += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  const unsigned who = __ballot_sync(0xffffffffu, found_e >= 0);
  const int src = who ? __ffs(static_cast<int>(who)) - 1 : 0;
  e_out = who ? __shfl_sync(0xffffffffu, found_e, src) : -1;
  t0_out = __shfl_sync(0xffffffffu, found_t0, src);
}
__device__ inline void w4a8_find_tile(const GroupedW4A8Args& g, int64_t b, int& e_out, int64_t& t0_out) {
  w4a8_find_tile<kTiledRows>(g.offsets, g.experts, b, e_out, t0_out);
}

// Test hook (CudaW4A8Tiles): block b's w4a8_find_tile, one warp a block.
__global__ void w4a8_find_tiles_kernel(const int64_t* offsets, int64_t experts, int64_t* out) {
  wait_previous_grid();
  GroupedW4A8Args g{};
  g.offsets = offsets;
  g.experts = experts;
  int e;
  int64_t t0;
  w4a8_find_tile(g, blockIdx.x, e, t0);
  if (threadIdx.x == 0) out[2 * blockIdx.x] = e, out[2 * blockIdx.x + 1] = t0;
}

__global__ void __launch_bounds__(kTiledThreads, 2) grouped_w4a8_tiled_kernel(GroupedW4A8Args g) {
  wait_previous_grid();
  extern __shared__ __align__(16) uint8_t smem_bytes[];
  TiledSmem& sm = *reinterpret_cast<TiledSmem*>(smem_bytes);
  __shared__ int s_e;
  __shared__ int64_t s_t0;
  if (threadIdx.x < 32) {
    int e;
    int64_t t0;
    w4a8_find_tile(g, blockIdx.x, e, t0);
    if (threadIdx.x == 0) s_e = e, s_t0 = t0;
  }
  __syncthreads();
  if (s_e < 0) return;  // past the last tile (the grid is a bound)
  const int64_t e = s_e, t0 = s_t0;
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int N = static_cast<int>(g.N), K = static_cast<int>(g.K);
  const int n0 = static_cast<int>(blockIdx.y) * kTiledCols;
  const DevWeight W = g.w[e];
  const bool packed = w4a8_packed_scales(W);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int blocks = K / 32, groups = (K + kW4A8GroupK - 1) / kW4A8GroupK;
  if (tid < kTiledRows) {
    const int64_t tr = t0 + tid;
    sm.src[tid] = tr < R ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : -1;
  }
  __syncthreads();

  // This thread's copies a group: weight pieces p = tid + kTiledThreads i (column p / 4, block
  // p % 4), code pieces p = tid + kTiledThreads i (row p / 8, 16 bytes p % 8), for tid < 128 column
  // tid's packed scales, for tid < 64 row tid's activation scale.
  const auto* wdata = static_cast<const uint8_t*>(W.data);
  const int wblk = tid % 4, xchunk = tid % 8;
  const int64_t col_bytes = K / 2;
  const int scol = n0 + tid;
  const bool scol_ok = tid < kTiledCols && scol < N && packed;
  const uint8_t* ssrc = static_cast<const uint8_t*>(W.scale) + static_cast<int64_t>(scol_ok ? scol : 0) * W.scale_cols;
  const int64_t arow = tid < kTiledRows ? sm.src[tid] : -1;
  auto issue = [&](int kg) {
    if (kg < groups) {
      TiledStage& st = sm.ring[kg % kTiledStages];
#pragma unroll
      for (int i = 0; i < kTiledWPieces; ++i) {
        const int col = (tid + kTiledThreads * i) / 4;
        const bool ok = n0 + col < N && 4 * kg + wblk < blocks;
        cp_async(st.w + col * kSmallWStride + 16 * wblk,
                 wdata + (ok ? fp4_offset(W.fp4_tiled, col_bytes, n0 + col, 64 * kg + 16 * wblk) : 0), ok, 16);
      }
#pragma unroll
      for (int i = 0; i < kTiledXPieces; ++i) {
        const int row = (tid + kTiledThreads * i) / 8;
        const int64_t src = sm.src[row];
        cp_async(st.x + row * kSmallXStride + 16 * xchunk,
                 g.codes + (src >= 0 ? src * g.k_pad + kW4A8GroupK * kg + 16 * xchunk : 0), src >= 0, 16);
      }
      if (tid < kTiledCols) cp_async(&st.ws[tid], ssrc + 4 * kg, scol_ok, 4);
      if (tid < kTiledRows)
        cp_async(&st.sa[tid], g.scales + static_cast<int64_t>(kg) * g.rows_pad + (arow >= 0 ? arow : 0), arow >= 0, 4);
    }
    cp_async_commit();  // (an empty group past the end keeps the wait count uniform)
  };

  // Slots [m16 tile mt][n8 tile nt][c]: acc the current quarter's sums; the finished quarters' in sm.total.
  const int wc = 16 * kTiledMt * (warp % kTiledColWarps), wr = 8 * kTiledNt * (warp / kTiledColWarps);
  float acc[kTiledMt][kTiledNt][4] = {};
  int quarter = 0;
  auto finish_quarter = [&] {
#pragma unroll
    for (int mt = 0; mt < kTiledMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTiledNt; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float& t = sm.total[(mt * kTiledNt + nt) * 4 + c][tid];
          t = quarter == 0 ? acc[mt][nt][c] : t + acc[mt][nt][c];
          acc[mt][nt][c] = 0.0f;
        }
    ++quarter;
  };
  // One group's block sums into gs (gs = fma(d_j, ws_j, gs) over its blocks). kPlain: a whole group
  // with packed scales whose bytes are all plain (w4a8_plain_scales), branch-free; else
  // any group, any scale layout.
  const auto group_sums = [&](auto plain_tag, const TiledStage& st, int kg, const uint32_t (&sw)[kTiledMt][2],
                                float (&gs)[kTiledMt][kTiledNt][4]) {
    constexpr bool kPlain = decltype(plain_tag)::value;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (!kPlain && 4 * kg + j >= blocks) break;  // the same for the whole block
      uint32_t fx[kTiledNt][4];
#pragma unroll
      for (int nt = 0; nt < kTiledNt; ++nt)
        e4m3x8_to_f16x8(*reinterpret_cast<const uint2*>(st.x + (wr + 8 * nt + gid) * kSmallXStride + 32 * j + 8 * tig),
                        fx[nt]);
#pragma unroll
      for (int mt = 0; mt < kTiledMt; ++mt) {
        uint32_t fa[4], fb[4];
        e2m1x8_to_f16x8(*reinterpret_cast<const uint32_t*>(st.w + (wc + 16 * mt + gid) * kSmallWStride + 16 * j + 4 * tig), fa);
        e2m1x8_to_f16x8(*reinterpret_cast<const uint32_t*>(st.w + (wc + 16 * mt + gid + 8) * kSmallWStride + 16 * j + 4 * tig),
                        fb);
        float ws[2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
          ws[h] = w4a8_group_scale<kPlain>(packed, sw[mt][h], j, W, n0 + wc + 16 * mt + gid + 8 * h, N, 4 * kg + j);
#pragma unroll
        for (int nt = 0; nt < kTiledNt; ++nt) {
          float d[4];
          w4a8_block(d, fa, fb, fx[nt]);
          gs[mt][nt][0] = __fmaf_rn(d[0], ws[0], gs[mt][nt][0]);
          gs[mt][nt][1] = __fmaf_rn(d[1], ws[0], gs[mt][nt][1]);
          gs[mt][nt][2] = __fmaf_rn(d[2], ws[1], gs[mt][nt][2]);
          gs[mt][nt][3] = __fmaf_rn(d[3], ws[1], gs[mt][nt][3]);
        }
      }
    }
  };
  for (int i = 0; i < kTiledStages - 1; ++i) issue(i);
  for (int kg = 0; kg < groups; ++kg) {
    cp_async_wait<kTiledStages - 2>();  // this thread's copies of group kg have landed
    __syncthreads();                    // everyone's; and everyone is done with the stage refilled next
    issue(kg + kTiledStages - 1);
    while (kg >= w4a8_quarter(quarter + 1, groups)) finish_quarter();
    const TiledStage& st = sm.ring[kg % kTiledStages];
    uint32_t sw[kTiledMt][2];  // the packed scales of this lane's columns wc + 16 mt + gid (+ 8 for h = 1)
    bool plain = packed && 4 * kg + 4 <= blocks;
#pragma unroll
    for (int mt = 0; mt < kTiledMt; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sw[mt][h] = st.ws[wc + 16 * mt + gid + 8 * h];
        plain = plain && w4a8_plain_scales(sw[mt][h]);
      }
    float gs[kTiledMt][kTiledNt][4] = {};
    if (__all_sync(0xffffffffu, plain)) group_sums(std::true_type{}, st, kg, sw, gs);
    else group_sums(std::false_type{}, st, kg, sw, gs);
#pragma unroll
    for (int nt = 0; nt < kTiledNt; ++nt) {
      const float sa0 = st.sa[wr + 8 * nt + 2 * tig], sa1 = st.sa[wr + 8 * nt + 2 * tig + 1];
#pragma unroll
      for (int mt = 0; mt < kTiledMt; ++mt) {
        acc[mt][nt][0] = __fmaf_rn(gs[mt][nt][0], sa0, acc[mt][nt][0]);
        acc[mt][nt][1] = __fmaf_rn(gs[mt][nt][1], sa1, acc[mt][nt][1]);
        acc[mt][nt][2] = __fmaf_rn(gs[mt][nt][2], sa0, acc[mt][nt][2]);
        acc[mt][nt][3] = __fmaf_rn(gs[mt][nt][3], sa1, acc[mt][nt][3]);
      }
    }
  }
  cp_async_wait<0>();
  while (quarter < kW4A8Warps) finish_quarter();
#pragma unroll
  for (int mt = 0; mt < kTiledMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kTiledNt; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t tr = t0 + wr + 8 * nt + 2 * tig + (c & 1);
        const int n = n0 + wc + 16 * mt + gid + (c < 2 ? 0 : 8);
        if (tr < R && n < N) g.out[(r0 + tr) * g.N + n] = sm.total[(mt * kTiledNt + nt) * 4 + c][tid];
      }
}

// ---- W4A8 routed experts on wgmma (FP8 tensor cores, sm_90a) --------------------------------------
//
// Both kernels below compute a block of 64 output columns (wgmma's M) x kN rows (its N: 8 for decode
// items, 64 for prefill tiles) with one warpgroup, group by group of 128 inputs, and every output
// through the same arithmetic, so decode and prefill give the same bits:
//
//   per group g: d = the group's 128 products summed by four wgmma.m64nNk32 (the first with
//   scale-d = 0, so each group starts from zero; the tensor core's own sum order and rounding),
//   then acc = fma(d, sa, acc) (sa: the row's activation scale); acc starts at 0 and the groups go
//   in order; the sum times cs = 2^(e_row - 140) where it is stored.
//
// The weights (wgmma's A, from registers): the e2m1 codes of block j of a group (the MXFP4 scale
// 2^(e_j - 127)) become e5m2 bytes holding e2m1 x 2^(13 + e_j - e_row), e_row the largest scale
// byte of the weight row over all of K (DevWeight::row_emax), through an 8-byte table per (column,
// block) and a byte permute; the products are exact (e5m2 x e4m3 has 7 significant bits), and cs
// takes the common factor back once, at the store. For e_j within 26 of e_row the table's values are
// exact e5m2 normals; farther down (blocks at most 2^-26 of the row's largest scale) they are
// rounded to e5m2 (0 below 2^-17 of it). A scale byte 255 (NaN) makes the row's cs NaN.
// (Until 2026-12-06 the tables were relative to each group's largest byte, with that group's
// 2^(e_g - 140) in its fold: w4a8_b1_ref says why the bits are the same.)
//
// Operand order: thread (warp w, gid, tig) holds for its columns 16 w + gid and 16 w + gid + 8 the 16
// bytes of block tig of the group, and for instruction i word i of them: k-slots 4 tig .. 4 tig + 3
// (a0, a1) are inputs 32 tig + 8 i + 0..3, slots 16 + 4 tig .. (a2, a3) inputs 32 tig + 8 i + 4..7.
// The activations (B, from shared memory, K-major) must stand in the same order: act_quant writes
// them so (ActQuantFp8Args::w4a8_order), and they are copied as they are, 16 bytes at a time, into
// wgmma's no-swizzle core-matrix layout (8 rows x 16 bytes contiguous).
constexpr int kWgCols = 64, kWgThreads = 128;

__device__ inline uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((a & 0x3ffffu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);  // bits 62-63 = 0: no swizzle
}

__device__ inline void wgmma_m64n8k32_e5m2_e4m3(float (&d)[4], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}
__device__ inline void wgmma_m64n16k32_e5m2_e4m3(float (&d)[8], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}
__device__ inline void wgmma_m64n64k32_e5m2_e4m3(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e4m3 " SPARROW_WGMMA_P32 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : SPARROW_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

__device__ inline void wgmma_m64n8k32_e4m3_e4m3(float (&d)[4], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}
__device__ inline void wgmma_m64n64k32_e4m3_e4m3(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SPARROW_WGMMA_P32 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : SPARROW_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

// A operand e5m2 (the converted MXFP4 weights) or, for the FP8 linear, e4m3.
template <int kN, bool kFp8W>
__device__ inline void wgmma_w4a8(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (kFp8W) {
    if constexpr (kN == 8) wgmma_m64n8k32_e4m3_e4m3(d, a, b_desc, accumulate);
    else wgmma_m64n64k32_e4m3_e4m3(d, a, b_desc, accumulate);
  } else {
    if constexpr (kN == 8) wgmma_m64n8k32_e5m2_e4m3(d, a, b_desc, accumulate);
    else if constexpr (kN == 16) wgmma_m64n16k32_e5m2_e4m3(d, a, b_desc, accumulate);
    else wgmma_m64n64k32_e5m2_e4m3(d, a, b_desc, accumulate);
  }
}

// A block's e5m2 table from its b1 = (27 + e_blk - e_max) << 2, the e5m2 byte of 0.5 x 2^(13 + e_blk -
// e_max) (e_max - e_blk <= 26): e2m1 magnitude v x 2^q (q = 13 + e_blk - e_max) is e5m2 exponent
// field q + 14 (0.5), q + 15 (1, 1.5), q + 16 (2, 3), q + 17 (4, 6), mantissa 0 or 2: bytes b1 +
// {0, 4, 6, 8, 10, 12, 14}, and 0 for 0.
__device__ inline void w4a8_table_of_b1(uint32_t b1, uint32_t& lo, uint32_t& hi) {
  lo = b1 * 0x01010100u + 0x06040000u;
  hi = b1 * 0x01010101u + 0x0e0c0a08u;
}

// The tables are relative to the weight row's largest scale byte over all of K, e_ref
// (DevWeight::row_emax), not to each group's: a group's wgmma sum d is then 2^(e_group - e_ref) times
// what tables relative to the group's largest would give (exactly: every input scaled by one power
// of two, all of them e5m2 normals while e_ref - e_blk <= 26), so the fold needs no per-group
// weight scale, acc = fma(d, sa, acc), and the row's outputs are multiplied by cs = 2^(e_ref - 140)
// once, where they are stored (W4A8BlockOut). Each fma's exact result is then the per-group form's
// (acc = fma(d, 2^(e_group - 140) sa, acc)) over cs, so its rounding is too, and so the bits, while
// no value is subnormal and no block lies more than 2^26 below its row's largest scale.
// b1_ref = 4 (27 - e_ref) (w4a8_b1_ref); the row's cs from w4a8_row_scale.
__device__ inline int w4a8_b1_ref(uint32_t e_ref) { return 108 - 4 * static_cast<int>(e_ref); }
// Its inverse: e_ref from b1_ref.
__device__ inline uint32_t w4a8_e_ref_of_b1(int b1_ref) { return static_cast<uint32_t>(108 - b1_ref) / 4u; }
// Weight row n's largest scale byte (DevWeight::row_emax); 0 for rows past N (padding columns of a
// block, whose outputs are not stored).
__device__ inline uint32_t w4a8_row_emax(const DevWeight& W, int n, int N) { return n < N ? W.row_emax[n] : 0u; }
// 2^(e_ref - 140): a normal float from e_ref 14 up, a subnormal below; e_ref 255 (some block's scale
// a NaN) makes it NaN.
__device__ inline float w4a8_row_scale(uint32_t e_ref) {
  const uint32_t normal = (e_ref - 13u) << 23, subnormal = 1u << ((e_ref + 9u) & 31u);
  const uint32_t bits = e_ref >= 14u ? normal : subnormal;
  return __uint_as_float(e_ref == 255u ? 0x7fc00000u : bits);
}

// The table of block `blk` of a row's group (its packed e8m0 word; blk_sel = 0x4440 + blk, the byte
// permute selecting byte blk zero-extended): bytes 0..7 the e5m2 of the e2m1 magnitudes 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 times 2^(13 + e_blk - e_ref). A block more than 26 below e_ref (seldom seen) takes
// the rounded path (0 below 2^-17 of the row's largest). The kernels take the common case from
// w4a8_table_of_b1 directly (w4a8_prefill_tables, w4a8_group_prep) and come here under a warp vote
// only where some lane's block is that far down, so the common path has no divergent branch (ncu,
// H200 2026-12-03: the branches, with their compares and predicated moves, were about 26 of the
// decode kernel's 261 instructions a warp and group).
__device__ inline void w4a8_e5m2_table(uint32_t word, uint32_t blk_sel, int b1_ref, uint32_t& lo, uint32_t& hi) {
  const int b1 = b1_ref + 4 * static_cast<int>(__byte_perm(word, 0u, blk_sel));  // 4 (27 + e_blk - e_ref)
  w4a8_table_of_b1(static_cast<uint32_t>(b1), lo, hi);  // (b1 >= 4; else replaced below)
  if (b1 < 4) {  // rounded to e5m2
    const int s = b1 / 4 - 27;  // e_blk - e_ref (b1 a multiple of 4)
    constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    uint32_t bytes[2] = {0u, 0u};
#pragma unroll
    for (int v = 1; v < 8; ++v) {
      const uint32_t b = __nv_cvt_float_to_fp8(ldexpf(kMag[v], 13 + s), __NV_SATFINITE, __NV_E5M2);
      bytes[v / 4] |= b << (8 * (v % 4));
    }
    lo = bytes[0], hi = bytes[1];
  }
}

// A row's group prepared once for the four threads that convert its blocks: b1w byte blk = 4 (27 +
// e_blk - e_ref), the table's b1 (w4a8_table_of_b1); b1w = 0 marks the groups with a block more than
// 26 below e_ref, which then go through w4a8_e5m2_table. Multiply-adds: the decode kernel is bound
// by the integer ALU pipe (ncu, H200 2026-12-03: 305 M of its 594 M instructions, the pipe 70 % busy,
// the FMA pipe 15 %). With d_blk = e_ref - e_blk in 0..26 the packed bytes 108 - 4 d_blk lie in
// 4..108, so the 32-bit sum 0x6c6c6c6c + 4 word - 4 e_ref 0x01010101 (mod 2^32) is exactly them.
__device__ inline uint32_t w4a8_group_prep(uint32_t word, uint32_t e_ref) {
  const uint32_t e_min = min(__vimin3_u32(word & 0xffu, __byte_perm(word, 0u, 0x4441), __byte_perm(word, 0u, 0x4442)), word >> 24);
  return e_ref - e_min > 26u ? 0u : 0x6c6c6c6cu + 4u * word - e_ref * 0x04040404u;
}

// Test hook (CudaW4A8Tables): for each (word, e_ref) the prep's b1w and the row's cs bits, then per
// block the tables (lo, hi) through the prep (with the per-block table where it marks the group) and
// through w4a8_e5m2_table alone: 2 + 4 x 4 words.
__global__ void w4a8_table_pair_kernel(const uint32_t* words, const uint32_t* e_refs, int64_t n, uint32_t* out) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t word = words[i], e_ref = e_refs[i];
  const uint32_t b1w = w4a8_group_prep(word, e_ref);
  uint32_t* o = out + 18 * i;
  o[0] = b1w, o[1] = __float_as_uint(w4a8_row_scale(e_ref));
  for (int blk = 0; blk < 4; ++blk) {
    uint32_t lo, hi, lo2, hi2;
    w4a8_table_of_b1(__byte_perm(b1w, 0u, 0x4440u + blk), lo, hi);
    if (b1w == 0u) w4a8_e5m2_table(word, 0x4440u + blk, w4a8_b1_ref(e_ref), lo, hi);
    w4a8_e5m2_table(word, 0x4440u + blk, w4a8_b1_ref(e_ref), lo2, hi2);
    uint32_t* ob = o + 2 + 4 * blk;
    ob[0] = lo, ob[1] = hi, ob[2] = lo2, ob[3] = hi2;
  }
}

// Eight e2m1 codes (a device word, fp4_layout.h: input j's magnitude in nibble j's bits 0..2) as
// e5m2 through a table: lo_out inputs 0..3, hi_out 4..7. The magnitudes by a byte permute over the
// table (selectors: the nibbles without their bits 3); the signs lie where the bytes want them: those
// of inputs 0..3 at bits 7, 15, 23, 31 of w, those of 4..7 there in w << 4.
__device__ inline void e2m1x8_to_e5m2(uint32_t w, uint32_t tlo, uint32_t thi, uint32_t& lo_out, uint32_t& hi_out) {
  // (PTX prmt, not __byte_perm: for __byte_perm's 3-bit selectors the compiler masks a run-time
  // selector with 0x7777 again, two ALU instructions a word more; these have their bits 3 clear.)
  const uint32_t sel = w & 0x77777777u;
  uint32_t mag_lo, mag_hi;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(mag_lo) : "r"(tlo), "r"(thi), "r"(sel));
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(mag_hi) : "r"(tlo), "r"(thi), "r"(sel >> 16));
  lo_out = mag_lo | (w & 0x80808080u);
  hi_out = mag_hi | ((w << 4) & 0x80808080u);
}

// A quarter's sum acc added to the finished quarters' (total, this thread's slots `stride` apart;
// quarter 0 writes them), in order; acc zeroed. Eight slots at a time in the 64-row forms (the
// compiler barrier keeps ptxas from loading all 32 sums at once: 128 registers and 8 / 28 bytes
// spilled in the W4A8 / FP8 prefill forms, 120 / 123 and none this way); the decode forms as they
// were (there the chunks spilled).
template <int kAcc>
__device__ inline void w4a8_finish_quarter(float* total, int stride, int quarter, float (&acc)[kAcc]) {
  constexpr int kChunk = kAcc >= 32 ? 8 : kAcc;
#pragma unroll
  for (int r0 = 0; r0 < kAcc; r0 += kChunk) {
#pragma unroll
    for (int r = r0; r < r0 + kChunk; ++r) {
      float& s = total[r * stride];
      s = quarter == 0 ? acc[r] : s + acc[r];
      acc[r] = 0.0f;
    }
    if constexpr (kAcc >= 32) asm volatile("" ::: "memory");
  }
}
// A wgmma block's outputs (the W4A8 and FP8 wgmma kernels): rows t0 .. of an expert whose R rows start at
// r0, this thread's columns n and n + 8 of N, rows ld apart. store(): slot 4 j + c of v (v_stride
// apart), times its W4A8 weight row's w4a8_row_scale where scaled (from b1_ref[c / 2], the row's
// w4a8_b1_ref: made at the store, not held), to row t0 + 8 j + 2 tig + (c & 1), column n (+ 8 for
// c >= 2), past the ends left out. finish_quarter(): a quarter of the
// groups done: split, its sum acc to the quarter's slice; else w4a8_finish_quarter.
template <int kN>
struct W4A8BlockOut {
  int64_t t0, R, r0, ld;
  int n, N, tig;
  int b1_ref[2];
  bool scaled;
  // Grouped row r's values (r = r0 + tr) to dst row r, or to row slots[r] where slots is given
  // (GroupedW4A8Args::scatter_slots).
  __device__ void store(float* dst, const float* v, int v_stride, const int32_t* slots = nullptr) const {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t tr = t0 + 8 * j + 2 * tig + (c & 1);
        const int col = n + (c < 2 ? 0 : 8);
        if (tr < R && col < N)
          dst[(slots != nullptr ? slots[r0 + tr] : r0 + tr) * ld + col] =
              scaled ? v[(4 * j + c) * v_stride] * w4a8_row_scale(w4a8_e_ref_of_b1(b1_ref[c / 2]))
                     : v[(4 * j + c) * v_stride];
      }
  }
  __device__ void finish_quarter(bool split, float* slice, float* total, int stride, int quarter, float (&acc)[kN / 2]) const {
    if (split) {
      store(slice, acc, 1);
#pragma unroll
      for (int r = 0; r < kN / 2; ++r) acc[r] = 0.0f;
    } else {
      w4a8_finish_quarter(total, stride, quarter, acc);
    }
  }
};

// A thread's share of a group's weights in shared memory (w: the group's 64 bytes a column): block
// tig's 16 bytes of columns c0 and c0 + 8, and the two columns' scale words (ws: the group's).
struct W4A8GroupWords {
  uint4 w[2];
  uint32_t s[2];
};
__device__ inline W4A8GroupWords w4a8_group_words(const uint8_t* w, const uint32_t* ws, int c0, int tig) {
  return {{*reinterpret_cast<const uint4*>(w + 64 * c0 + 16 * tig), *reinterpret_cast<const uint4*>(w + 64 * (c0 + 8) + 16 * tig)},
          {ws[c0], ws[c0 + 8]}};
}

// A group's weights as wgmma's A operand: the thread's words (w4a8_group_words' w) as e5m2 through
// the two columns' tables.
__device__ inline void w4a8_convert(const uint4 (&w)[2], const uint32_t (&tab)[2][2], uint32_t (&a)[4][4]) {
  const uint32_t wav[4] = {w[0].x, w[0].y, w[0].z, w[0].w}, wbv[4] = {w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e2m1x8_to_e5m2(wav[i], tab[0][0], tab[0][1], a[i][0], a[i][2]);
    e2m1x8_to_e5m2(wbv[i], tab[1][0], tab[1][1], a[i][1], a[i][3]);
  }
}

// The prefill kernel's tables of a group: block tig's of columns c0 and c0 + 8 from their scale words
// (w4a8_group_words' s) and b1_ref (the columns' w4a8_b1_ref), one warp vote for the rare path.
__device__ inline void w4a8_prefill_tables(const uint32_t (&words)[2], const int (&b1_ref)[2], int tig, uint32_t (&tab)[2][2]) {
  int b1[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    b1[h] = b1_ref[h] + 4 * static_cast<int>(__byte_perm(words[h], 0u, 0x4440u + tig));  // 4 (27 + e_blk - e_ref)
    w4a8_table_of_b1(static_cast<uint32_t>(b1[h]), tab[h][0], tab[h][1]);
  }
  if (__any_sync(0xffffffffu, b1[0] < 4 || b1[1] < 4)) {  // a block far below its row's largest scale
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (b1[h] < 4) w4a8_e5m2_table(words[h], 0x4440u + tig, b1_ref[h], tab[h][0], tab[h][1]);
  }
}

// The decode kernels' tables of a group: block tig's of columns c0 and c0 + 8 from the warp's group
// prep (prep_b1: the group's 16 entries, column 16 warp + j at j), or from the per-block table (ws:
// the group's scale words; b1_ref: the columns' w4a8_b1_ref) for the groups the prep marks.
__device__ inline void w4a8_decode_tables(const uint32_t* ws, const uint32_t* prep_b1, const int (&b1_ref)[2], int c0, int gid, int tig,
                                          uint32_t (&tab)[2][2]) {
  // Block tig's b1 of columns c0 and c0 + 8 (entries 8 apart: 32 bytes).
  const uint8_t* b1p = reinterpret_cast<const uint8_t*>(prep_b1 + gid) + tig;
  const uint32_t b1[2] = {b1p[0], b1p[32]};
#pragma unroll
  for (int h = 0; h < 2; ++h) w4a8_table_of_b1(b1[h], tab[h][0], tab[h][1]);
  if (__any_sync(0xffffffffu, b1[0] == 0u || b1[1] == 0u)) {  // a block far below its row's largest scale
    if (b1[0] == 0u) w4a8_e5m2_table(ws[c0], 0x4440u + tig, b1_ref[0], tab[0][0], tab[0][1]);
    if (b1[1] == 0u) w4a8_e5m2_table(ws[c0 + 8], 0x4440u + tig, b1_ref[1], tab[1][0], tab[1][1]);
  }
}

// A group's four wgmma over its rows' codes x (WgStage::x's layout) with A from a, then
// acc = fma(d, sa, acc) (W4A8: the weight rows' scales come at the store) or, for FP8,
// acc = fma(d, sw * sa, acc); sa the rows' activation scales of the group, sw the weight's block
// scale of the group (FP8 only).
template <int kN, bool kFp8W>
__device__ inline void w4a8_group_mma_fold(const uint8_t* x, const uint32_t (&a)[4][4], float sw, const float* sa, int tig,
                                           float (&d)[kN / 2], float (&acc)[kN / 2]) {
#pragma unroll
  for (int r = 0; r < kN / 2; ++r) wgmma_fence_operand(d[r]);
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) wgmma_w4a8<kN, kFp8W>(d, a[i], wgmma_desc(x + 32 * kN * i, 16 * kN, 128), i > 0 ? 1 : 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int r = 0; r < kN / 2; ++r) wgmma_fence_operand(d[r]);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const float2 sv = *reinterpret_cast<const float2*>(&sa[8 * j + 2 * tig]);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float s = (c & 1) ? sv.y : sv.x;
      acc[4 * j + c] = __fmaf_rn(d[4 * j + c], kFp8W ? sw * s : s, acc[4 * j + c]);
    }
  }
}

// The FP8 linear's weights in a stage: column c's 128 bytes of the group at fp8_wrow c. In the
// decode kernel 144: the 16 bytes of padding put the 8 columns a quarter-warp reads at once on
// different banks; the prefill kernel keeps 128 (2-way conflicts on those reads) so that two blocks
// fit an SM (3 stages of 24.8 KB and the 32 KB of quarter sums).
template <int kN>
__host__ __device__ constexpr int fp8_wrow() { return kN == 8 ? 144 : 128; }

template <int kN, int kWG, bool kFp8W = false>
struct WgStage {
  uint8_t x[kN * kW4A8GroupK];      // the rows' codes: chunk c (16 bytes) of row n at ((c * kN / 8) + n / 8) * 128 + (n % 8) * 16
  // MXFP4: column c's 64 bytes of the group at 64 c; FP8: its 128 bytes at fp8_wrow c.
  uint8_t w[kWG * kWgCols * (kFp8W ? fp8_wrow<kN>() : 64)];
  // MXFP4: packed e8m0 scales, a column's 4 blocks; FP8: ws[0] the fp32 bits of the block's scale
  // (the block's columns lie in one 128-row scale block).
  uint32_t ws[kFp8W ? 4 : kWG * kWgCols];
  float sa[kN];                     // activation scales of the group
};

// The ring's depth in slots of kSpan groups, and the blocks an SM the launch bounds ask for. The
// decode kernel's span (SPARROW_CUDA_W4A8_SPAN, w4a8_decode_span: 1, 2 or 4 groups a slot) sets how
// many contiguous bytes of a weight column one copy round reads: 64 a group, so at span 1 each
// 128-byte line is fetched in two halves a group apart; span 2 reads whole lines, span 4 two.
// Every output's arithmetic is the same at any span (a slot's groups are summed one by one).
// At span 1, 4 slots (6 or 8 measured slower on the H200, 2026-12-02: w1 + w3 at batch 256 1.04 ->
// 1.20 / 1.18 ms); wider slots 3 (span 2: 6 blocks an SM, two slots of 8 KB of weights in flight
// each). The FP8 linear's prefill stages hold twice the weight bytes: 3 of them (107 KB with the
// quarter sums) keep two blocks an SM, as the W4A8 prefill kernel's 4 do.
constexpr int kWgStages = 4;
// The wgmma kernel's decode form (8- or 16-row items: the ring advanced a slot at a time, wider
// slots, K's quarters over blocks, a W4A8 pair in one grid, the tables from the group prep) against
// its prefill form (64-row tiles).
__host__ __device__ constexpr bool wg_decode(int kN) { return kN <= 16; }
template <int kN, bool kFp8W, int kSpan = 1>
__host__ __device__ constexpr int wg_stages() { return kFp8W && kN > 8 ? 3 : kSpan == 1 ? kWgStages : 3; }
template <int kN, int kWG, bool kFp8W = false, int kSpan = 1>
__host__ __device__ constexpr size_t wg_smem_bytes() {  // the ring, the finished quarters' sums, the groups' prep
  return sizeof(WgStage<kN, kWG, kFp8W>) * kSpan * wg_stages<kN, kFp8W, kSpan>() + sizeof(float) * (kN / 2) * kWgThreads * kWG +
         (kFp8W || !wg_decode(kN) ? 0 : sizeof(uint32_t) * 16 * kSpan * 4 * kWG);
}
// (The FP8 decode form quantising its own rows, GroupedW4A8Args::x_f32) A group's codes and scales in
// shared memory, and where its groups past the ring's slots go: after the kernel's other shared
// memory, 128-byte aligned (wgmma's descriptors want 16).
constexpr size_t kQuantInGroupBytes = 8 * kW4A8GroupK + 8 * sizeof(float);
constexpr size_t kFp8QuantInMaxBytes = 24 * 1024;  // at most this much more shared memory a block
__host__ __device__ constexpr size_t wg_quant_in_offset() { return (wg_smem_bytes<8, 1, true>() + 127) / 128 * 128; }
// The blocks an SM whose `bytes` of dynamic shared memory fit (227 KB an SM, 1 KB of it reserved a
// block).
__host__ __device__ constexpr int blocks_fitting_smem(size_t bytes) { return static_cast<int>((227 * 1024) / (bytes + 1024)); }
// The decode kernels' bound: as many blocks as the shared memory holds (blocks_fitting_smem), at most eight (ptxas, with the group prep: 8 rows: span 1 8 blocks, 64 registers
// with 4 bytes spilled; span 2 6, 80; 16 rows: span 1 7, 72 with 12 bytes spilled; span 2 5, 96;
// FP8: 5, 63).
// The W4A8 prefill form's ring (kRing, four warpgroups): kStages slots, then the quarter sums, then
// each slot's two mbarriers (full, empty). 5 slots: 190 KB.
constexpr int kW4A8RingStages = 5;
template <int kWG, int kStages>
__host__ __device__ constexpr size_t wg_ring_smem_bytes() {
  return sizeof(WgStage<kTiledRows, kWG>) * kStages + sizeof(float) * (kTiledRows / 2) * kWgThreads * kWG + 2 * sizeof(uint64_t) * kStages;
}
template <int kN, int kWG, bool kFp8W, int kSpan>
__host__ __device__ constexpr int wg_min_blocks() {
  if (!wg_decode(kN)) return 4 / kWG;
  const int fit = blocks_fitting_smem(wg_smem_bytes<kN, kWG, kFp8W, kSpan>());
  return fit < 8 ? fit : 8;
}

// kWG warpgroups a block, warpgroup v the block's columns 64 v .. 64 v + 63, all of them the same rows.
// Each kernel in the loop form measured faster for it (H200, layer 0 of the synthetic V4-Flash): the
// decode kernel advances its copy sources a group at a time (with sources from the group and
// ptxas's default, 52 registers, w1 + w3 at batch 256 took 1.18 ms against 1.04 on 2026-12-01),
// under a bound of eight blocks an SM (64 registers for W4A8, 61 for FP8, no spill; a bound of six
// gave 80 and a batch-256 layer 2.5-3 % slower, 2026-12-02); the prefill kernel offsets them by the
// group number under a bound of two blocks (128 registers, 8 bytes spilled; w1 + w3 of an 8K
// prefill 6.84 ms against 7.54 for the advancing form on 2026-12-02, w2 4.26 against 4.49).
// kRing (the W4A8 prefill form only): the ring handed over through mbarriers instead of a block
// barrier a group. Each thread's copies of a slot arrive on the slot's full barrier as they land
// (cp.async.mbarrier.arrive.noinc: kThreads arrivals); each warp's lane 0 arrives on its empty
// barrier once the warp's wgmma and fold have read it; a thread refills a slot after waiting for
// that. The copies run kStages - 2 groups ahead, so that a warpgroup may run up to two groups ahead
// of the slowest: with a block barrier every group the four warpgroups converted their weights at
// the same time, their tensor-core work queued behind each other after it (our reading of ncu's
// counters: 0.95 eligible warps of 4 a scheduler, none in half the cycles).
// kRing 2 (the default since 2026-12-06): the ring's copy sources advanced a group at a time and its
// slots and phases counted, as the decode form does, instead of offsets and slots from the group
// number (kRing 1): on an H100 w1 1.96-1.97 -> 1.93-1.94 ms, 6 % fewer instructions, the 8K prefill
// layer -0.1 to -0.6 % in five rounds.
// kRing 3 (the default since 2026-12-06: on an H100 w1 1.93-1.94 -> 1.89 ms, 3.8 % fewer
// instructions, the 8K prefill layer -0.6 to -0.9 %): kRing 2 with each warpgroup's 64 columns'
// weights of a group, 4 KB contiguous in the tiled rows (fp4_layout.h), copied by one bulk copy from the
// warpgroup's first thread and counted on the slot's full barrier as expected bytes (that thread's
// arrival too: kThreads + kWG arrivals), instead of two 16-byte cp.async pieces from every thread.
// (A bulk form of the block-barrier kernel at two warpgroups was 0.3-1.7 % slower, H200 2026-12-06:
// the mbarrier wait it added beside the block barrier; the ring waits on its full barrier anyway.)
// REQUIRES N % 64 == 0 (launch_grouped_w4a8 takes kRing 2 otherwise).
// (kRing 3, w4a8_decode_ws_kernel) In the tiled rows, row n0 + j's bytes 64 kg .. 64 kg + 63 (n0 a
// multiple of 64) lie at row n0's byte 0 + 4096 kg + 64 j: a group of 64 rows is one 4 KB piece.
static_assert(fp4_offset(true, 2048, 64 * 3 + 17, 64 * 5 + 9) == fp4_offset(true, 2048, 64 * 3, 0) + 4096 * 5 + 64 * 17 + 9 &&
                  fp4_offset(true, 1024, 64 + 63, 64 * 15 + 63) == fp4_offset(true, 1024, 64, 0) + 4096 * 15 + 64 * 63 + 63,
              "a group of 64 tiled rows is one contiguous 4 KB piece");
template <int kN, int kWG, int kStages, bool kFp8W = false, int kSpan = 1, int kRing = 0>
__global__ void __launch_bounds__(kWgThreads * kWG, (wg_min_blocks<kN, kWG, kFp8W, kSpan>()))
    grouped_w4a8_wgmma_kernel(GroupedW4A8Args g) {
  // The decode form: kN = 8 (the plan's items), or 16 for W4A8 (an item with an even tile index
  // takes its 8 rows and the next item's, which then does nothing); the prefill form: kN = 64.
  constexpr bool kDecode = wg_decode(kN);
  static_assert(kN == 8 || (kN == 16 && !kFp8W) || kN == kTiledRows, "8- or 16-row items, or 64-row tiles");
  static_assert(kSpan == 1 || (kDecode && !kFp8W), "slots of several groups: the W4A8 decode kernel only");
  static_assert(!kRing || (!kFp8W && !kDecode && kStages >= 3), "the mbarrier ring: the W4A8 prefill form only");
  static_assert(kRing != 3 || (fp4_group_step(true) == kWgCols * 64 && kN * kW4A8GroupK % 16 == 0),
                "a group of a warpgroup's 64 columns is one piece of 4 KB, a stage's weights (after its codes) 16-byte aligned");
  // The experts' items come from the device plan, a kernel's output: wait first, unless the plan was
  // written two launches back or earlier (g.plan_early, the decode kernel only): then the items, the
  // rows and the first weight stages are read before the wait, as the FP8 form (whose weights come
  // from the host) always does (below).
  const bool early = kFp8W || (kDecode && g.plan_early);
  // (The FP8 decode form) the block quantises its rows itself (GroupedW4A8Args::x_f32).
  const bool quant_in = kFp8W && kDecode && g.x_f32 != nullptr;
  if (!early) wait_previous_grid();
  using Stage = WgStage<kN, kWG, kFp8W>;
  constexpr int kThreads = kWgThreads * kWG, kCols = kWgCols * kWG;
  static_assert(sizeof(Stage) % 16 == 0, "stages stay 16-byte aligned");
  extern __shared__ __align__(128) uint8_t wg_smem[];
  Stage* ring = reinterpret_cast<Stage*>(wg_smem);
  __shared__ int64_t s_src[kN];
  __shared__ int s_e;
  __shared__ int64_t s_t0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  // (kRing) Slot s's full and empty barriers, after the ring and the quarter sums.
  uint64_t* const ring_full = reinterpret_cast<uint64_t*>(wg_smem + sizeof(Stage) * kStages * kSpan + sizeof(float) * (kN / 2) * kThreads);
  uint64_t* const ring_empty = ring_full + kStages;
  if constexpr (kRing) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s)
        mbar_init(&ring_full[s], kThreads + (kRing == 3 ? kWG : 0)), mbar_init(&ring_empty[s], kThreads / 32);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
  }
  if constexpr (kFp8W) {  // dense: block b's rows kN b ..
    if (tid == 0) {
      s_t0 = static_cast<int64_t>(blockIdx.x) * kN;
      s_e = s_t0 < g.rows_total ? 0 : -1;
    }
  } else if constexpr (kDecode) {
    if (tid == 0) {
      const int64_t item = blockIdx.x;
      const bool in = item < *g.n_items;
      s_t0 = in ? g.items[2 * item + 1] : 0;
      // (16 rows: an odd tile's rows are the even tile's before it.)
      s_e = in && (kN == 8 || s_t0 % 16 == 0) ? g.items[2 * item] : -1;
    }
  } else {
    static_assert(kN == kTiledRows, "a prefill block is one of w4a8_find_tile's tiles");
    if (tid < 32) {
      int e;
      int64_t t0;
      w4a8_find_tile(g, g.cols_fast ? blockIdx.y : blockIdx.x, e, t0);
      if (tid == 0) s_e = e, s_t0 = t0;
    }
  }
  __syncthreads();
  if (s_e < 0) {  // past the last item or tile (the grid is a bound)
    if (early) wait_previous_grid();
    return;
  }
  const int64_t e = s_e, t0 = s_t0;
  const int64_t r0 = kFp8W ? 0 : g.offsets[e], R = kFp8W ? g.rows_total : g.offsets[e + 1] - r0;
  const int N = static_cast<int>(g.N), K = static_cast<int>(g.K), groups = K / kW4A8GroupK;
  // A pair (g.w_b, the decode kernel): the grid's second half of column blocks is the second
  // projection, its outputs rows_total x N further on.
  const int col_blocks = (N + kCols - 1) / kCols;
  const bool second = !kFp8W && kDecode && g.w_b != nullptr && static_cast<int>(blockIdx.y) >= col_blocks;
  const int col_block = !kFp8W && !kDecode && g.cols_fast ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.y);
  const int n0 = (col_block - (second ? col_blocks : 0)) * kCols;
  const DevWeight W = kFp8W ? DevWeight{} : (second ? g.w_b[e] : g.w[e]);
  // Split (grid z = 2 or 4, the decode kernel only): this block computes quarters q_first ..
  // q_first + 4 / z - 1 of the groups, each into its own slice of g.partial.
  const bool split = kDecode && gridDim.z > 1;
  const int q_count = split ? kW4A8Warps / static_cast<int>(gridDim.z) : kW4A8Warps;
  const int q_first = split ? static_cast<int>(blockIdx.z) * q_count : 0;
  const int g_lo = w4a8_quarter(q_first, groups), g_hi = w4a8_quarter(q_first + q_count, groups);
  if (tid < kN) {
    const int64_t tr = t0 + tid;
    s_src[tid] = tr < R ? (!kFp8W && g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : -1;
  }
  __syncthreads();

  // Ring slot s is ring[kSpan s .. kSpan s + kSpan - 1], one Stage a group.
  // This thread's copies a slot: weight pieces p = tid, tid + kThreads, ... (column p / (4 kSpan), its
  // 16-byte chunk c = p % (4 kSpan) of the slot's 64 kSpan contiguous bytes: group c / 4, block c % 4),
  // code pieces p = tid + kThreads i < 8 kN kSpan (group p / (8 kN); within it q = p % (8 kN): row
  // q % kN, chunk q / kN: a quarter-warp fills one chunk of 8 rows, 128 contiguous bytes of the stage;
  // a row's 8 chunks, the earlier mapping, fell in one bank group), column tid's packed scales (tid <
  // kCols), row tid's activation scale (tid < kN), each for the slot's groups.
  // (FP8: weight pieces p = tid + kThreads i, i < 4: column p / 8, chunk p % 8 of its 128 bytes; a
  // quarter-warp copies one column's group, and thread 0 the block's scale.)
  constexpr int kWPieces = kFp8W ? 4 : 2 * kSpan;
  constexpr int kGroupBytes = kFp8W ? kW4A8GroupK : kW4A8GroupK / 2;  // a column's bytes of a group
  static_assert(kThreads % (4 * kSpan) == 0, "a thread's weight pieces share their chunk");
  const auto* wdata = kFp8W ? g.w_codes : static_cast<const uint8_t*>(W.data);
  const int64_t col_bytes = kFp8W ? K : K / 2;
  // From a group's bytes of a column to the next group's, and a slot's: the FP8 codes row-major,
  // the MXFP4 codes tiled (fp4_layout.h; the MoE takes this kernel only for tiled experts).
  const int64_t group_step = kFp8W ? kGroupBytes : fp4_group_step(true), slot_step = group_step * kSpan;
  // The group within a slot of this thread's weight pieces (the same for all of them).
  const int wsub = kFp8W ? 0 : (tid % (4 * kSpan)) / 4;
  const uint8_t* wsrc[kWPieces];
  int wdst[kWPieces];  // bytes from the slot's first Stage
  bool wok[kWPieces];
#pragma unroll
  for (int i = 0; i < kWPieces; ++i) {
    const int p = tid + kThreads * i, col = kFp8W ? p / 8 : p / (4 * kSpan), chunk = kFp8W ? p % 8 : p % (4 * kSpan);
    wok[i] = n0 + col < N;
    wsrc[i] = wdata + (kFp8W ? (wok[i] ? (n0 + col) * col_bytes : 0) + 16 * chunk + kGroupBytes * g_lo
                             : fp4_offset(true, col_bytes, wok[i] ? n0 + col : 0, 64 * (g_lo + chunk / 4) + 16 * (chunk % 4)));
    wdst[i] = static_cast<int>(offsetof(Stage, w)) +
              (kFp8W ? fp8_wrow<kN>() * col + 16 * chunk : static_cast<int>(sizeof(Stage)) * wsub + 64 * col + 16 * (chunk % 4));
  }
  constexpr int kXPieces = (8 * kN * kSpan + kThreads - 1) / kThreads;
  const bool scol_ok = kFp8W ? tid == 0 : tid < kCols && n0 + tid < N;
  const uint8_t* ssrc =
      kFp8W ? reinterpret_cast<const uint8_t*>(g.w_scales + (n0 / 128) * g.w_scale_ld + g_lo)
            : static_cast<const uint8_t*>(W.scale) + static_cast<int64_t>(scol_ok ? n0 + tid : 0) * W.scale_cols + 4 * g_lo;
  const int64_t arow = tid < kN ? s_src[tid] : -1;
  const bool arow_ok = arow >= 0;
  const float* asrc = g.scales + static_cast<int64_t>(g_lo) * g.rows_pad + (arow_ok ? arow : 0);
  // Code piece i: its place in a slot (bytes from its first Stage), its group in the slot, and its
  // source at group g_lo (g.codes when the row is past R).
  int xdst[kXPieces], xsub[kXPieces];
  const uint8_t* xsrc[kXPieces];
  bool xok[kXPieces];
#pragma unroll
  for (int i = 0; i < kXPieces; ++i) {
    const int p = tid + kThreads * i, q = p % (8 * kN), row = q % kN, chunk = q / kN;
    const int64_t src = s_src[row];
    xok[i] = p < 8 * kN * kSpan && src >= 0;
    xsub[i] = p / (8 * kN);
    xdst[i] = static_cast<int>(sizeof(Stage)) * xsub[i] + static_cast<int>(offsetof(Stage, x)) +
              ((chunk * (kN / 8)) + row / 8) * 128 + (row % 8) * 16;
    xsrc[i] = (xok[i] ? g.codes + src * g.k_pad + 16 * chunk : g.codes) + kW4A8GroupK * (g_lo + xsub[i]);
  }
  // The weights and their scales come from the host (Fp8Linear's uploads, the model's experts), never
  // from a kernel: when reading early, the first kStages - 1 slots' are copied into slots 0 ..
  // kStages - 2 before the wait for the previous grid, so that under programmatic dependent launch
  // they stream in while that grid finishes. They join the first commit group below (issue() then
  // skips them). The rows' codes and scales are the previous kernel's output: after the wait.
  int prefetched = 0;  // slots
  if (early) {
    for (; prefetched < kStages - 1 && g_lo + kSpan * prefetched < g_hi; ++prefetched) {
      uint8_t* slot = reinterpret_cast<uint8_t*>(ring + kSpan * prefetched);
      const bool in = g_lo + kSpan * prefetched + wsub < g_hi;
#pragma unroll
      for (int i = 0; i < kWPieces; ++i) cp_async(slot + wdst[i], wsrc[i] + slot_step * prefetched, wok[i] && in, 16);
      if (kFp8W ? tid == 0 : tid < kCols)
#pragma unroll
        for (int j = 0; j < kSpan; ++j)
          cp_async(&ring[kSpan * prefetched + j].ws[kFp8W ? 0 : tid], ssrc + 4 * (kSpan * prefetched + j),
                   scol_ok && g_lo + kSpan * prefetched + j < g_hi, 4);
    }
    wait_previous_grid();
  }
  // Copies the next slot's groups (g_lo, g_lo + 1, ...; the last slot's past g_hi left out) into the
  // next slot (a source whose copy is off is not read: cp.async with no source bytes). The decode
  // kernel and the prefill kernel's default ring (kRing 2) advance their sources a slot a call; the
  // prefill kernel's other forms (g_lo = 0, kSpan = 1) offset them by the group, into slot
  // group % kStages (see the launch bounds). kRing: a slot's earlier group released first (its empty
  // barrier), and the copies counted on its full barrier, not committed.
  constexpr bool kAdvance = kDecode || kRing >= 2;
  int next_group = g_lo, next_stage_index = 0;
  uint32_t empty_phase = 1u;  // (kRing 2, 3) the parity of the release waited for at slot next_stage_index
  // (kRing 3) Warpgroup tid / 128's 64 columns' weights of group g_lo: its first thread's bulk copies.
  const bool bulk_lead = kRing == 3 && tid % kWgThreads == 0;
  const bool bulk_in = n0 + kWgCols * (tid / kWgThreads) < N;
  const uint8_t* bulk_src = kRing == 3 && bulk_in
                                ? wdata + fp4_offset(true, col_bytes, n0 + kWgCols * (tid / kWgThreads), 0) + group_step * g_lo
                                : wdata;
  auto issue = [&] {
    if (next_group < g_hi) {
      const int64_t dg = kAdvance ? 0 : next_group - g_lo;
      const int ring_slot = kAdvance ? next_stage_index : static_cast<int>(dg) % kStages;  // (dg < groups)
      if constexpr (kRing >= 2) {
        if (next_group - g_lo >= kStages) mbar_wait(&ring_empty[ring_slot], empty_phase);
      } else if constexpr (kRing != 0) {
        if (dg >= kStages) mbar_wait(&ring_empty[ring_slot], static_cast<uint32_t>(static_cast<int>(dg) / kStages - 1) & 1u);
      }
      const bool weights = next_group - g_lo >= kSpan * prefetched;
      // (The slot as the forms measured before the advancing ring take it: dg % kStages in 64 bits.)
      Stage* slot_st = ring + kSpan * (kAdvance ? next_stage_index : static_cast<int>(dg % kStages));
      uint8_t* slot = reinterpret_cast<uint8_t*>(slot_st);
      if constexpr (kRing == 3) {
        if (bulk_lead) {
          constexpr uint32_t kBytes = kWgCols * 64;
          mbar_arrive_expect_tx(&ring_full[ring_slot], bulk_in ? kBytes : 0u);
          if (bulk_in) bulk_copy_to_smem<false>(slot_st->w + kBytes * (tid / kWgThreads), bulk_src, kBytes, &ring_full[ring_slot]);
        }
        bulk_src += group_step;
      } else {
        const bool w_in = next_group + wsub < g_hi;
#pragma unroll
        for (int i = 0; i < kWPieces; ++i) {
          if (weights) cp_async(slot + wdst[i], wsrc[i] + group_step * dg, wok[i] && w_in, 16);
          if constexpr (kAdvance) wsrc[i] += slot_step;
        }
      }
      // (quant_in: no copies of codes or scales, not even zero fills: the slots' x and sa hold the
      // block's first groups, quant_x)
#pragma unroll
      for (int i = 0; i < kXPieces; ++i)
        if (tid + kThreads * i < 8 * kN * kSpan && !quant_in) {
          cp_async(slot + xdst[i], xsrc[i] + kW4A8GroupK * dg, xok[i] && next_group + xsub[i] < g_hi, 16);
          if constexpr (kAdvance) xsrc[i] += kW4A8GroupK * kSpan;
        }
#pragma unroll
      for (int j = 0; j < kSpan; ++j) {
        const bool in = next_group + j < g_hi;
        if ((kFp8W ? tid == 0 : tid < kCols) && weights)
          cp_async(&slot_st[j].ws[kFp8W ? 0 : tid], ssrc + 4 * (dg + j), scol_ok && in, 4);
        if (tid < kN && !quant_in) cp_async(&slot_st[j].sa[tid], asrc + (dg + j) * g.rows_pad, arow_ok && in, 4);
      }
      if constexpr (kAdvance) {
        ssrc += 4 * kSpan;
        asrc += g.rows_pad * kSpan;
        next_stage_index = next_stage_index + 1 == kStages ? 0 : next_stage_index + 1;
        if (next_stage_index == 0) empty_phase ^= 1u;
      }
      next_group += kSpan;
      if constexpr (kRing != 0) cp_async_arrive_noinc(&ring_full[ring_slot]);
    }
    if constexpr (!kRing) cp_async_commit();  // (an empty group past the end keeps the wait count uniform)
  };

  // Accumulator slot 4 j + c: column 16 warp + gid (+ 8 for c >= 2), row 8 j + 2 tig + (c & 1)
  // (warp counts across the warpgroups: warpgroup v's columns start at 64 v). acc holds the current
  // quarter's sum; the finished quarters' sum is in shared memory after the ring (slot-major).
  constexpr int kAcc = kN / 2;
  float acc[kAcc], d[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f, d[i] = 0.0f;
  float* total = reinterpret_cast<float*>(ring + kStages * kSpan);
  const int c0 = 16 * warp + gid;
  // (W4A8) The tables' reference of weight rows c0 and c0 + 8 (columns of the output), which also
  // gives the rows' scales at the store, and the largest scale byte of row 16 warp + lane % 16 (the
  // lane's group prep entries in the decode form).
  const int b1_ref[2] = {w4a8_b1_ref(kFp8W ? 0u : w4a8_row_emax(W, n0 + c0, N)),
                         w4a8_b1_ref(kFp8W ? 0u : w4a8_row_emax(W, n0 + c0 + 8, N))};
  const uint32_t prep_e_ref = kFp8W || !kDecode ? 0u : w4a8_row_emax(W, n0 + 16 * warp + lane % 16, N);
  // This warp's w4a8_group_prep of the slot's groups for its 16 columns: entry 16 sub + j (column
  // 16 warp + j, the slot's group sub).
  uint32_t* const prep_b1 = reinterpret_cast<uint32_t*>(total + (kN / 2) * kThreads) + warp * 16 * kSpan;
  // Where this block's outputs go: out [rows_total, N] (the pair's second projection rows_total x N
  // further on), or quarter q's slice of partial [4, pair x rows_total, N].
  const int64_t outputs = (!kFp8W && g.w_b != nullptr ? 2 : 1) * g.rows_total * g.N;
  const int64_t second_offset = second ? g.rows_total * g.N : 0;
  const W4A8BlockOut<kN> out{t0, R, r0, g.N, n0 + c0, N, tig, {b1_ref[0], b1_ref[1]}, !kFp8W};
  int quarter = q_first;
  // Split: the quarter's sum to its slice; unsplit: added to the finished quarters' sum in order.
  const auto finish_quarter = [&] {
    out.finish_quarter(split, g.partial + quarter * outputs + second_offset, total + tid, kThreads, quarter, acc);
    ++quarter;
  };
  // (quant_in) Group g_lo + j's codes (WgStage::x's layout) and scales: in ring slot j's x and sa
  // for the block's first kStages groups (nothing is copied there in this form), after the kernel's
  // other shared memory for the rest (the launch's extra bytes, fp8_wgmma_quant_in_takes).
  const auto quant_x = [&](int j) -> uint8_t* {
    return j < kStages ? ring[j].x : wg_smem + wg_quant_in_offset() + (j - kStages) * kQuantInGroupBytes;
  };
  const auto quant_sa = [&](int j) -> float* {
    return j < kStages ? ring[j].sa
                       : reinterpret_cast<float*>(wg_smem + wg_quant_in_offset() + (j - kStages) * kQuantInGroupBytes +
                                                  kN * kW4A8GroupK);
  };
  if constexpr (kFp8W && kDecode) {
    if (quant_in) {
      static_assert(kN * kW4A8GroupK + kN * sizeof(float) == kQuantInGroupBytes && kWG == 1 && kSpan == 1,
                    "wg_quant_in_offset's form: 8 rows, one warpgroup, a group a slot");
      // The rows with inputs, a prefix of the item's (s_src); the others' codes and scales 0, as the
      // copies' zero fill gives them (their outputs are not stored).
      const int ng = g_hi - g_lo;
      int real = 0;
#pragma unroll
      for (int r = 0; r < kN; ++r) real += s_src[r] >= 0 ? 1 : 0;
      for (int i = tid; i < ng * kN * 8; i += kThreads) {  // 16-byte pieces: group, chunk, row
        const int j = i / (kN * 8), q = i % (kN * 8), row = q % kN, chunk = q / kN;
        if (row >= real) *reinterpret_cast<uint4*>(quant_x(j) + chunk * 128 + row * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
      for (int i = tid; i < ng * kN; i += kThreads)
        if (i % kN >= real) quant_sa(i / kN)[i % kN] = 0.0f;
      // The (group, row) pairs of the rows with inputs, a warp each as act_quant_fp8_kernel's: warp w
      // takes pairs w, w + 4, ... in rounds of kAhead, a round's loads all issued before its first
      // block's arithmetic. Lane l's 4 codes of a block are its inputs 4l .. 4l + 3, bytes 4l .. of
      // the row's group: chunk l / 4 of WgStage::x. The wgmma reads them after the main loop's first
      // fence.proxy.async and barrier, which every thread passes after its stores here.
      constexpr int kWarps = kThreads / 32, kAhead = 4;
      const int pairs = ng * real;
      const bool vec = g.x_ld % 4 == 0 && reinterpret_cast<uintptr_t>(g.x_f32) % 16 == 0;
      for (int p0 = warp; p0 < pairs; p0 += kWarps * kAhead) {
        float v[kAhead][4];
#pragma unroll
        for (int u = 0; u < kAhead; ++u) {
          const int p = p0 + kWarps * u;
          if (p >= pairs) break;  // (uniform across the warp)
          const int64_t k0 = static_cast<int64_t>(g_lo + p / real) * kW4A8GroupK + 4 * lane;
          const float* src = g.x_f32 + s_src[p % real] * g.x_ld + k0;
          if (vec && k0 + 4 <= g.x_k) {
            const float4 q = *reinterpret_cast<const float4*>(src);
            v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) v[u][i] = k0 + i < g.x_k ? src[i] : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kAhead; ++u) {
          const int p = p0 + kWarps * u;
          if (p >= pairs) break;
          const int j = p / real, row = p % real;
          float sc;
          const uint32_t c = act_quant_lane(v[u], sc);
          *reinterpret_cast<uint32_t*>(quant_x(j) + (lane / 4) * 128 + row * 16 + (lane % 4) * 4) = c;
          if (lane == 0) quant_sa(j)[row] = sc;
        }
      }
    }
  }
  // (kRing: the copies two slots fewer ahead, so that the slot refilled held a group two back.)
  for (int i = 0; i < kStages - (kRing ? 2 : 1); ++i) issue();
  int stage_index = 0, quarter_end = w4a8_quarter(q_first + 1, groups);
  uint32_t full_phase = 0u;  // (kRing 2, 3) the parity of the copies waited for at slot stage_index
  for (int kg0 = g_lo; kg0 < g_hi; kg0 += kSpan) {
    const int ring_slot = kAdvance ? stage_index : ((kg0 - g_lo) / kSpan) % kStages;
    if constexpr (kRing != 0) {
      // everyone's copies have landed, and are visible to wgmma's reads
      mbar_wait(&ring_full[ring_slot], kRing >= 2 ? full_phase : static_cast<uint32_t>((kg0 - g_lo) / kStages) & 1u);
      fence_proxy_async_smem();
    } else {
      cp_async_wait<kStages - 2>();  // this thread's copies of the slot of group kg0 have landed
      fence_proxy_async_smem();      // and are visible to wgmma's reads
      __syncthreads();               // everyone's; and everyone is done with the slot refilled next
    }
    const Stage* slot = ring + kSpan * ring_slot;
    if constexpr (kAdvance) {
      stage_index = stage_index + 1 == kStages ? 0 : stage_index + 1;
      if (stage_index == 0) full_phase ^= 1u;
    }
    // (W4A8 prefill) The thread's weight and scale words of the group, read before the copies are
    // issued so that the loads' latency passes under them (the tables use the scale words first).
    W4A8GroupWords words{};
    if constexpr (!kFp8W && !kDecode) words = w4a8_group_words(slot[0].w, slot[0].ws, c0, tig);
    issue();  // the slot kStages - 1 ahead (kRing: kStages - 2)
    if constexpr (!kFp8W && kDecode) {
      // Lane j < 16 kSpan prepares entry j. (Rewritten only after the next barrier, when every lane
      // of the warp has read this slot's.)
#pragma unroll
      for (int j = lane; j < 16 * kSpan; j += 32) prep_b1[j] = w4a8_group_prep(slot[j / 16].ws[16 * warp + j % 16], prep_e_ref);
      __syncwarp();
    }
#pragma unroll
    for (int sub = 0; sub < kSpan; ++sub) {
      const int kg = kg0 + sub;
      if (kg >= g_hi) break;
      while (kg >= quarter_end) {
        finish_quarter();
        quarter_end = w4a8_quarter(quarter + 1, groups);
      }
      const Stage& st = slot[sub];
      uint32_t a[4][4];
      float sw = 1.0f;  // (FP8: the block's scale; W4A8 folds none, w4a8_group_mma_fold)
      if constexpr (kFp8W) {
        // The inputs in their natural order (the codes are not in w4a8_order here, so that the TMA
        // kernel's shared-memory A holds the same bytes in the same k-slots): instruction i's
        // k-slots 4 tig .. 4 tig + 3 are the group's bytes 32 i + 4 tig .., slots 16 + 4 tig .. bytes
        // 32 i + 16 + 4 tig ..: words 8 i + tig and 8 i + 4 + tig of the column (the decode rows'
        // 144-byte pitch puts a quarter-warp's 32 words on 32 banks).
        const uint32_t* ra = reinterpret_cast<const uint32_t*>(st.w + fp8_wrow<kN>() * c0) + tig;
        const uint32_t* rb = reinterpret_cast<const uint32_t*>(st.w + fp8_wrow<kN>() * (c0 + 8)) + tig;
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i][0] = ra[8 * i], a[i][2] = ra[8 * i + 4], a[i][1] = rb[8 * i], a[i][3] = rb[8 * i + 4];
        sw = __uint_as_float(st.ws[0]);
      } else {
        uint32_t tab[2][2];
        if constexpr (!kDecode) {
          static_assert(kDecode || kSpan == 1, "the prefill form's slot is one group");
          w4a8_prefill_tables(words.s, b1_ref, tig, tab);
        } else {
          words = w4a8_group_words(st.w, st.ws, c0, tig);  // (s unused: the prep gives the tables)
          w4a8_decode_tables(st.ws, prep_b1 + 16 * sub, b1_ref, c0, gid, tig, tab);
        }
        w4a8_convert(words.w, tab, a);
      }
      const uint8_t* gx = st.x;
      const float* gsa = st.sa;
      if constexpr (kFp8W && kDecode)
        if (quant_in) gx = quant_x(kg - g_lo), gsa = quant_sa(kg - g_lo);
      w4a8_group_mma_fold<kN, kFp8W>(gx, a, sw, gsa, tig, d, acc);
    }
    if constexpr (kRing != 0) {  // the warp is done with the slot (its wgmma have completed, its reads made)
      __syncwarp();
      if (lane == 0) mbar_arrive(&ring_empty[ring_slot]);
    }
  }
  cp_async_wait<0>();
  while (quarter < q_first + q_count) finish_quarter();
  // (scatter_slots only where unsplit with one projection: launch_grouped_w4a8's check; never for
  // the dense FP8 linears)
  if (!split) out.store(g.out + second_offset, total + tid, kThreads, kFp8W ? nullptr : g.scatter_slots);
}

// The W4A8 prefill kernel's persistent form (kRing 4: ring form 3, each block taking work item after
// work item): a block of four warpgroups takes items blockIdx.x, blockIdx.x + gridDim.x, ... (item
// w: column block w % col_blocks of w4a8_find_tile's tile w / col_blocks, the order of the grid's
// cols_fast raster) until the first past the last tile, and its ring runs on from one item into the
// next: the next item's first groups are copied while the current one's last groups are multiplied,
// and its weights' row scales are read then too. Each output's arithmetic is ring form 3's (the same
// bits). With one block an SM, a block of the grid form started with its tile search, its rows'
// sources and kStages - 2 groups' copies, and ended with its stores, the SM's tensor cores idle all
// the while; w2 (N = 4096, K = 2048 in V4-Flash) has half w1's groups a block and twice its blocks.
// Items reach the ring's copies and the stores through three buffers of their descriptions (item i
// in buffer i % 3): threads 0 .. kN - 1 describe item i + 1 (its tile, expert and rows' sources)
// once every thread's copies of item i's first group have landed, so every thread is done with the
// buffer they overwrite (item i - 2's: it has stored item i - 2 before it copied item i's first
// group, in its multiplies of item i - 1), then arrive on the buffer's mbarrier, which each thread
// waits for where its copies enter item i + 1 (at the consumer's group groups - (kStages - 2) of
// item i). The stores read their item's rows from its buffer (fewer registers held through the
// multiplies: at the 128 a thread the launch bounds allow, ptxas spilled).
// REQUIRES N % 64 == 0 and groups > kStages - 2 (the copies run kStages - 2 groups ahead, never
// past the next item, and the next item is described after the first group: launch_grouped_w4a8
// takes ring form 3 otherwise), tiled MXFP4 experts, the codes rows_pad x k_pad and the activation
// scales (k_pad / 128) x rows_pad under 2^32 each.
constexpr int kW4A8PersistBars = 3;  // the item buffers' mbarriers, after the ring's
__host__ __device__ constexpr size_t w4a8_persist_smem_bytes() {
  return wg_ring_smem_bytes<4, kW4A8RingStages>() + kW4A8PersistBars * sizeof(uint64_t);
}
__global__ void __launch_bounds__(kWgThreads * 4, 1) grouped_w4a8_persistent_kernel(GroupedW4A8Args g) {
  wait_previous_grid();  // the plan and the rows' codes are the previous kernels' outputs
  constexpr int kN = kTiledRows, kWG = 4, kStages = kW4A8RingStages, kThreads = kWgThreads * kWG, kCols = kWgCols * kWG;
  constexpr int kAhead = kStages - 2;  // groups the copies run ahead of the multiplies
  using Stage = WgStage<kN, kWG>;
  static_assert(kThreads == 8 * kN, "a thread's one 16-byte piece of a group's codes");
  static_assert(fp4_group_step(true) == kWgCols * 64, "a group of a warpgroup's 64 columns is one piece of 4 KB");
  extern __shared__ __align__(128) uint8_t wg_smem[];
  Stage* ring = reinterpret_cast<Stage*>(wg_smem);
  float* total = reinterpret_cast<float*>(ring + kStages);
  uint64_t* const ring_full = reinterpret_cast<uint64_t*>(total + (kN / 2) * kThreads);
  uint64_t* const ring_empty = ring_full + kStages;
  uint64_t* const item_ready = ring_empty + kStages;
  constexpr int kBufs = kW4A8PersistBars;
  __shared__ int64_t s_src[kBufs][kN];  // the item's rows' codes rows (-1 past its expert's rows)
  __shared__ int64_t s_t0[kBufs], s_r0[kBufs], s_R[kBufs];
  __shared__ int s_e[kBufs];  // its expert, -1 past the last tile
  // (The warp's index through a shuffle from lane 0: the compiler then knows it is the same across
  // the warp, and the branches on it below (warps 0-1 describe items, warps 0-7 copy scales) are
  // not divergent to it. Tested on tid, they were: the shared window's base, first computed inside
  // such a branch, stayed in an ordinary register, and so did every ring address derived from it
  // and the slot counters, each copy and arrive then looping to make its address uniform (BRA.U.ANY
  // in the SASS; ring form 3 keeps them in uniform registers). On an H100, 2026-12-06, layer 0's
  // 8K prefill: w1 2.02 -> 1.89-1.90 ms (form 3's), 1,099 M -> 1,006 M instructions (form 3 1,057 M),
  // w2 2.48 -> 2.31 (form 3 2.32).)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int lane = tid % 32, gid = lane / 4, tig = lane % 4;
  static_assert(kN % 32 == 0 && kCols % 32 == 0, "the rows' and the columns' threads are whole warps");
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&ring_full[s], kThreads + kWG), mbar_init(&ring_empty[s], kThreads / 32);
    for (int b = 0; b < kBufs; ++b) mbar_init(&item_ready[b], kN);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int N = static_cast<int>(g.N), K = static_cast<int>(g.K), groups = K / kW4A8GroupK;
  const int col_blocks = (N + kCols - 1) / kCols;
  const int64_t works = static_cast<int64_t>(col_blocks) * g.max_tiles;
  // (threads 0 .. kN - 1, two whole warps) Item i's description into buffer i % kBufs.
  const auto item_n0 = [&](int i) { return static_cast<int>((blockIdx.x + static_cast<int64_t>(i) * gridDim.x) % col_blocks) * kCols; };
  const auto describe = [&](int i) {
    const int64_t w = blockIdx.x + static_cast<int64_t>(i) * gridDim.x;
    const int b = i % kBufs;
    int e = -1;
    int64_t t0 = 0, src = -1;
    if (w < works) w4a8_find_tile(g, w / col_blocks, e, t0);  // (w is the same across the warp)
    if (e >= 0) {
      const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0, tr = t0 + tid;
      src = tr < R ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : -1;
      if (tid == 0) s_r0[b] = r0, s_R[b] = R;
    }
    s_src[b][tid] = src;
    if (tid == 0) s_e[b] = e, s_t0[b] = t0;
    mbar_arrive(&item_ready[b]);
  };
  if (warp < kN / 32) describe(0);

  // The copies' sources in the item they are in (entered when its description is ready): this thread's 16-byte piece of a group's codes (row tid % kN, chunk tid / kN: as the grid form
  // places them), column tid's packed scales (tid < kCols), row tid's activation scale (tid < kN),
  // and (each warpgroup's first thread) the warpgroup's 64 columns' weights by one bulk copy.
  const int xrow = tid % kN, xchunk = tid / kN;
  const int xdst = static_cast<int>(offsetof(Stage, x)) + ((xchunk * (kN / 8)) + xrow / 8) * 128 + (xrow % 8) * 16;
  const bool bulk_lead = tid % kWgThreads == 0;
  const int c0 = 16 * warp + gid;
  int in_b1[2] = {0, 0};  // (the weight rows' w4a8_b1_ref, read here for the item's multiplies)
  // (The codes' and activation scales' sources as 32-bit offsets from g.codes and g.scales: fewer
  // registers, where 64-bit pointers made ptxas spill.)
  const uint8_t *ssrc = nullptr, *bulk_src = nullptr;
  uint32_t xoff = 0, aoff = 0;
  bool xok = false, scol_ok = false, arow_ok = false, bulk_in = false;
  int next_stage_index = 0;
  uint32_t empty_phase = 1u;
  bool wrapped = false;  // every slot filled once: a refill waits for the slot's release
  // The copies' sources at item i's first group, once its description is ready; false past the
  // last tile.
  const auto enter = [&](int i) {
    const int b = i % kBufs;
    mbar_wait(&item_ready[b], static_cast<uint32_t>(i / kBufs) & 1u);
    const int e = s_e[b];
    if (e < 0) return false;
    const int in_n0 = item_n0(i);
    const DevWeight W = g.w[e];
    const int64_t xs = s_src[b][xrow];
    xok = xs >= 0;
    xoff = xok ? static_cast<uint32_t>(xs * g.k_pad + 16 * xchunk) : 0u;
    scol_ok = tid < kCols && in_n0 + tid < N;
    ssrc = static_cast<const uint8_t*>(W.scale) + static_cast<int64_t>(scol_ok ? in_n0 + tid : 0) * W.scale_cols;
    const int64_t arow = tid < kN ? s_src[b][tid] : -1;
    arow_ok = arow >= 0;
    aoff = arow_ok ? static_cast<uint32_t>(arow) : 0u;
    const int wg_n0 = in_n0 + kWgCols * (tid / kWgThreads);
    bulk_in = wg_n0 < N;
    bulk_src = static_cast<const uint8_t*>(W.data) + (bulk_in ? fp4_offset(true, K / 2, wg_n0, 0) : 0);
    in_b1[0] = w4a8_b1_ref(w4a8_row_emax(W, in_n0 + c0, N));
    in_b1[1] = w4a8_b1_ref(w4a8_row_emax(W, in_n0 + c0 + 8, N));
    return true;
  };
  // Copies the entered item's next group into the next slot.
  const auto issue = [&] {
    const int slot_i = next_stage_index;
    if (wrapped) mbar_wait(&ring_empty[slot_i], empty_phase);
    Stage* st = ring + slot_i;
    if (bulk_lead) {
      constexpr uint32_t kBytes = kWgCols * 64;
      mbar_arrive_expect_tx(&ring_full[slot_i], bulk_in ? kBytes : 0u);
      if (bulk_in) bulk_copy_to_smem<false>(st->w + kBytes * (tid / kWgThreads), bulk_src, kBytes, &ring_full[slot_i]);
    }
    bulk_src += fp4_group_step(true);
    cp_async(reinterpret_cast<uint8_t*>(st) + xdst, g.codes + xoff, xok, 16);
    xoff += kW4A8GroupK;
    if (warp < kCols / 32) cp_async(&st->ws[tid], ssrc, scol_ok, 4);
    ssrc += 4;
    if (warp < kN / 32) cp_async(&st->sa[tid], g.scales + aoff, arow_ok, 4);
    aoff += static_cast<uint32_t>(g.rows_pad);
    next_stage_index = next_stage_index + 1 == kStages ? 0 : next_stage_index + 1;
    if (next_stage_index == 0) empty_phase ^= 1u, wrapped = true;
    cp_async_arrive_noinc(&ring_full[slot_i]);
  };
  // (enter's result is the same in every thread, but it comes from shared memory, which the
  // compiler cannot know: through a warp vote it is uniform to it, and so are the ring's slot
  // counters that the copies under it advance. Alone, without the shuffle above, the vote changed
  // little: w1 2.04 -> 2.02 ms, the slot counters still per-thread in the SASS.)
  if (!__all_sync(0xffffffffu, enter(0))) return;
  for (int i = 0; i < kAhead; ++i) issue();

  constexpr int kAcc = kN / 2;
  float acc[kAcc], d[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f, d[i] = 0.0f;
  int stage_index = 0;
  uint32_t full_phase = 0u;
  int b1_ref[2], quarter = 0, quarter_end = 0;
  // Group kg of the current item: its multiplies, and (with_copies) the copies kAhead groups on.
  const auto step = [&](int kg, bool with_copies) {
    const int ring_slot = stage_index;
    mbar_wait(&ring_full[ring_slot], full_phase);  // everyone's copies have landed,
    fence_proxy_async_smem();                      // and are visible to wgmma's reads
    const Stage& st = ring[ring_slot];
    stage_index = stage_index + 1 == kStages ? 0 : stage_index + 1;
    if (stage_index == 0) full_phase ^= 1u;
    const W4A8GroupWords words = w4a8_group_words(st.w, st.ws, c0, tig);
    if (with_copies) issue();
    while (kg >= quarter_end) {
      w4a8_finish_quarter(total + tid, kThreads, quarter, acc);
      quarter_end = w4a8_quarter(++quarter + 1, groups);
    }
    uint32_t tab[2][2], a[4][4];
    w4a8_prefill_tables(words.s, b1_ref, tig, tab);
    w4a8_convert(words.w, tab, a);
    w4a8_group_mma_fold<kN, false>(st.x, a, 1.0f, st.sa, tig, d, acc);
    __syncwarp();  // the warp is done with the slot (its wgmma have completed, its reads made)
    if (lane == 0) mbar_arrive(&ring_empty[ring_slot]);
  };
  for (int item = 0;; ++item) {
    // The copies are kAhead groups into this item: the rows' scales they read are its.
    b1_ref[0] = in_b1[0], b1_ref[1] = in_b1[1];
    quarter = 0, quarter_end = w4a8_quarter(1, groups);
    // Its groups whose copies kAhead on are its own (groups > kAhead); the next item described
    // after the first (every thread's copies of this item's first group have landed: the buffer it
    // overwrites is done with), then entered, and its first kAhead groups copied under this item's
    // last.
    step(0, true);
    if (warp < kN / 32) describe(item + 1);
    for (int kg = 1; kg < groups - kAhead; ++kg) step(kg, true);
    const bool next = __all_sync(0xffffffffu, enter(item + 1));  // (uniform to the compiler: above)
    for (int kg = groups - kAhead; kg < groups; ++kg) step(kg, next);
    while (quarter < kW4A8Warps) w4a8_finish_quarter(total + tid, kThreads, quarter++, acc);
    const int b = item % kBufs;
    const W4A8BlockOut<kN> out{s_t0[b], s_R[b], s_r0[b], g.N, item_n0(item) + c0, N, tig, {b1_ref[0], b1_ref[1]}, true};
    out.store(g.out, total + tid, kThreads, g.scatter_slots);
    if (!next) break;
  }
}

// The split kernels' parts added in order: out = (((p0 + p1) + p2) + ...), as the unsplit kernels
// add them (the W4A8 and FP8 kernels' four quarters, the bf16 kernels' bf16_parts); rounded to bf16
// when asked (the op's round_bf16, which bf16_round_kernel would apply after: the same values).
// kVec: four neighbouring values a thread through 16-byte loads and stores (count a multiple of 4,
// both arrays 16-byte aligned), each value's sum as the one-value form makes it. The sum is the
// readers' own (dev_parts_at, parts_in_readers): one definition of its arithmetic.
template <bool kVec>
__global__ void parts_sum_kernel(float* out, PartsView v, int64_t count) {
  wait_previous_grid();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * (kVec ? 4 : 1);
  if (i >= count) return;
  if constexpr (kVec) *reinterpret_cast<float4*>(out + i) = dev_parts_at4(v, i);
  else out[i] = dev_parts_at(v, i);
}
// out [count] from partial [parts][count] (a no-op for count 0).
// `round` in the sum unless SPARROW_CUDA_DISABLE=fused_round (then a bf16_round pass after, the same bits).
// SPARROW_CUDA_REPEAT_PARTS_SUM=n (0 to 8, default 0) launches the sum n more times, each writing
// the same values (out and partial never overlap): a probe of what one such launch costs inside a
// captured step, for the benchmark's A/B (docs/cuda.md), never a setting to run with.
void add_parts(float* out, const float* partial, int64_t count, int parts, bool round = false) {
  static const bool fused = cuda_feature_on("fused_round");
  static const int repeat = cuda_probe_repeats("SPARROW_CUDA_REPEAT_PARTS_SUM");
  if (count <= 0) return;
  const PartsView v(partial, count, parts, round && fused);
  for (int r = 0; r <= repeat; ++r) {
    if (four_wide(count, out, partial))
      launch(parts_sum_kernel<true>, blocks_for(count / 4, 256), 256, 0, out, v, count);
    else
      launch(parts_sum_kernel<false>, blocks_for(count, 256), 256, 0, out, v, count);
  }
  if (round && !fused) launch_bf16_round(out, count);
}
void add_quarters(float* out, const float* partial, int64_t count, bool round = false) {
  add_parts(out, partial, count, kW4A8Warps, round);
}

// ---- The FP8 linear's prefill kernel: TMA, mbarriers, both wgmma operands in shared memory ----------
//
// The same arithmetic as the kernels above with e4m3 weights (kFp8W), so every row gets the bits the
// decode form gives it: per group of 128 inputs d = four wgmma k32 from zero (the natural input
// order in both operands), acc = fma(d, sw * sa, acc) within each quarter of the groups, the
// quarters added in order. A tile is 128 tokens (two consumer warpgroups of 64, wgmma's M) x 128
// weight rows (wgmma's N) over the whole K; the blocks are persistent (one an SM, tiles strided).
// The tokens are the M operand here (the decode forms have the weights there) so that a thread's
// accumulators span two tokens: its fold is two scale products sw * sa and 64 fma, where with the
// weights as M each thread's 64 slots spanned 32 tokens and the fold 16 shared-memory loads of
// products that the warpgroup made behind a named barrier (wq_b at M = 8192 0.93-0.95 ms: a
// consumer warp spent about half its samples folding, ncu source counters, H200 2026-12-04). The
// products are exact and summed in k's order whichever operand holds them, so d's bits are the
// decode form's (the FP8 linear tests compare them). A third
// warpgroup's first thread feeds a ring of kTmaStages stages by TMA (the weights' and the codes'
// 128 x 128-byte boxes 128-byte swizzled, the tokens' 128 activation scales of the group), full
// barriers counting the bytes in and empty barriers counting the consumer warps out; the ring runs
// on across a block's tiles, so the next tile's loads overlap this one's stores. Tokens and weight
// rows past the tensors' ends come in as zeros (TMA's out-of-bounds fill) and are not written. A
// finished tile leaves through shared memory by TMA stores (where N's pitch allows), which run on
// under the next tile's groups: st.global from the accumulators held a tenth of wq_b's warp samples
// (1 GB of fp32 outputs at M = 8192). Their 64 KB cost the ring its fifth stage. wq_b's kernel at
// M = 8192 went 904 -> 660 us with the selects gone, the weight scale a group ahead and these
// stores; wo_b 625 -> 553 (H200, 2026-12-04, ncu at the card's clocks).
constexpr int kTmaRows = 128, kTmaCols = 128, kTmaStages = 4, kTmaBox = kTmaRows * kW4A8GroupK;
static_assert(kTmaRows == kW4A8TmaTileRows, "the expanded form's tiles are the TMA kernel's");
constexpr int kTmaThreads = 3 * kWgThreads;  // two consumer warpgroups, then the producer's
// A finished tile's outputs on their way out by TMA stores: each consumer warpgroup's 64 tokens x
// 128 weight rows of fp32 as four boxes of 32 columns (128 bytes a token, 128-byte swizzled).
constexpr int kTmaOutBox = 64 * 32 * static_cast<int>(sizeof(float));
constexpr size_t kTmaOutBytes = 2 * 4 * kTmaOutBox;
// Then the ring's barriers, and (the expanded W4A8 form) the block's count of tiles.
constexpr size_t kTmaSmemBytes = 1024 /* alignment slack */ + kTmaStages * (2 * kTmaBox + kTmaRows * sizeof(float)) +
                                 kTmaOutBytes + 2 * kTmaStages * sizeof(uint64_t) + sizeof(int64_t);

struct Fp8TmaArgs {
  CUtensorMap w_map;  // the weights' e4m3 codes [N][K]: boxes of 128 rows x 128 bytes, 128-byte swizzle
  CUtensorMap x_map;  // the activations' codes [rows_total][k_pad]: the same boxes
  CUtensorMap s_map;  // their scales, f32 [groups][rows_pad] as dims {rows_total, groups}: boxes of 128 x 1
  CUtensorMap o_map;  // out [rows_total][N] f32 (unsplit, o_tma): boxes of 64 tokens x 32 columns, 128-byte swizzle
  CUtensorMap xh_map;  // (kPair) x_map's codes in boxes of 64 rows: each block of a pair copies its half to both
  int o_tma;          // whether tiles leave by TMA stores through o_map (else st.global)
  float* out;         // [rows_total, N]; with split, the quarters' sums [4][rows_total][N]
  const float* w_scales;
  int64_t w_scale_ld;
  int64_t rows_total;
  int N, groups;
  int split;  // 1, or 4: a work item is one quarter of a tile's groups (few tiles: more blocks)
  int raster_group;  // tma_tile_at's group of weight tiles (1: a weight tile's token tiles in a row)
  // The expanded W4A8 form (kW4A8: launch_w4a8_expanded): w_map the experts' e5m2 bytes [E N][K],
  // x_map the grouped rows' codes; s_map their scales as w4a8_tma_tiles_kernel lays them out, a
  // tile's 128 rows a group in a row of their own [tiles groups][128] (in place a box of a tile's
  // scales would start at its expert's first row, and a tensor copy's box must start on 16 bytes:
  // "illegal instruction" where it did not, H100 2026-12-06). offsets [E + 1] the experts' rows, w
  // their weights (row_emax: the rows' scales at the store), slots (or null) where row r's outputs go.
  const int64_t* offsets;
  const DevWeight* w;
  const int32_t* slots;
  int64_t experts;
  const int64_t* tiles;  // [tiles][2]: each 128-row tile's {expert, first row} (w4a8_tma_tiles_kernel)
};

// The pair form's cluster (fp8_linear_tma_kernel<., false, true>): this block's rank in its cluster
// of two, the cluster's barrier (every thread of both blocks; release, then acquire), a copy of a box
// into the same shared-memory offset of both blocks, each counted on its own block's bar, and an
// arrival on the other block's barrier at bar's offset.
__device__ inline uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ inline void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ inline void tma_load_2d_pair(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(static_cast<uint16_t>(3))
      : "memory");
}
__device__ inline void mbar_arrive_peer(uint64_t* bar, uint32_t peer) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(bar)), "r"(peer));
  // (The default, CTA-scope release, as CUTLASS's ClusterBarrier::arrive: the cluster-scope release
  // put a MEMBAR in every k-block and made the pair form twice as slow, H100 2026-12-07.)
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// The TMA kernels' ring barriers: full[s] completes on the producer's bytes, empty[s] on each of
// the two consumer warpgroups' warps; set up by thread 0 before any use (the block synchronises).
// (kPair: empty[s] also counts the other block's consumer warps, whose copies it waits for, and both
// blocks' barriers are set up before either block goes on.)
template <bool kPair = false>
__device__ inline void tma_ring_init(uint64_t* full, uint64_t* empty, int stages) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], (kPair ? 2 : 1) * 2 * kWgThreads / 32);  // each consumer warp's lane 0
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kPair) cluster_sync_all();
  else __syncthreads();
}
// A 2-D box of map at (c0 inner, c1 outer) into dst, counted on bar.
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// A 2-D box of shared memory at src out to map at (c0 inner, c1 outer), in this thread's bulk group
// (elements past the tensor's ends are not written).
__device__ inline void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups done reading shared memory (kRead) or done.
template <bool kRead>
__device__ inline void bulk_wait_all() {
  if constexpr (kRead)
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// A the rows' e4m3 codes, B the weights: e4m3 codes, or (kBE5m2: the expanded W4A8 form) e5m2 bytes.
#define SPARROW_WGMMA_M64N128K32_SS(btype)                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3." btype " " SPARROW_WGMMA_P64            \
               ", %64, %65, p, 1, 1;\n}\n"                                                              \
               : SPARROW_WGMMA_D64                                                                     \
               : "l"(a_desc), "l"(b_desc), "r"(accumulate))
template <bool kBE5m2 = false>
__device__ inline void wgmma_m64n128k32_ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  if constexpr (kBE5m2) SPARROW_WGMMA_M64N128K32_SS("e5m2");
  else SPARROW_WGMMA_M64N128K32_SS("e4m3");
}
#undef SPARROW_WGMMA_M64N128K32_SS

// A consumer thread's 64 slots of a TMA kernel's 128 x 128 tile into dst [rows][N]: slot 4 j + c
// (value(slot)) is token t0 + 8 j + 2 tig + (c & 1) of weight row row0 + 8 (c / 2). A whole tile
// goes without bounds checks, one address a pair of tokens (each store checked and addressed alone,
// the stores of a K = 1024 GEMM at 256 rows held a third of its warps' stall samples: ncu source
// counters, H200 2026-12-04).
template <class Value>
__device__ inline void store_tma_tile(float* dst, int64_t rows, int N, int64_t t0, int n0, int row0, int tig, Value value) {
  const int64_t ld = N;
  if (t0 + kTmaRows <= rows && n0 + kTmaCols <= N) {
    float* p = dst + (t0 + 2 * tig) * ld + row0;
#pragma unroll
    for (int j = 0; j < 16; ++j, p += 8 * ld) {
      p[0] = value(4 * j);
      p[ld] = value(4 * j + 1);
      p[8] = value(4 * j + 2);
      p[ld + 8] = value(4 * j + 3);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t t = t0 + 8 * j + 2 * tig + (c & 1);
      const int n = row0 + (c < 2 ? 0 : 8);
      if (t < rows && n < N) dst[t * ld + n] = value(4 * j + c);
    }
}

// The same with the tokens as wgmma's M (fp8_linear_tma_kernel): a consumer thread's 64 slots,
// slot 4 j + c (value(slot)) token t + 8 (c / 2) (t: the thread's first token, in the tile from
// t0) and weight row n0 + 8 j + 2 tig + (c & 1), so each pair of slots is two adjacent outputs: one
// 8-byte store where the tile is whole and N even.
template <class Value>
__device__ inline void store_tma_tile_tokens(float* dst, int64_t rows, int N, int64_t t0, int64_t t, int n0, int tig,
                                             Value value) {
  const int64_t ld = N;
  if (t0 + kTmaRows <= rows && n0 + kTmaCols <= N && (N & 1) == 0) {
    float* p = dst + t * ld + n0 + 2 * tig;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<float2*>(p + 8 * j) = make_float2(value(4 * j), value(4 * j + 1));
      *reinterpret_cast<float2*>(p + 8 * ld + 8 * j) = make_float2(value(4 * j + 2), value(4 * j + 3));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t tc = t + (c < 2 ? 0 : 8);
      const int n = n0 + 8 * j + 2 * tig + (c & 1);
      if (tc < rows && n < N) dst[tc * ld + n] = value(4 * j + c);
    }
}

// The expanded W4A8 form's store (fp8_linear_tma_kernel<false, true>): a consumer thread's 64 sums,
// slot 4 j + c grouped row t0 + tok (+ 8 for c >= 2) of expert e and output column (weight row)
// n0 + 8 j + 2 tig + (c & 1), each times its weight row's scale as W4A8BlockOut::store makes it, to
// row r (or slots[r]) of out [., N]; rows past the expert's and columns past N left out.
__device__ inline void store_w4a8_expanded(const Fp8TmaArgs& a, int e, int64_t t0, int tok, int n0, int tig,
                                           const float (&total)[64]) {
  const int64_t r0 = a.offsets[e], R = a.offsets[e + 1] - r0;
  const DevWeight& W = a.w[e];
  int64_t dst[2];
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const int64_t tr = t0 + tok + 8 * v;
    dst[v] = tr >= R ? -1 : (a.slots != nullptr ? a.slots[r0 + tr] : r0 + tr) * a.N;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = n0 + 8 * j + 2 * tig + h;
      if (col >= a.N) continue;
      const float cs = w4a8_row_scale(w4a8_row_emax(W, col, a.N));  // (W4A8BlockOut's, from b1_ref's inverse)
#pragma unroll
      for (int v = 0; v < 2; ++v)
        if (dst[v] >= 0) a.out[dst[v] + col] = total[4 * j + 2 * v + h] * cs;
    }
}

// kRound (unsplit only): the outputs rounded to bf16 in the store, launch_bf16_round's values. A
// template argument, not a flag: with a run-time flag the unrounded kernel's wq_b (K = 1024, 8192
// rows) took 1.25-1.27 ms against 1.13 (H200, 2026-12-03).
// kW4A8: the expanded W4A8 form (launch_w4a8_expanded; unsplit, unrounded, no TMA stores): work item
// i is weight tile i % W of the experts' 128-row tile i / W (W the weight tiles; the tiles counted
// here as w4a8_find_tile counts them, and listed by w4a8_tma_tiles_kernel: the producer, at 40
// registers after setmaxnreg, only reads the list); B the expert's e5m2 weight rows, no weight scale (sw = 1: the
// fold's factor is sa itself), each output times its row's scale where it is stored.
// kPair (unsplit, plain FP8, an even number of weight tiles; launch_fp8_tma with fp8_pair on): the
// blocks run in clusters of two that take weight tiles 2 n and 2 n + 1 of the same token tile, work
// item i of the cluster being that pair (tma_tile_at over the pairs); each block copies its half of
// the shared activation box (64 tokens, xh_map) into both blocks' stages, so a pair reads the box
// from L2 once. A stage is refilled when the consumers of both blocks are done with it (empty[s]
// counts both); both blocks wait for each other before they leave (the other's copies and arrivals
// target this block's memory). The same products in the same order: the same bits.
template <bool kRound, bool kW4A8 = false, bool kPair = false>
__global__ void __launch_bounds__(kTmaThreads, 1) fp8_linear_tma_kernel(const __grid_constant__ Fp8TmaArgs a) {
  wait_previous_grid();
  static_assert(!(kPair && kW4A8), "the pair form is the plain FP8 one's");
  extern __shared__ uint8_t tma_smem_raw[];
  uint8_t* smem = smem_align_1024(tma_smem_raw);  // the stages' boxes on 1024-byte boundaries
  uint8_t* w_box = smem;                                    // [stage][128 rows][128 bytes]
  uint8_t* x_box = smem + kTmaStages * kTmaBox;             // [stage][128 tokens][128 bytes]
  uint8_t* o_stage = smem + 2 * kTmaStages * kTmaBox;      // [warpgroup][4 boxes] of kTmaOutBox
  float* sa = reinterpret_cast<float*>(o_stage + kTmaOutBytes);  // [stage][128 tokens]
  uint64_t* full = reinterpret_cast<uint64_t*>(sa + kTmaStages * kTmaRows);
  uint64_t* empty = full + kTmaStages;
  int64_t* tile_count = reinterpret_cast<int64_t*>(empty + kTmaStages);  // (kW4A8)
  const int tid = threadIdx.x, wg = tid / kWgThreads;
  const int groups = a.groups, token_tiles = static_cast<int>((a.rows_total + kTmaRows - 1) / kTmaRows);
  const int weight_tiles = (a.N + kTmaCols - 1) / kTmaCols;
  int items = token_tiles * (kPair ? weight_tiles / 2 : weight_tiles) * a.split;
  const uint32_t rank = kPair ? cluster_rank() : 0;
  // This block's first work item and its step: the cluster's with kPair (its blocks 2 c and 2 c + 1).
  const int first_item = kPair ? blockIdx.x / 2 : blockIdx.x, item_step = kPair ? gridDim.x / 2 : gridDim.x;
  if constexpr (kW4A8) {
    // The experts' 128-row tiles (as w4a8_find_tile counts them), by warp 0 before the ring's barrier.
    if (tid < 32) {
      int64_t count = 0;
      for (int64_t e = tid; e < a.experts; e += 32) count += (a.offsets[e + 1] - a.offsets[e] + kTmaRows - 1) / kTmaRows;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
      if (tid == 0) *tile_count = count;
    }
    __syncwarp();  // (warp 0 converged again before the aligned instructions below)
  }
  tma_ring_init<kPair>(full, empty, kTmaStages);
  if constexpr (kW4A8) items = static_cast<int>(*tile_count) * weight_tiles;
  // Persistent: the block's work items are blockIdx.x, + gridDim.x, ...; item i is quarter i % split
  // (its groups [g_lo, g_hi); all of them unsplit) of tile t = i / split (tma_tile_at). The ring's
  // position runs on across items.
  const auto item_at = [&](int item, int& t0, int& n0, int& q, int& g_lo, int& g_hi) {
    const int tile = item / a.split;
    q = item % a.split;
    int m, n;
    if constexpr (kPair) {
      tma_tile_at(tile, token_tiles, weight_tiles / 2, a.raster_group, m, n);
      n = 2 * n + static_cast<int>(rank);
    } else {
      tma_tile_at(tile, token_tiles, weight_tiles, a.raster_group, m, n);
    }
    t0 = m * kTmaRows, n0 = n * kTmaCols;
    g_lo = a.split > 1 ? w4a8_quarter(q, groups) : 0;
    g_hi = a.split > 1 ? w4a8_quarter(q + 1, groups) : groups;
  };
  if (wg == 2) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if constexpr (kW4A8) {
      if (tid == 2 * kWgThreads) {
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
          const int64_t* tile = a.tiles + 2 * (item / weight_tiles);
          const int e = static_cast<int>(tile[0]), n0 = (item % weight_tiles) * kTmaCols;
          const int r = static_cast<int>(a.offsets[e] + tile[1]);
          for (int kg = 0; kg < groups; ++kg, ++it) {
            const int s = it % kTmaStages, round = it / kTmaStages;
            if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
            mbar_arrive_expect_tx(&full[s], 2 * kTmaBox + kTmaRows * sizeof(float));
            tma_load_2d(w_box + s * kTmaBox, &a.w_map, kg * kW4A8GroupK, e * a.N + n0, &full[s]);
            tma_load_2d(x_box + s * kTmaBox, &a.x_map, kg * kW4A8GroupK, r, &full[s]);
            tma_load_2d(sa + s * kTmaRows, &a.s_map, 0, (item / weight_tiles) * groups + kg, &full[s]);
          }
        }
      }
    } else if (tid == 2 * kWgThreads) {
      int it = 0;
      for (int item = first_item; item < items; item += item_step) {
        int t0, n0, q, g_lo, g_hi;
        item_at(item, t0, n0, q, g_lo, g_hi);
        for (int kg = g_lo; kg < g_hi; ++kg, ++it) {
          const int s = it % kTmaStages, round = it / kTmaStages;
          if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
          mbar_arrive_expect_tx(&full[s], 2 * kTmaBox + kTmaRows * sizeof(float));
          tma_load_2d(w_box + s * kTmaBox, &a.w_map, kg * kW4A8GroupK, n0, &full[s]);
          if constexpr (kPair)  // this block's 64 tokens of the box, into both blocks' stage s
            tma_load_2d_pair(x_box + s * kTmaBox + rank * (kTmaBox / 2), &a.xh_map, kg * kW4A8GroupK,
                             t0 + static_cast<int>(rank) * (kTmaRows / 2), &full[s]);
          else
            tma_load_2d(x_box + s * kTmaBox, &a.x_map, kg * kW4A8GroupK, t0, &full[s]);
          tma_load_2d(sa + s * kTmaRows, &a.s_map, t0, kg, &full[s]);
        }
      }
    }
    if constexpr (kPair) cluster_sync_all();  // (the other block's copies and arrivals done)
    return;
  }
  // The consumers: 232 registers a thread (the producer's warpgroup gives its own up), for d, acc
  // and the finished quarters' sums, 64 each.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = wg, lane = tid % 32, warp = (tid / 32) % 4, tig = lane % 4;
  // The tokens are wgmma's M (warpgroup cw takes the tile's tokens 64 cw ..), the weight rows its N:
  // slot 4 j + c is token 64 cw + 16 warp + gid (+ 8 for c >= 2) of the tile, weight row n0 + 8 j +
  // 2 tig + (c & 1). A thread's slots so span two tokens, and its fold two scale products.
  const int tok = 64 * cw + 16 * warp + lane / 4;
  // Without selects on the accumulators (a quarter's first group folds into zero, total starts at
  // -0, the identity of +, so its first quarter's sum is total + acc): where they were selected,
  // FSEL took 13 % and IMAD 17 % of wq_b's warp samples (ncu source counters, H200 2026-12-04).
  float d[64], acc[64], total[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = acc[i] = 0.0f;
  int s = 0;
  uint32_t phase = 0;  // the ring's stage and its round's parity
  for (int item = first_item; item < items; item += item_step) {
    int t0 = 0, n0, q = 0, g_lo = 0, g_hi = groups;
    int e_item = 0;  // (kW4A8) the item's expert and first row (read now, used at the store)
    int64_t t0_item = 0;
    if constexpr (kW4A8) {
      __syncwarp();  // (converged after the last item's store, before the aligned wgmma)
      n0 = (item % weight_tiles) * kTmaCols;
      e_item = static_cast<int>(a.tiles[2 * (item / weight_tiles)]);
      t0_item = a.tiles[2 * (item / weight_tiles) + 1];
    } else {
      item_at(item, t0, n0, q, g_lo, g_hi);
    }
    const float* ws = kW4A8 ? nullptr : a.w_scales + static_cast<int64_t>(n0 / 128) * a.w_scale_ld;
    // Split: one quarter, its sum written as it is (acc); else the quarters as the kernels above.
    int quarter = 0, quarter_end = a.split > 1 ? g_hi : w4a8_quarter(1, groups);
    bool fresh = true;  // acc holds no group of this quarter yet (it is zero)
#pragma unroll
    for (int r = 0; r < 64; ++r) total[r] = -0.0f;
    const auto finish_quarter = [&] {
      if (fresh) {
#pragma unroll
        for (int r = 0; r < 64; ++r) total[r] = total[r] + 0.0f;
      } else {
#pragma unroll
        for (int r = 0; r < 64; ++r) total[r] = total[r] + acc[r];
      }
      fresh = true;
      ++quarter;
    };
    // The weight scale a group ahead (its load's latency showed at the product: ncu, 2026-12-04).
    // (kW4A8: no weight scale; 1 * sa is sa, the W4A8 kernels' factor.)
    float sw_next = kW4A8 ? 1.0f : g_lo < g_hi ? __ldg(ws + g_lo) : 0.0f;
    for (int kg = g_lo; kg < g_hi; ++kg) {
      while (kg >= quarter_end) {
        finish_quarter();
        quarter_end = w4a8_quarter(quarter + 1, groups);
      }
      const float sw = sw_next;
      if (!kW4A8 && kg + 1 < g_hi) sw_next = __ldg(ws + kg + 1);
      mbar_wait(&full[s], phase);
#pragma unroll
      for (int r = 0; r < 64; ++r) wgmma_fence_operand(d[r]);
      wgmma_fence();
      const uint8_t* xa = x_box + s * kTmaBox + cw * 64 * kW4A8GroupK;
      const uint8_t* wb = w_box + s * kTmaBox;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        wgmma_m64n128k32_ss<kW4A8>(d, wgmma_desc_sw128(xa + 32 * i), wgmma_desc_sw128(wb + 32 * i), i > 0 ? 1 : 0);
      wgmma_commit();
      // Under the multiply: the fold's factors sw * sa of the thread's two tokens (the same fp32
      // products as every form's).
      const float p0 = sw * sa[s * kTmaRows + tok], p1 = sw * sa[s * kTmaRows + tok + 8];
      wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < 64; ++r) wgmma_fence_operand(d[r]);
      __syncwarp();
      if (lane == 0) {  // the stage is read (the wgmma done, the scales loaded)
        mbar_arrive(&empty[s]);
        if constexpr (kPair) mbar_arrive_peer(&empty[s], rank ^ 1u);
      }
      if (++s == kTmaStages) s = 0, phase ^= 1u;
      if (fresh) {
#pragma unroll
        for (int r = 0; r < 64; ++r) acc[r] = __fmaf_rn(d[r], (r & 2) ? p1 : p0, 0.0f);
      } else {
#pragma unroll
        for (int r = 0; r < 64; ++r) acc[r] = __fmaf_rn(d[r], (r & 2) ? p1 : p0, acc[r]);
      }
      fresh = false;
    }
    float* dst = a.out + static_cast<int64_t>(q) * a.rows_total * a.N;
    if (a.split > 1) {
      if (fresh)  // (a quarter of no groups)
        store_tma_tile_tokens(dst, a.rows_total, a.N, t0, t0 + tok, n0, tig, [](int) { return 0.0f; });
      else
        store_tma_tile_tokens(dst, a.rows_total, a.N, t0, t0 + tok, n0, tig, [&](int r) { return acc[r]; });
      fresh = true;
    } else {
      while (quarter < kW4A8Warps) finish_quarter();
      const auto value = [&](int r) { return kRound ? dev_bf16_round(total[r]) : total[r]; };
      if constexpr (kW4A8) {
        store_w4a8_expanded(a, e_item, t0_item, tok, n0, tig, total);
      } else if (a.o_tma) {
        // Into the warpgroup's staging boxes (its last tile's stores done reading them), then out by
        // its first thread's TMA stores, which run on under the next tile's groups. Token row
        // 16 warp + gid (+ 8) of the box, columns 8 (j % 4) + 2 tig: 16-byte chunk 2 (j % 4) +
        // tig / 2 of the row, swizzled with the row's low bits (gid): two wavefronts a store.
        const int wtid = tid % kWgThreads, gid = lane / 4;
        uint8_t* stage = o_stage + cw * 4 * kTmaOutBox;
        if (wtid == 0) bulk_wait_all<true>();
        named_barrier_sync(1 + cw, kWgThreads);
        uint8_t* row = stage + (16 * warp + gid) * 128 + 8 * (tig & 1);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          uint8_t* p = row + (j / 4) * kTmaOutBox + (((2 * (j % 4) + tig / 2) ^ gid) << 4);
          *reinterpret_cast<float2*>(p) = make_float2(value(4 * j), value(4 * j + 1));
          *reinterpret_cast<float2*>(p + 8 * 128) = make_float2(value(4 * j + 2), value(4 * j + 3));
        }
        fence_proxy_async_smem();  // the stores visible to the TMA engine's reads
        named_barrier_sync(1 + cw, kWgThreads);
        if (wtid == 0) {
#pragma unroll
          for (int b = 0; b < 4; ++b) tma_store_2d(&a.o_map, stage + b * kTmaOutBox, n0 + 32 * b, t0 + 64 * cw);
          bulk_commit();
        }
      } else {
        store_tma_tile_tokens(dst, a.rows_total, a.N, t0, t0 + tok, n0, tig, value);
      }
    }
  }
  if (a.o_tma && tid % kWgThreads == 0) bulk_wait_all<false>();  // (the outputs written before the grid ends)
  if constexpr (kPair) cluster_sync_all();
}

// ---- The expanded W4A8 form's passes (launch_w4a8_expanded) ----------------------------------------
//
// grid (ceil(N groups 4 / 256), E), 256 threads: thread (row n, group kg, step i) of expert e (i the
// fastest: four threads write a group's 128 bytes, a warp 1 KB of a row, in 16-byte stores) writes
// the e5m2 bytes of wgmma instruction i's 32 k-slots of the row's group as the tiled kernel's four
// threads tig = 0..3 hold them in their A fragments: block t's word i, inputs 0..3 (that thread's
// a[i][0]) at bytes 32 i + 4 t .. 32 i + 4 t + 3 of the group and inputs 4..7 (a[i][2]) at 32 i + 16
// + 4 t .., the k-slots where the codes (w4a8_order) hold the same inputs. Each block's table is
// w4a8_e5m2_table's, the tables w4a8_prefill_tables makes (it only keeps the rounded path behind a
// warp vote). Experts without rows are left out. (With a thread a block and 4-byte stores, V4-Flash's
// w1 took 1.83 ms on an H100, 2026-12-06.)
__global__ void w4a8_expand_kernel(const DevWeight* w, const int64_t* offsets, int64_t N, int64_t K, uint8_t* out) {
  wait_previous_grid();
  const int e = static_cast<int>(blockIdx.y);
  const int64_t groups = K / kW4A8GroupK, idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * groups * 4 || offsets[e + 1] == offsets[e]) return;
  const int i = static_cast<int>(idx % 4);
  const int64_t kg = (idx / 4) % groups, n = idx / (4 * groups);
  const DevWeight& W = w[e];
  const uint8_t* codes = static_cast<const uint8_t*>(W.data) + fp4_offset(true, K / 2, n, 64 * kg);
  const uint32_t sword = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(W.scale) + n * W.scale_cols + 4 * kg);
  const int b1_ref = w4a8_b1_ref(w4a8_row_emax(W, static_cast<int>(n), static_cast<int>(N)));
  uint32_t lo[4], hi[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + 16 * t + 4 * i);  // (a group's 64 bytes are contiguous)
    uint32_t tlo, thi;
    w4a8_e5m2_table(sword, 0x4440u + t, b1_ref, tlo, thi);
    e2m1x8_to_e5m2(word, tlo, thi, lo[t], hi[t]);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + (static_cast<int64_t>(e) * N + n) * K + kg * kW4A8GroupK + 32 * i);
  dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  dst[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

// grid (tiles), 128 threads: tile b's {expert, first row} of the experts' 128-row tiles
// (w4a8_find_tile<128>), {-1, 0} past the last, into tiles [b][2]; and its rows' activation scales
// (grouped row r's at scales [kg][in_rows[r] or r]), group by group, into tile_scales
// [b groups + kg][128] (0 past the expert's rows).
__global__ void w4a8_tma_tiles_kernel(const int64_t* offsets, int64_t experts, const float* scales, int64_t rows_pad,
                                      const int32_t* in_rows, int groups, int64_t* tiles, float* tile_scales) {
  wait_previous_grid();
  __shared__ int s_e;
  __shared__ int64_t s_t0;
  if (threadIdx.x < 32) {
    int e;
    int64_t t0;
    w4a8_find_tile<kTmaRows>(offsets, experts, blockIdx.x, e, t0);
    if (threadIdx.x == 0) s_e = e, s_t0 = t0, tiles[2 * blockIdx.x] = e, tiles[2 * blockIdx.x + 1] = t0;
  }
  __syncthreads();
  const int e = s_e;
  if (e < 0) return;
  const int64_t r0 = offsets[e], row = s_t0 + threadIdx.x, src = row < offsets[e + 1] - r0 ? r0 + row : -1;
  const int64_t from = src < 0 ? -1 : in_rows != nullptr ? in_rows[src] : src;
  float* dst = tile_scales + static_cast<int64_t>(blockIdx.x) * groups * kTmaRows + threadIdx.x;
  for (int kg = 0; kg < groups; ++kg) dst[kg * kTmaRows] = from < 0 ? 0.0f : scales[kg * rows_pad + from];
}

// grid (rows), 128 threads: grouped row r's codes (row in_rows[r] of codes [., k_pad]) into row r
// of out_codes [rows, k_pad].
__global__ void w4a8_gather_rows_kernel(const uint8_t* codes, int64_t k_pad, const int32_t* in_rows, uint8_t* out_codes) {
  wait_previous_grid();
  const int64_t r = blockIdx.x;
  const uint4* from = reinterpret_cast<const uint4*>(codes + static_cast<int64_t>(in_rows[r]) * k_pad);
  uint4* to = reinterpret_cast<uint4*>(out_codes + r * k_pad);
  for (int64_t c = threadIdx.x; c < k_pad / 16; c += blockDim.x) to[c] = from[c];
}

// ---- The W4A8 decode kernel with a producer warp ----------------------------------------------------
//
// grouped_w4a8_wgmma_kernel's decode form (8- or 16-row items, 64 columns a block, slots of kSpan
// groups, K's quarters over grid z, a w1 / w3 pair in one grid) with the same arithmetic, so the
// same bits, but its copies issued by a fifth warp: the four consumer warps only convert, multiply
// and fold. In the block-wide form every thread spent about 100 instructions a slot on the copies'
// addresses and predicates and the ring's barrier (SASS of the 16-row, span-2 kernel, H200
// 2026-12-04: 213 of its 480 instructions a warp and slot of two groups; its issue slots 66 % busy).
// Here the producer's lane 0 copies a slot's weights, one contiguous piece in the tiled row order
// (fp4_layout.h), with one bulk copy (evict-first in L2), and its lanes each one row of codes (its
// pieces at immediate offsets) and two columns' scale words by cp.async; the slot is handed over
// through an mbarrier that those completions arrive on (noinc: 32 arrivals, and lane 0's expected
// bytes), and refilled after the consumer warps' release (an mbarrier of 4 arrivals). No block-wide
// barrier after the set-up. (ncu, batch 256, with the weights by cp.async: 18 % fewer instructions
// than the block-wide form; the consumers then wait on their slots' barriers, DRAM 62 %. The bulk
// copy took w1 + w3 at batch 256 from 0.773-0.775 to 0.760 ms: H200, 2026-12-04.)
// REQUIRES N % 64 == 0 (the experts' N is the other projection's K, a multiple of 128) and the
// weights tiled, besides grouped_w4a8_wgmma_kernel's.
template <int kN, int kSpan>
struct WsSlot {
  uint8_t x[kSpan][kN * kW4A8GroupK];  // group sub's codes as WgStage::x
  uint8_t w[kSpan][kWgCols * 64];      // column c's 64 bytes of group sub at 64 c
  uint32_t ws[kSpan][kWgCols];         // the columns' packed e8m0 scales of group sub
  float sa[kSpan][kN];                 // the rows' activation scales of group sub
};
constexpr int kWsThreads = kWgThreads + 32;
// The ring's depth: as grouped_w4a8_wgmma_kernel's (4 slots of one group, 3 of two or four; deeper
// rings, with fewer blocks an SM, were slower: w4a8_decode_span).
template <int kSpan>
__host__ __device__ constexpr int ws_stages() { return kSpan == 1 ? 4 : 3; }
template <int kN, int kSpan>
__host__ __device__ constexpr size_t ws_smem_bytes() {  // the ring, the finished quarters' sums, the groups' prep, the barriers
  return sizeof(WsSlot<kN, kSpan>) * ws_stages<kSpan>() + sizeof(float) * (kN / 2) * kWgThreads +
         sizeof(uint32_t) * 16 * kSpan * 4 + 2 * sizeof(uint64_t) * ws_stages<kSpan>();
}
// As many blocks an SM as the shared memory holds, but no more than leave the consumers the registers
// they need unspilled (ws_regs: at eight blocks, 48 registers a thread, the 8-row span-1 kernel
// spilled 140 bytes, at five the 16-row span-2 one 16 bytes; at six blocks the 8-row span-2 kernel,
// 64 registers, 4 bytes spilled, took w1 + w3 at batch 256 in 0.902 ms against 0.788 at five, H200
// 2026-12-04).
template <int kN, int kSpan>
__host__ __device__ constexpr int ws_regs() { return kN == 16 ? 96 : kSpan == 1 ? 64 : 80; }
template <int kN, int kSpan>
__host__ __device__ constexpr int ws_min_blocks() {
  const int fit = blocks_fitting_smem(ws_smem_bytes<kN, kSpan>());
  const int regs = 65536 / (kWsThreads * ws_regs<kN, kSpan>());
  return fit < regs ? fit : regs;
}

template <int kN, int kSpan>
__global__ void __launch_bounds__(kWsThreads, (ws_min_blocks<kN, kSpan>()))
    w4a8_decode_ws_kernel(GroupedW4A8Args g) {
  static_assert(kN == 8 || kN == 16, "8- or 16-row items");
  constexpr int kStages = ws_stages<kSpan>();
  using Slot = WsSlot<kN, kSpan>;
  static_assert(sizeof(Slot) % 16 == 0, "slots stay 16-byte aligned");
  extern __shared__ __align__(128) uint8_t ws_smem[];
  Slot* ring = reinterpret_cast<Slot*>(ws_smem);
  float* total = reinterpret_cast<float*>(ring + kStages);
  uint32_t* prep = reinterpret_cast<uint32_t*>(total + (kN / 2) * kWgThreads);
  uint64_t* full = reinterpret_cast<uint64_t*>(prep + 16 * kSpan * 4);
  uint64_t* empty = full + kStages;
  __shared__ int64_t s_src[kN];
  __shared__ int s_e;
  __shared__ int64_t s_t0;
  const bool early = g.plan_early;
  if (!early) wait_previous_grid();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    const int64_t item = blockIdx.x;
    const bool in = item < *g.n_items;
    s_t0 = in ? g.items[2 * item + 1] : 0;
    // (16 rows: an odd tile's rows are the even tile's before it.)
    s_e = in && (kN == 8 || s_t0 % 16 == 0) ? g.items[2 * item] : -1;
    for (int s = 0; s < kStages; ++s) {
      // The producer's lanes, each when its copies of the slot have landed, and its lane 0's
      // expected bytes of the slot's weights (a bulk copy).
      mbar_init(&full[s], 33);
      mbar_init(&empty[s], 4);  // the consumer warps' lanes 0
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (s_e < 0) {  // past the last item (the grid is a bound)
    if (early) wait_previous_grid();
    return;
  }
  const int64_t e = s_e, t0 = s_t0;
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int N = static_cast<int>(g.N), K = static_cast<int>(g.K), groups = K / kW4A8GroupK;
  const int col_blocks = (N + kWgCols - 1) / kWgCols;
  const bool second = g.w_b != nullptr && static_cast<int>(blockIdx.y) >= col_blocks;
  const int n0 = (static_cast<int>(blockIdx.y) - (second ? col_blocks : 0)) * kWgCols;
  const bool split = gridDim.z > 1;
  const int q_count = split ? kW4A8Warps / static_cast<int>(gridDim.z) : kW4A8Warps;
  const int q_first = split ? static_cast<int>(blockIdx.z) * q_count : 0;
  const int g_lo = w4a8_quarter(q_first, groups), g_hi = w4a8_quarter(q_first + q_count, groups);
  const int slots = (g_hi - g_lo + kSpan - 1) / kSpan;
  if (tid < kN) {
    const int64_t tr = t0 + tid;
    s_src[tid] = tr < R ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : -1;
  }
  __syncthreads();

  if (warp == 4) {  // the producer
    const DevWeight W = second ? g.w_b[e] : g.w[e];
    const int64_t col_bytes = K / 2;
    // The weights in the tiled order (fp4_layout.h; the MoE takes the wgmma kernels only for tiled
    // experts): the block's 64 columns' bytes of group kg are the 4 KB at wsrc + 4096 kg, the slot's
    // groups one contiguous piece, the slot's layout. Lane 0 copies it in one bulk copy.
    const uint8_t* wsrc = static_cast<const uint8_t*>(W.data) + fp4_offset(true, col_bytes, n0, 0);
    static_assert(fp4_group_step(true) == kWgCols * 64, "a group of the block's columns is a slot group's bytes");
    // Code pieces (kN kSpan / 4): this lane's row l % kN, chunks l / kN + (32 / kN) j of group sub.
    constexpr int kXPer = kN / 4;  // pieces a group
    const int xrow = lane % kN, xchunk0 = lane / kN;
    const int64_t xrow_src = s_src[xrow];
    const uint8_t* xsrc = g.codes + (xrow_src >= 0 ? xrow_src : 0) * g.k_pad + 16 * xchunk0 + kW4A8GroupK * g_lo;
    const int xdst = static_cast<int>(offsetof(Slot, x)) + ((xchunk0 * kN / 8) + xrow / 8) * 128 + (xrow % 8) * 16;
    // Scales: column l and l + 32's word of each group; row l's activation scale of group l / kN.
    const uint8_t* ssrc = static_cast<const uint8_t*>(W.scale) + static_cast<int64_t>(n0) * W.scale_cols + 4 * g_lo;
    const int64_t scol[2] = {lane * W.scale_cols, (lane + 32) * W.scale_cols};
    const int arow_i = lane % kN, asub = lane / kN;
    const int64_t arow = s_src[arow_i];
    const float* asrc = g.scales + static_cast<int64_t>(g_lo + asub) * g.rows_pad + (arow >= 0 ? arow : 0);
    const auto issue_weights = [&](int it) {
      Slot* slot = ring + it % kStages;
      const int gs = g_lo + kSpan * it;  // the slot's first group
      if (lane == 0) {
        // The slot's groups below g_hi (the rest of a last slot is never read).
        const uint32_t bytes = static_cast<uint32_t>(min(kSpan, g_hi - gs)) * kWgCols * 64;
        mbar_arrive_expect_tx(&full[it % kStages], bytes);
        bulk_copy_to_smem<true>(slot->w, wsrc + static_cast<int64_t>(gs) * kWgCols * 64, bytes, &full[it % kStages]);
      }
#pragma unroll
      for (int sub = 0; sub < kSpan; ++sub)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          cp_async(slot->ws[sub] + lane + 32 * h, ssrc + scol[h] + 4 * (kSpan * it + sub), gs + sub < g_hi, 4);
    };
    const auto issue_rows = [&](int it) {
      uint8_t* slot = reinterpret_cast<uint8_t*>(ring + it % kStages);
      const int gs = g_lo + kSpan * it;
#pragma unroll
      for (int sub = 0; sub < kSpan; ++sub)
#pragma unroll
        for (int j = 0; j < kXPer; ++j)
          cp_async(slot + xdst + sub * kN * kW4A8GroupK + j * (32 / kN) * (kN / 8) * 128,
                   xsrc + kW4A8GroupK * (kSpan * it + sub) + 16 * (32 / kN) * j, xrow_src >= 0 && gs + sub < g_hi, 16);
      // Row arow_i's scale of groups asub, asub + 32 / kN, ... of the slot.
      for (int sub = asub; sub < kSpan; sub += 32 / kN)
        cp_async(&reinterpret_cast<Slot*>(slot)->sa[sub][arow_i], asrc + (kSpan * it + sub - asub) * g.rows_pad,
                 arow >= 0 && gs + sub < g_hi, 4);
      cp_async_arrive_noinc(&full[it % kStages]);
    };
    // The weights and their scales come from the host, never from a kernel: when the plan is early,
    // the first slots' are copied before the wait for the previous grid; the codes after it.
    int it = 0;
    if (early) {
      const int first = slots < kStages ? slots : kStages;
      for (int i = 0; i < first; ++i) issue_weights(i);
      wait_previous_grid();
      for (; it < first; ++it) issue_rows(it);
    }
    for (; it < slots; ++it) {
      if (it >= kStages) mbar_wait(&empty[it % kStages], ((it / kStages) - 1) & 1);
      issue_weights(it);
      issue_rows(it);
    }
    cp_async_wait<0>();  // (nothing of this block's in flight when the warp leaves)
    return;
  }
  if (early) wait_previous_grid();

  // The consumers: as grouped_w4a8_wgmma_kernel's decode form.
  const int gid = lane / 4, tig = lane % 4;
  constexpr int kAcc = kN / 2;
  float acc[kAcc], d[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f, d[i] = 0.0f;
  const int c0 = 16 * warp + gid;
  uint32_t* const prep_b1 = prep + warp * 16 * kSpan;
  // As grouped_w4a8_wgmma_kernel's: weight rows c0 and c0 + 8's table references, and the prep
  // entries' row's largest scale byte.
  const DevWeight W = second ? g.w_b[e] : g.w[e];
  const int b1_ref[2] = {w4a8_b1_ref(w4a8_row_emax(W, n0 + c0, N)), w4a8_b1_ref(w4a8_row_emax(W, n0 + c0 + 8, N))};
  const uint32_t prep_e_ref = w4a8_row_emax(W, n0 + 16 * warp + lane % 16, N);
  const int64_t outputs = (g.w_b != nullptr ? 2 : 1) * g.rows_total * g.N;
  const int64_t second_offset = second ? g.rows_total * g.N : 0;
  const W4A8BlockOut<kN> out{t0, R, r0, g.N, n0 + c0, N, tig, {b1_ref[0], b1_ref[1]}, true};
  int quarter = q_first, quarter_end = w4a8_quarter(q_first + 1, groups);
  for (int it = 0; it < slots; ++it) {
    const int s = it % kStages;
    mbar_wait(&full[s], (it / kStages) & 1);
    fence_proxy_async_smem();  // the codes (cp.async, the generic proxy) visible to wgmma's reads
    const Slot& slot = ring[s];
#pragma unroll
    for (int j = lane; j < 16 * kSpan; j += 32) prep_b1[j] = w4a8_group_prep(slot.ws[j / 16][16 * warp + j % 16], prep_e_ref);
    __syncwarp();
#pragma unroll
    for (int sub = 0; sub < kSpan; ++sub) {
      const int kg = g_lo + kSpan * it + sub;
      if (kg >= g_hi) break;
      while (kg >= quarter_end) {
        out.finish_quarter(split, g.partial + quarter * outputs + second_offset, total + tid, kWgThreads, quarter, acc);
        quarter_end = w4a8_quarter(++quarter + 1, groups);
      }
      uint32_t a[4][4], tab[2][2];
      w4a8_decode_tables(slot.ws[sub], prep_b1 + 16 * sub, b1_ref, c0, gid, tig, tab);
      w4a8_convert(w4a8_group_words(slot.w[sub], slot.ws[sub], c0, tig).w, tab, a);
      w4a8_group_mma_fold<kN, false>(slot.x[sub], a, 1.0f, slot.sa[sub], tig, d, acc);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with the slot
  }
  for (; quarter < q_first + q_count; ++quarter)
    out.finish_quarter(split, g.partial + quarter * outputs + second_offset, total + tid, kWgThreads, quarter, acc);
  // (each thread reads what it wrote; scatter_slots only where unsplit with one projection)
  if (!split) out.store(g.out + second_offset, total + tid, kWgThreads, g.scatter_slots);
}

// ---- The bf16 linears on wgmma: a decode form and a TMA form with one arithmetic --------------------
//
// out[t, n] = sum_k W[n, k] x[t, (n / R) K + k]: bf16 weights [N, K] and bf16 inputs (rows x_ld
// apart), fp32 sums; R rows a group (V4's grouped wo_a: group g's rows read inputs g K ..; one group
// when R = N). Every output goes through the same arithmetic in both forms, so a row's bits never
// depend on the other rows (batch and chunking invariance):
//
//   K in steps of 64 inputs; the steps cut in bf16_parts(N) contiguous parts (bf16_part; some empty
//   when K has fewer steps); within a part the tensor core accumulates its wgmma k16 in input
//   order, the part's first from zero (fp32, the tensor core's own sum order and rounding); the
//   parts' sums added in order, (((p0 + p1) + p2) + ...). Both forms put input 16 i + j of a step
//   in k-slot j of its i-th wgmma.
//
// Unlike the FP8 kernels there is no scale to fold group by group, so the accumulator stays in the
// tensor core for a whole part (no per-group fma pass). The part count is a function of N alone
// (so a weight's bits never depend on the rows): 16 below 8192 rows, where at one row the decode
// form needs the blocks (with 4, the gate's 256 rows made 16 blocks on 132 SMs: 7.7 us for 2 MB
// in ncu on 2026-12-02), 4 from 8192 (the head's 129,280 rows in 16 parts made 32,320 blocks of 4
// steps: its step segment 0.316 -> 0.404 ms).
__device__ inline uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
constexpr int kBf16Step = 64;                   // inputs a step: one 128-byte row of bf16
constexpr int kBf16MaxParts = 16;
__host__ __device__ inline int bf16_parts(int64_t N) { return N >= 8192 ? 4 : kBf16MaxParts; }
// Part p of `steps` in `parts` is [bf16_part(p, steps, parts), bf16_part(p + 1, steps, parts)).
__device__ __host__ inline int bf16_part(int p, int steps, int parts) { return p * steps / parts; }
// The decode form's cp.async ring (a block's part is 4 steps at K = 4096; 4 stages of 10 KB let 5
// blocks share an SM, where 8 stages held it to 2 and wo_a's blocks to two waves in ncu).
constexpr int kBf16DecStages = 4;
// Its weight rows' bytes in a stage: bf16 128 + 16, e4m3 64 + 16 (a quarter-warp's reads on 32 banks).
template <bool kFp8W>
__host__ __device__ constexpr int bf16_dec_pitch() { return kFp8W ? 80 : 144; }
template <bool kF32X, bool kFp8W>
struct Bf16DecStage {
  uint8_t x[8 * 128];                           // chunk c (16 bytes) of row n at 128 c + 16 n: wgmma's no-swizzle core matrices
  uint8_t w[kWgCols * bf16_dec_pitch<kFp8W>()];  // weight row r's step at pitch r (bf16, or e4m3 codes)
  float xf[kF32X ? 8 * kBf16Step : 4];          // (fp32 inputs) row n's 64 at 64 n, rounded into x before use
};
template <bool kF32X, bool kFp8W>
constexpr size_t bf16_dec_smem_bytes() {
  static_assert(sizeof(Bf16DecStage<kF32X, kFp8W>) % 16 == 0, "stages stay 16-byte aligned");
  return kBf16DecStages * sizeof(Bf16DecStage<kF32X, kFp8W>);
}
// Two e4m3 codes (low byte first) times their block's scale as a bf16 pair: bf16(e4m3 x scale) with
// the product in fp32, weight_to_bf16_kernel's bits (weight_at) for every finite code.
__device__ inline uint32_t e4m3x2_scaled_bf16x2(uint32_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float lo = __half2float(__ushort_as_half(h.x)) * scale, hi = __half2float(__ushort_as_half(h.y)) * scale;
  return static_cast<uint32_t>(bf16_bits(lo)) | static_cast<uint32_t>(bf16_bits(hi)) << 16;
}

__device__ inline void wgmma_m64n8k16_bf16_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

// Decode form: a block is 64 weight rows (wgmma's M, A from registers) x 8 input rows (its N, B from
// shared memory), over one part of the steps (grid z), written to partial[part]; grid
// (ceil(rows / 8), ceil(N / 64), bf16_parts(N)). REQUIRES R % 64 == 0 or R == N (a block's rows in one group).
// Thread (warp w, gid, tig) holds rows 16 w + gid and + 8; for wgmma i of a step, words 8 i + tig
// (inputs 16 i + 2 tig, + 1) and 8 i + 4 + tig (16 i + 8 + 2 tig, + 1) of each: the m64nNk16 A
// fragment with inputs in natural order.
// kF32X: the inputs are fp32 (a.x_f32), copied as they are and rounded to bf16 in the kernel, each
// thread its own copy's 4 values once they land (__float2bfloat16_rn: f32_to_bf16_kernel's bits).
// kFp8W: the weight is its e4m3 codes and block scales (a.w8), each pair of codes made bf16 in
// registers as the fragment is read (e4m3x2_scaled_bf16x2): half the bytes of the bf16 copy.
template <bool kF32X, bool kFp8W>
__global__ void __launch_bounds__(kWgThreads) bf16_linear_decode_kernel(Bf16LinearArgs a) {
  extern __shared__ __align__(128) uint8_t bf16_dec_smem[];
  using Stage = Bf16DecStage<kF32X, kFp8W>;
  Stage* ring = reinterpret_cast<Stage*>(bf16_dec_smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * 8;
  const int n0 = static_cast<int>(blockIdx.y) * kWgCols, steps = a.K / kBf16Step;
  const int s_lo = bf16_part(blockIdx.z, steps, gridDim.z), s_hi = bf16_part(blockIdx.z + 1, steps, gridDim.z);
  const int64_t x_off = static_cast<int64_t>(n0 / a.R) * a.K;
  // Copies a step: weight pieces p = tid + 128 i (i < 4): row p / 8, chunk p % 8 (a quarter-warp one
  // row's 128 bytes; e4m3: i < 2, row p / 4, chunk p % 4 of its 64); input pieces tid < 64: row
  // tid % 8, chunk tid / 8.
  constexpr int kWRow = kFp8W ? kBf16Step : 2 * kBf16Step;  // a weight row's bytes a step
  constexpr int kWPieces = kWRow / 32, kChunks = kWRow / 16;
  const uint8_t* wbase = kFp8W ? static_cast<const uint8_t*>(a.w8.data) : reinterpret_cast<const uint8_t*>(a.w);
  const uint8_t* wsrc[kWPieces];
  bool wok[kWPieces];
  int wdst[kWPieces];
#pragma unroll
  for (int i = 0; i < kWPieces; ++i) {
    const int p = tid + kWgThreads * i, row = p / kChunks, chunk = p % kChunks;
    wok[i] = n0 + row < a.N;
    wsrc[i] = wbase + (wok[i] ? static_cast<int64_t>(n0 + row) * a.K * (kWRow / kBf16Step) : 0) + 16 * chunk + kWRow * s_lo;
    wdst[i] = bf16_dec_pitch<kFp8W>() * row + 16 * chunk;
  }
  // (fp32 inputs: pieces tid: row tid / 16, 16 bytes = inputs 4 (tid % 16) ..; once landed, their bf16
  // bits go to half x_half of chunk x_chunk = (tid % 16) / 2 of the row.)
  const int xrow = kF32X ? tid / 16 : tid % 8, xchunk = kF32X ? tid % 16 : tid / 8;
  const bool xok = (kF32X || tid < 64) && t0 + xrow < a.rows;
  constexpr int kXElem = kF32X ? 4 : 2;  // an input's bytes as copied
  const uint8_t* xbase = kF32X ? reinterpret_cast<const uint8_t*>(a.x_f32) : reinterpret_cast<const uint8_t*>(a.x);
  const uint8_t* xsrc = xbase + (xok ? ((t0 + xrow) * a.x_ld + x_off) * kXElem : 0) + 16 * xchunk + kXElem * kBf16Step * s_lo;
  const int xdst = kF32X ? 4 * kBf16Step * xrow + 16 * xchunk : 128 * xchunk + 16 * xrow;
  const int xhalf = 128 * (xchunk / 2) + 16 * xrow + 8 * (xchunk % 2);  // (fp32 inputs) the bf16 bits' place in x
  // The weights' first kBf16DecStages - 1 steps are copied before the wait for the previous grid
  // (programmatic dependent launch, device_common.cuh): they are a model's weights, or bf16 copies
  // weight_to_bf16_kernel wrote before the input's conversion (a copy made in this call is followed
  // by the input's conversion pass, f32_to_bf16_kernel, never by this kernel directly:
  // Bf16GroupedLinear::gemm; and a kernel lets its successor start only after its own wait, so
  // whatever the grid two launches back wrote is visible here). They join the first commit group;
  // issue() skips them.
  int prefetched = 0;
  for (; prefetched < kBf16DecStages - 1 && s_lo + prefetched < s_hi; ++prefetched) {
#pragma unroll
    for (int i = 0; i < kWPieces; ++i) cp_async(ring[prefetched].w + wdst[i], wsrc[i] + kWRow * prefetched, wok[i], 16);
  }
  wait_previous_grid();
  int next = s_lo, next_stage = 0;
  auto issue = [&] {
    if (next < s_hi) {
      Stage& st = ring[next_stage];
      const bool weights = next - s_lo >= prefetched;
#pragma unroll
      for (int i = 0; i < kWPieces; ++i) {
        if (weights) cp_async(st.w + wdst[i], wsrc[i], wok[i], 16);
        wsrc[i] += kWRow;
      }
      if constexpr (kF32X) cp_async(reinterpret_cast<uint8_t*>(st.xf) + xdst, xsrc, xok, 16);
      else if (tid < 64) cp_async(st.x + xdst, xsrc, xok, 16);
      xsrc += kXElem * kBf16Step;
      next_stage = next_stage + 1 == kBf16DecStages ? 0 : next_stage + 1;
      ++next;
    }
    cp_async_commit();  // (an empty group past the end keeps the wait count uniform)
  };
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int c0 = 16 * warp + gid;
  for (int i = 0; i < kBf16DecStages - 1; ++i) issue();
  int stage = 0;
  for (int s = s_lo; s < s_hi; ++s) {
    // (e4m3 weights: the step's block scale; the block's 64 rows and the step's 64 inputs lie in one
    // scale block, launch_bf16_decode's requirement.)
    const float w_scale = kFp8W ? dev_load(DevView{a.w8.scale, a.w8.scale_dtype},
                                           (n0 / a.w8.block_out) * a.w8.scale_cols + (s * kBf16Step) / a.w8.block_in)
                                : 0.0f;
    cp_async_wait<kBf16DecStages - 2>();  // this thread's copies of step s have landed
    if constexpr (kF32X) {                // its 4 inputs into bf16 (the stage's last reader, step s - 4, is done)
      const float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const uint8_t*>(ring[stage].xf) + xdst);
      uint2 b;
      b.x = static_cast<uint32_t>(bf16_bits(v.x)) | static_cast<uint32_t>(bf16_bits(v.y)) << 16;
      b.y = static_cast<uint32_t>(bf16_bits(v.z)) | static_cast<uint32_t>(bf16_bits(v.w)) << 16;
      *reinterpret_cast<uint2*>(ring[stage].x + xhalf) = b;
    }
    fence_proxy_async_smem();             // and are visible to wgmma's reads
    __syncthreads();                      // everyone's; and everyone is done with the stage refilled next
    issue();                              // step s + kBf16DecStages - 1
    const Stage& st = ring[stage];
    stage = stage + 1 == kBf16DecStages ? 0 : stage + 1;
    // Rows c0 and c0 + 8 of the step; inputs 16 i + 2 tig, + 1 and 16 i + 8 + 2 tig, + 1 of each.
    const uint8_t* row_a = st.w + bf16_dec_pitch<kFp8W>() * c0;
    const uint8_t* row_b = st.w + bf16_dec_pitch<kFp8W>() * (c0 + 8);
    uint32_t w[4][4];
    if constexpr (kFp8W) {  // a code pair (2 bytes) an input pair
      const uint16_t* ra = reinterpret_cast<const uint16_t*>(row_a) + tig;
      const uint16_t* rb = reinterpret_cast<const uint16_t*>(row_b) + tig;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[i][0] = e4m3x2_scaled_bf16x2(ra[8 * i], w_scale), w[i][2] = e4m3x2_scaled_bf16x2(ra[8 * i + 4], w_scale);
        w[i][1] = e4m3x2_scaled_bf16x2(rb[8 * i], w_scale), w[i][3] = e4m3x2_scaled_bf16x2(rb[8 * i + 4], w_scale);
      }
    } else {  // a bf16 pair (a word) an input pair
      const uint32_t* ra = reinterpret_cast<const uint32_t*>(row_a) + tig;
      const uint32_t* rb = reinterpret_cast<const uint32_t*>(row_b) + tig;
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i][0] = ra[8 * i], w[i][2] = ra[8 * i + 4], w[i][1] = rb[8 * i], w[i][3] = rb[8 * i + 4];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) wgmma_fence_operand(d[r]);
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < 4; ++i)
      wgmma_m64n8k16_bf16_rs(d, w[i], wgmma_desc(st.x + 256 * i, 128, 128), s > s_lo || i > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 4; ++r) wgmma_fence_operand(d[r]);
  }
  cp_async_wait<0>();
  float* dst = a.partial + static_cast<int64_t>(blockIdx.z) * a.rows * a.N;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int64_t t = t0 + 2 * tig + (c & 1);
    const int n = n0 + c0 + (c < 2 ? 0 : 8);
    if (t < a.rows && n < a.N) dst[t * a.N + n] = d[c];  // an empty part writes its zeros
  }
}

// TMA form: tiles of 128 weight rows (two consumer warpgroups of 64, wgmma's M) x 128 input rows
// (wgmma's N), both operands in shared memory as TMA brings them (boxes of 128 rows x 64 inputs,
// 128-byte swizzled), a ring of kBf16TmaStages steps fed by a producer warpgroup's first thread,
// persistent blocks, and K's parts as separate work items (split = the parts, into partial) where
// splitting saves a wave of the SMs (tma_split_pays). REQUIRES R % 128 == 0 or R == N (a tile's rows in one group).
constexpr int kBf16TmaStages = 6, kBf16TmaBox = 128 * 2 * kBf16Step;  // 16 KB an operand a stage
constexpr size_t kBf16TmaSmemBytes = 1024 + kBf16TmaStages * 2 * kBf16TmaBox + 2 * kBf16TmaStages * sizeof(uint64_t);

struct Bf16TmaArgs {
  CUtensorMap w_map;  // the weights, bf16 [N][K]: boxes of 128 rows x 64 inputs
  CUtensorMap x_map;  // the inputs, bf16 [rows][x_ld]: the same boxes
  float* out;         // [rows, N]; with split, the parts' sums [parts][rows][N]
  int64_t rows;
  int N, K, R, steps;
  int parts;  // bf16_parts(N)
  int split;  // 1, or parts
  int raster_group;  // as Fp8TmaArgs'
};

__device__ inline void wgmma_m64n128k16_bf16_ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SPARROW_WGMMA_P64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : SPARROW_WGMMA_D64
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// kRound (unsplit only): as fp8_linear_tma_kernel's.
template <bool kRound>
__global__ void __launch_bounds__(kTmaThreads, 1) bf16_linear_tma_kernel(const __grid_constant__ Bf16TmaArgs a) {
  wait_previous_grid();
  extern __shared__ uint8_t bf16_tma_smem_raw[];
  uint8_t* smem = smem_align_1024(bf16_tma_smem_raw);
  uint8_t* w_box = smem;                                // [stage][128 rows][128 bytes]
  uint8_t* x_box = smem + kBf16TmaStages * kBf16TmaBox;  // [stage][128 rows][128 bytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + 2 * kBf16TmaStages * kBf16TmaBox);
  uint64_t* empty = full + kBf16TmaStages;
  const int tid = threadIdx.x, wg = tid / kWgThreads;
  const int steps = a.steps, token_tiles = static_cast<int>((a.rows + 127) / 128);
  const int items = token_tiles * ((a.N + 127) / 128) * a.split;
  tma_ring_init(full, empty, kBf16TmaStages);
  // Item i: part i % split of tile i / split (tma_tile_at), its steps [s_lo, s_hi); the ring's
  // position runs on across items.
  const int weight_tiles = (a.N + 127) / 128;
  const auto item_at = [&](int item, int& t0, int& n0, int& q, int& s_lo, int& s_hi) {
    const int tile = item / a.split;
    q = item % a.split;
    int m, n;
    tma_tile_at(tile, token_tiles, weight_tiles, a.raster_group, m, n);
    t0 = m * 128, n0 = n * 128;
    s_lo = a.split > 1 ? bf16_part(q, steps, a.parts) : 0;
    s_hi = a.split > 1 ? bf16_part(q + 1, steps, a.parts) : steps;
  };
  if (wg == 2) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 2 * kWgThreads) {
      int it = 0;
      for (int item = blockIdx.x; item < items; item += gridDim.x) {
        int t0, n0, q, s_lo, s_hi;
        item_at(item, t0, n0, q, s_lo, s_hi);
        const int x_off = (n0 / a.R) * a.K;
        for (int s = s_lo; s < s_hi; ++s, ++it) {
          const int st = it % kBf16TmaStages, round = it / kBf16TmaStages;
          if (round > 0) mbar_wait(&empty[st], (round - 1) & 1);
          mbar_arrive_expect_tx(&full[st], 2 * kBf16TmaBox);
          tma_load_2d(w_box + st * kBf16TmaBox, &a.w_map, s * kBf16Step, n0, &full[st]);
          tma_load_2d(x_box + st * kBf16TmaBox, &a.x_map, x_off + s * kBf16Step, t0, &full[st]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = wg, lane = tid % 32, warp = (tid / 32) % 4, tig = lane % 4;
  // Slot 4 j + c: weight row n0 + 64 cw + 16 warp + lane / 4 (+ 8 for c >= 2), input row t0 + 8 j + 2 tig + (c & 1).
  float d[64], total[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = total[i] = 0.0f;
  int it = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    int t0, n0, q, s_lo, s_hi;
    item_at(item, t0, n0, q, s_lo, s_hi);
    // Unsplit: part by part into total (an empty part adds zeros, as the split form's zeros do);
    // split: this part's sum written as it is.
    int part = 0, part_end = a.split > 1 ? s_hi : bf16_part(1, steps, a.parts);
    bool fresh = true;  // the next wgmma starts the part's sum from zero
    const auto finish_part = [&] {
#pragma unroll
      for (int r = 0; r < 64; ++r) {
        const float v = fresh ? 0.0f : d[r];
        total[r] = part == 0 ? v : total[r] + v;
      }
      fresh = true;
      ++part;
    };
    for (int s = s_lo; s < s_hi; ++s, ++it) {
      while (s >= part_end) {
        finish_part();
        part_end = bf16_part(part + 1, steps, a.parts);
      }
      const int st = it % kBf16TmaStages;
      mbar_wait(&full[st], (it / kBf16TmaStages) & 1);
#pragma unroll
      for (int r = 0; r < 64; ++r) wgmma_fence_operand(d[r]);
      wgmma_fence();
      const uint8_t* wa = w_box + st * kBf16TmaBox + cw * 64 * 128;
      const uint8_t* xb = x_box + st * kBf16TmaBox;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        wgmma_m64n128k16_bf16_ss(d, wgmma_desc_sw128(wa + 32 * i), wgmma_desc_sw128(xb + 32 * i), fresh && i == 0 ? 0 : 1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < 64; ++r) wgmma_fence_operand(d[r]);
      fresh = false;
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[st]);
    }
    if (a.split == 1)
      while (part < a.parts) finish_part();
    float* dst = a.out + static_cast<int64_t>(q) * a.rows * a.N;
    const int row0 = n0 + 64 * cw + 16 * warp + lane / 4;
    store_tma_tile(dst, a.rows, a.N, t0, n0, row0, tig, [&](int r) {
      return a.split > 1 ? (fresh ? 0.0f : d[r]) : kRound ? dev_bf16_round(total[r]) : total[r];
    });
  }
}

// decode_quarter_blocks' target grid: 16 blocks an SM of the H200's 132. Measured there (8-layer
// synthetic V4-Flash, 2026-12-02, GPU time a layer against always 4): batch 1 -1.2 / -1.9 %,
// batch 8 -3.4 / -3.2 % (SWA / CSA layer); 528 about the same, 1056 less, never splitting (1) +5 to
// +7 % at batch 1.
constexpr int64_t kDecodeSplitBlocks = 2112;
// The blocks the decode kernel spreads K's quarters over (grid z: 1, 2 or 4; the same bits any
// way): 1 without g.partial, set_decode_quarter_blocks's count where set, else the fewest that give
// the grid at least kDecodeSplitBlocks blocks (items x column blocks of all four quarters each).
// Blocks of a few groups each spend most of their life starting; a grid of few blocks leaves SMs
// idle. SPARROW_CUDA_DECODE_SPLIT_BLOCKS overrides the target (tuning).
std::atomic<int> g_decode_quarter_blocks{0};  // set_decode_quarter_blocks
unsigned decode_quarter_blocks(const GroupedW4A8Args& g, int64_t items, int64_t col_blocks) {
  if (g.partial == nullptr) return 1;
  if (const int n = g_decode_quarter_blocks.load(); n == 1 || n == 2 || n == 4) return static_cast<unsigned>(n);
  static const int64_t target =
      cuda_env_int("SPARROW_CUDA_DECODE_SPLIT_BLOCKS", kDecodeSplitBlocks, [](int64_t n) { return n >= 1; },
                   "the decode kernel's target grid must be a positive count of blocks");
  const int64_t blocks = items * col_blocks;
  return blocks >= target ? 1u : 2 * blocks >= target ? 2u : 4u;
}

// kRingStages > 0: the W4A8 prefill form's mbarrier ring of that many slots (kRing, kW4A8RingStages).
// quant_in_bytes: (the FP8 decode form quantising its rows, GroupedW4A8Args::x_f32) the shared
// memory its groups past the ring's slots take (fp8_quant_in_extra).
template <int kN, int kWG, bool kFp8W = false, int kSpan = 1, int kRingStages = 0, int kRingMode = 1>
void launch_w4a8_wgmma(const GroupedW4A8Args& g, int64_t blocks, unsigned quarters = 1, size_t quant_in_bytes = 0) {
  constexpr int kRing = kRingStages > 0 ? kRingMode : 0;
  constexpr int kStages = kRing ? kRingStages : wg_stages<kN, kFp8W, kSpan>();
  constexpr size_t kSmem = kRing ? wg_ring_smem_bytes<kWG, kStages>() : wg_smem_bytes<kN, kWG, kFp8W, kSpan>();
  constexpr bool kQuantIn = kFp8W && wg_decode(kN);
  static_assert(!kRing || blocks_fitting_smem(kSmem) >= wg_min_blocks<kN, kWG, kFp8W, kSpan>(), "the ring fits the blocks an SM");
  static_assert(!kQuantIn || (kN == 8 && kWG == 1 && wg_quant_in_offset() >= kSmem), "the quantised groups after the rest");
  const size_t smem = kQuantIn && quant_in_bytes > 0 ? wg_quant_in_offset() + quant_in_bytes : kSmem;
  static const bool smem_set = [] {
    return cudaFuncSetAttribute(grouped_w4a8_wgmma_kernel<kN, kWG, kStages, kFp8W, kSpan, kRing>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kQuantIn ? wg_quant_in_offset() + kFp8QuantInMaxBytes : kSmem)) == cudaSuccess;
  }();
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  const unsigned pair = !kFp8W && wg_decode(kN) && g.w_b != nullptr ? 2 : 1;
  const unsigned cols = pair * static_cast<unsigned>(blocks_for(g.N, kWgCols * kWG));
  // (Only the W4A8 prefill form reads cols_fast: the kernel's own condition.)
  const bool cols_fast = g.cols_fast && !kFp8W && !wg_decode(kN);
  launch(grouped_w4a8_wgmma_kernel<kN, kWG, kStages, kFp8W, kSpan, kRing>,
         cols_fast ? dim3(cols, static_cast<unsigned>(blocks), quarters) : dim3(static_cast<unsigned>(blocks), cols, quarters),
         kWgThreads * kWG, smem, g);
}

// The W4A8 decode kernel's span (groups a ring slot): set_w4a8_decode_span's where set (1, 2 or 4),
// else SPARROW_CUDA_W4A8_SPAN's, else 2 for a grid whose blocks each take all of K (quarters = 1)
// and 1 for a split grid. The same bits at any span. Measured on the H200 (layer 0 of a 1-layer
// synthetic V4-Flash, 2026-12-03, two rounds): w1 + w3 / w2 at batch 256 1.029 / 0.549-0.550 ms at
// span 1, 0.979 / 0.520-0.521 at 2, 1.244-1.246 / 0.694-0.695 at 4 (3 blocks an SM); at batch 8
// 0.175-0.176 / 0.091-0.092, 0.161-0.162 / 0.085, 0.196 / 0.109-0.110; at batch 1 (4 quarter
// blocks of 8 groups) 0.037 / 0.024 at span 1, 0.039 / 0.024-0.025 at 2. The producer-warp kernel
// (w4a8_decode_producer) takes 2 at every grid: at batch 1 w1 + w3 / w2 0.036-0.038 / 0.023-0.025 at
// span 1, 0.034-0.035 / 0.022 at 2, and the ring's deeper forms (6 slots of 1 group, 4 of 2, each
// with fewer blocks an SM) 2-20 % slower at every batch (H200, 2026-12-04).
std::atomic<int> g_w4a8_decode_span{0};  // set_w4a8_decode_span
std::atomic<int> g_w4a8_decode_rows{0};  // set_w4a8_decode_rows
bool w4a8_decode_producer(const GroupedW4A8Args& g);
int w4a8_decode_span(const GroupedW4A8Args& g, unsigned quarters) {
  if (const int n = g_w4a8_decode_span.load(); n == 1 || n == 2 || n == 4) return n;
  static const int from_env = static_cast<int>(
      cuda_env_int("SPARROW_CUDA_W4A8_SPAN", 0, [](int64_t n) { return n == 1 || n == 2 || n == 4; },
                   "the W4A8 decode kernel's groups a copy round must be 1, 2 or 4"));
  return from_env != 0 ? from_env : quarters == 1 || w4a8_decode_producer(g) ? 2 : 1;
}

// The W4A8 decode kernel's rows a block: set_w4a8_decode_rows's where set (8 or 16), else
// SPARROW_CUDA_W4A8_ROWS's, else 8 for the producer-warp kernel (w4a8_decode_producer), and for the
// block-wide one 16 where the experts average kDecode16Rows rows or more (a block of 16 converts an
// expert's weights once for up to 16 rows: at batch 256 of V4-Flash, 2048 rows on 256 experts, about
// 361 items of 8 rows a projection against 257 of 16) and 8 below. The same bits either way. On
// layer 0 of the synthetic V4-Flash (H200, 2026-12-04, two rounds) the layer at batch 64 / 128 / 256
// took 1.344-1.349 / 1.367-1.382 / 1.740-1.743 ms with the producer warp at 8 rows, 1.547-1.560 /
// 1.596-1.620 / 1.872-1.882 at 16; the block-wide kernel 1.388-1.390 / 1.436-1.438 / 1.837-1.840
// at 8, 1.473-1.477 / 1.531-1.534 / 1.779-1.790 at 16.
constexpr int64_t kDecode16Rows = 6;
int w4a8_decode_rows(const GroupedW4A8Args& g) {
  if (const int n = g_w4a8_decode_rows.load(); n == 8 || n == 16) return n;
  static const int from_env = static_cast<int>(cuda_env_int(
      "SPARROW_CUDA_W4A8_ROWS", 0, [](int64_t n) { return n == 8 || n == 16; }, "the W4A8 decode kernel's rows a block must be 8 or 16"));
  if (from_env != 0) return from_env;
  if (w4a8_decode_producer(g)) return 8;
  return g.experts > 0 && g.rows_total >= kDecode16Rows * g.experts ? 16 : 8;
}

template <int kN, int kSpan>
void launch_w4a8_decode_ws(const GroupedW4A8Args& g, unsigned quarters) {
  constexpr size_t kSmem = ws_smem_bytes<kN, kSpan>();
  static const bool smem_set = [] {
    return cudaFuncSetAttribute(w4a8_decode_ws_kernel<kN, kSpan>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kSmem)) == cudaSuccess;
  }();
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  const unsigned pair = g.w_b != nullptr ? 2 : 1;
  launch(w4a8_decode_ws_kernel<kN, kSpan>,
         dim3(static_cast<unsigned>(g.max_items), pair * static_cast<unsigned>(blocks_for(g.N, kWgCols)), quarters), kWsThreads,
         kSmem, g);
}
// Whether the W4A8 decode kernel's copies come from a producer warp (w4a8_decode_ws_kernel): where
// its shape fits it (N % 64 == 0, every expert), set_w4a8_decode_producer's choice where set (1 yes,
// -1 no), else yes unless SPARROW_CUDA_DISABLE=w4a8_producer. The same bits either way. It also
// sets the decode kernel's rows and span (w4a8_decode_rows, w4a8_decode_span).
std::atomic<int> g_w4a8_decode_producer{0};  // set_w4a8_decode_producer
bool w4a8_decode_producer(const GroupedW4A8Args& g) {
  if (g.N % kWgCols != 0) return false;
  if (const int n = g_w4a8_decode_producer.load(); n != 0) return n > 0;
  static const bool on = cuda_feature_on("w4a8_producer");
  return on;
}

// The W4A8 decode kernel of kN rows a block at ring slots of `span` groups, its quarters over z blocks.
template <int kN>
void launch_w4a8_decode(const GroupedW4A8Args& g, int span, unsigned z) {
  if (w4a8_decode_producer(g)) {
    if (span == 4) launch_w4a8_decode_ws<kN, 4>(g, z);
    else if (span == 2) launch_w4a8_decode_ws<kN, 2>(g, z);
    else launch_w4a8_decode_ws<kN, 1>(g, z);
    return;
  }
  if (span == 4) launch_w4a8_wgmma<kN, 1, false, 4>(g, g.max_items, z);
  else if (span == 2) launch_w4a8_wgmma<kN, 1, false, 2>(g, g.max_items, z);
  else launch_w4a8_wgmma<kN, 1>(g, g.max_items, z);
}

// Word o of the tiled order from its released word (fp4_tiled_source).
__global__ void fp4_to_device_tiled_kernel(const uint32_t* in, uint32_t* out, int64_t rows, int64_t row_bytes) {
  wait_previous_grid();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= rows * row_bytes / 4) return;
  int64_t n = 0, b = 0;
  fp4_tiled_source(row_bytes, 4 * o, n, b);
  out[o] = fp4_word_to_device(in[(n * row_bytes + b) / 4]);
}

__global__ void fp4_to_device_layout_kernel(uint32_t* words, int64_t n) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) words[i] = fp4_word_to_device(words[i]);
}

__global__ void weight_to_bf16_kernel(DevWeight w, uint16_t* out) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < w.out * w.in) out[i] = bf16_bits(weight_at(w, i / w.in, i % w.in));
}

// kVec: four values a thread, a 16-byte load and an 8-byte store (n a multiple of 4, `in` 16-byte and
// `out` 8-byte aligned): batch 256's attention output (33.5 MB of f32) took 41 us one value a
// thread (ncu, H200 2026-12-03).
template <bool kVec>
__global__ void f32_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  wait_previous_grid();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * (kVec ? 4 : 1);
  if (i >= n) return;
  if constexpr (kVec) {
    const float4 v = *reinterpret_cast<const float4*>(in + i);
    const uint2 b{bf16_bits(v.x) | static_cast<uint32_t>(bf16_bits(v.y)) << 16,
                  bf16_bits(v.z) | static_cast<uint32_t>(bf16_bits(v.w)) << 16};
    *reinterpret_cast<uint2*>(out + i) = b;
  } else {
    out[i] = bf16_bits(in[i]);
  }
}

// launch_div_recip_check's kernel: a warp per divisor at a time (a grid-stride loop over them), its
// lanes over the dividends.
__global__ void div_recip_check_kernel(uint32_t d_first, uint32_t d_count, uint32_t d_step, uint32_t x_step,
                                       unsigned long long* counts, unsigned long long* example) {
  wait_previous_grid();
  constexpr uint32_t kOne = 0x3f800000u, kSignificands = 1u << 23;
  const uint32_t lane = threadIdx.x % 32, warps = gridDim.x * blockDim.x / 32;
  unsigned long long seen = 0, bad = 0;
  for (uint32_t j = (blockIdx.x * blockDim.x + threadIdx.x) / 32; j < d_count; j += warps) {
    const uint32_t dm = (d_first + j * d_step) % kSignificands;
    const float d = __uint_as_float(kOne | dm), y = __frcp_rn(d);
    for (uint32_t xm = lane * x_step; xm < kSignificands; xm += 32 * x_step) {
      const float x = __uint_as_float(kOne | xm);
      ++seen;
      if (__float_as_uint(dev_div_recip(x, d, y)) != __float_as_uint(__fdiv_rn(x, d))) {
        ++bad;
        atomicMin(example, static_cast<unsigned long long>(dm) << 23 | xm);
      }
    }
  }
  atomicAdd(&counts[0], seen);
  if (bad > 0) atomicAdd(&counts[1], bad);
}

}  // namespace

void launch_div_recip_check(uint32_t d_first, uint32_t d_count, uint32_t d_step, uint32_t x_step, unsigned long long* counts,
                            unsigned long long* example) {
  if (d_count > 0 && x_step > 0) launch(div_recip_check_kernel, 132 * 8, 256, 0, d_first, d_count, d_step, x_step, counts, example);
}

bool linear_vectorizable(const LinearArgs& a) {
  const DevWeight& w = a.w;
  if (!aligned16(w.data) || !aligned16(a.in) || a.in_stride % 4 != 0 || w.in % 4 != 0) return false;
  if (w.format == WeightFormat::kFp8Block) return w.in % 16 == 0 && w.block_in > 0 && w.block_in % 16 == 0;
  if (w.format == WeightFormat::kFp4Packed) return w.in % 32 == 0 && w.block_in > 0 && w.block_in % 32 == 0;
  return false;
}

bool launch_linear(const LinearArgs& a) {
  if (a.T == 0 || a.w.out == 0) return false;
  const dim3 grid(blocks_for(a.w.out, kWarpsPerBlock), blocks_for(a.T, kTokenTile));
  int path = kernel_path(a.vectorized && linear_vectorizable(a), a.w.format);
  const bool vectorized = path != 0;
  if (path == 0) path = element_path(a.w);
  if (path == 2) launch(linear_kernel<2>, grid, 32 * kWarpsPerBlock, 0, a);
  else if (path == 1) launch(linear_kernel<1>, grid, 32 * kWarpsPerBlock, 0, a);
  else if (path == 3) launch(linear_kernel<3>, grid, 32 * kWarpsPerBlock, 0, a);
  else if (path == 4) launch(linear_kernel<4>, grid, 32 * kWarpsPerBlock, 0, a);
  else launch(linear_kernel<0>, grid, 32 * kWarpsPerBlock, 0, a);
  return vectorized;
}

void launch_weight_to_bf16(const DevWeight& w, uint16_t* out) {
  if (w.out * w.in > 0) launch(weight_to_bf16_kernel, blocks_for(w.out * w.in, 256), 256, 0, w, out);
}

void launch_fp4_to_device_layout(uint32_t* words, int64_t n) {
  if (n > 0) launch(fp4_to_device_layout_kernel, blocks_for(n, 256), 256, 0, words, n);
}
void launch_fp4_to_device_tiled(const uint32_t* in, uint32_t* out, int64_t rows, int64_t row_bytes) {
  const int64_t words = rows * row_bytes / 4;
  if (words > 0) launch(fp4_to_device_tiled_kernel, blocks_for(words, 256), 256, 0, in, out, rows, row_bytes);
}

void launch_w4a8_table_pair(const uint32_t* words, const uint32_t* e_ref, int64_t n, uint32_t* out) {
  if (n <= 0) return;
  launch(w4a8_table_pair_kernel, blocks_for(n, 256), 256, 0, words, e_ref, n, out);
}

void launch_w4a8_find_tiles(const int64_t* offsets, int64_t experts, int64_t blocks, int64_t* out) {
  if (blocks <= 0) return;
  launch(w4a8_find_tiles_kernel, static_cast<unsigned>(blocks), 32, 0, offsets, experts, out);
}

void launch_f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  if (n <= 0) return;
  if (four_wide(n, in) && reinterpret_cast<uintptr_t>(out) % 8 == 0)  // (4 bf16 outputs: 8 bytes)
    launch(f32_to_bf16_kernel<true>, blocks_for(n / 4, 256), 256, 0, in, out, n);
  else
    launch(f32_to_bf16_kernel<false>, blocks_for(n, 256), 256, 0, in, out, n);
}

void set_decode_quarter_blocks(int n) { g_decode_quarter_blocks.store(n); }
// The W4A8 prefill kernel's raster (GroupedW4A8Args::cols_fast): a tile's column blocks one after
// another where set_w4a8_cols_fast's 1, or (unset) SPARROW_CUDA_W4A8_COLS_FAST's 1 (the default),
// and the tiles fit grid y; else a column block's tiles one after another. Column blocks first, a
// tile's codes come from HBM once and then from L2 for its other column blocks: in an 8K prefill
// (H200, 2026-12-04, ncu) w1 read 1.35 GB from HBM against 2.69 and took 2,696-2,707 us against
// 2,799-2,805, w2 1.25 GB against 4.50 and 2,945-2,948 us against 3,035-3,039. The same bits
// either way.
std::atomic<int> g_w4a8_cols_fast{0};
bool w4a8_cols_fast(int64_t tiles) {
  static const bool from_env = cuda_env_int("SPARROW_CUDA_W4A8_COLS_FAST", 1, [](int64_t n) { return n == 0 || n == 1; },
                                            "SPARROW_CUDA_W4A8_COLS_FAST must be 0 or 1") == 1;
  const int set = g_w4a8_cols_fast.load();
  return (set != 0 ? set > 0 : from_env) && tiles <= 65535;
}
void set_w4a8_cols_fast(int n) { g_w4a8_cols_fast.store(n); }

// Whether the four-warpgroup prefill kernel hands its ring over through mbarriers (kRing, 5 slots):
// set_w4a8_ring's choice where set (-1 no, 1 to 4 the form), else yes unless SPARROW_CUDA_DISABLE=w4a8_ring.
// The same bits either way. On an H100 (2026-12-06, layer 0 of the synthetic V4-Flash, ncu at the
// card's clocks): w1 and w3 2.20 -> 1.98 ms, w2 2.63 -> 2.37, the layer's 8K prefill 16.87-16.93 ->
// 16.06-16.10 ms in two rounds (120 registers; a first form with its barriers' slot and parity
// from 64-bit divisions, 128 registers: w1 2.07, the layer -2.7 to -2.9 %). In that first form 6
// slots (copies 4 groups ahead) read 13 % more from L2 and took w1 2.29 ms; the next group's copies
// issued while the group's wgmma ran, 2.17.
// The form: 0 the block barrier, 1 the ring with sources offset by the group number, 2 the ring with
// advancing sources (kRing 2; on an H100 2026-12-06, w1 1.96-1.97 ms for 1 against 1.93-1.94 for 2,
// 1.17 G against 1.10 G instructions, the layer's 8K prefill -0.1 to -0.6 % for 2 in five rounds),
// 3 form 2 with each warpgroup's weights of a group by one bulk copy (on an H100 2026-12-06, w1
// 1.93-1.94 -> 1.89 ms, 1.10 G -> 1.06 G instructions, the layer's 8K prefill -0.6 to -0.9 % in
// three rounds; form 2 where N % 64 != 0, which the MoE's wgmma path never has: its N is the other
// projection's K), 4 form 3 in a persistent grid (the default since the fifty-fifth session; on an
// H100 2026-12-06, w1 1.89-1.90 ms as form 3, w2 2.31 against 2.32, 1.006 G against 1.057 G
// instructions, the layer's 8K prefill +0.1 / +0.4 %, then -0.0 / -0.3 %, in two rounds each: the
// same time within the spread; form 3 where K has kStages - 2 groups or fewer).
// SPARROW_CUDA_DISABLE=w4a8_persistent gives form 3, w4a8_ring_bulk form 2,
// SPARROW_CUDA_W4A8_RING_ADVANCE=0 form 1, SPARROW_CUDA_DISABLE=w4a8_ring the barrier (each of the
// last three over w4a8_persistent: form 4 is form 3 in a persistent grid); set_w4a8_ring's choice
// wins over the variables.
std::atomic<int> g_w4a8_ring{0};
int w4a8_ring_mode() {
  if (const int n = g_w4a8_ring.load(); n != 0) return n > 0 ? n : 0;
  static const int mode = [] {
    if (!cuda_feature_on("w4a8_ring")) return 0;
    if (cuda_env_int("SPARROW_CUDA_W4A8_RING_ADVANCE", 1, [](int64_t n) { return n == 0 || n == 1; },
                     "SPARROW_CUDA_W4A8_RING_ADVANCE must be 0 or 1") == 0)
      return 1;
    if (!cuda_feature_on("w4a8_ring_bulk")) return 2;
    return cuda_feature_on("w4a8_persistent") ? 4 : 3;
  }();
  return mode;
}
void set_w4a8_ring(int n) {
  SPARROW_CHECK(n >= -1 && n <= 4 && "the W4A8 prefill ring: 0 (default), -1 (off), 1, 2, 3 or 4 (a form)");
  g_w4a8_ring.store(n);
}
std::atomic<int64_t> g_w4a8_ring_launches{0}, g_w4a8_ring_bulk_launches{0}, g_w4a8_persistent_launches{0};
int64_t w4a8_ring_launches() { return g_w4a8_ring_launches.load(); }
int64_t w4a8_ring_bulk_launches() { return g_w4a8_ring_bulk_launches.load(); }
int64_t w4a8_persistent_launches() { return g_w4a8_persistent_launches.load(); }
// The persistent form's grid: set_w4a8_persistent_grid's bound where set, else one block an SM.
std::atomic<int> g_w4a8_persistent_grid{0};
void set_w4a8_persistent_grid(int n) { g_w4a8_persistent_grid.store(n); }
void launch_w4a8_persistent(const GroupedW4A8Args& g) {
  constexpr size_t kSmem = w4a8_persist_smem_bytes();
  static_assert(blocks_fitting_smem(kSmem) >= 1, "the ring and the item barriers fit an SM");
  static const bool smem_set = cudaFuncSetAttribute(grouped_w4a8_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(kSmem)) == cudaSuccess;
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  const int64_t works = blocks_for(g.N, kWgCols * 4) * g.max_tiles, bound = g_w4a8_persistent_grid.load();
  const int64_t blocks = std::min<int64_t>(works, bound > 0 ? bound : sm_count());
  launch(grouped_w4a8_persistent_kernel, static_cast<unsigned>(blocks), kWgThreads * 4, kSmem, g);
}

void set_w4a8_decode_span(int n) { g_w4a8_decode_span.store(n); }
void set_w4a8_decode_rows(int n) { g_w4a8_decode_rows.store(n); }
void set_w4a8_decode_producer(int n) { g_w4a8_decode_producer.store(n); }

namespace {
const char* launch_w4a8_expanded(const GroupedW4A8Args& g);  // (below, with the TMA maps)
}  // namespace

PartsView launch_grouped_w4a8(const GroupedW4A8Args& g) {
  SPARROW_CHECK((g.scatter_slots == nullptr ||
                 (g.wgmma && g.w_b == nullptr && (g.tiled || g.partial == nullptr))) &&
                "scattered stores: the wgmma kernels, one projection, K's quarters in one block");
  if (g.max_items == 0 || g.N == 0 || (g.tiled && g.max_tiles == 0)) return g.out;
  if (g.wgmma) {
    if (!g.tiled) {
      const unsigned z = decode_quarter_blocks(g, g.max_items, (g.w_b != nullptr ? 2 : 1) * blocks_for(g.N, kWgCols));
      if (w4a8_decode_rows(g) == 16) launch_w4a8_decode<16>(g, w4a8_decode_span(g, z), z);
      else launch_w4a8_decode<8>(g, w4a8_decode_span(g, z), z);
      if (z == 1) return g.out;
      const int64_t count = (g.w_b != nullptr ? 2 : 1) * g.rows_total * g.N;
      if (g.leave_parts) return PartsView(g.partial, count, kW4A8Warps, false);
      add_quarters(g.out, g.partial, count);
      return g.out;
    }
    // The expanded form where the caller gave it scratch (the MoE's prefill, many rows an expert):
    // the same bits; the tiled kernel where a map is refused.
    if (g.expanded != nullptr && w4a8_expanded_takes(g) && launch_w4a8_expanded(g) == nullptr) return g.out;
    // Four warpgroups (256 columns, one block an SM) a block by default: a block reads its tile's
    // codes once for all its columns, and a product's bytes from L2 are a third fewer than at two
    // warpgroups (two blocks an SM), where the kernel's L2 throughput stood at 87 % of its peak. On
    // an H100 (2026-12-06, layer 0's 8K prefill, ncu at the card's clocks): w1 and w3 2.66 -> 2.20-2.22
    // ms, w2 2.74 -> 2.64, L2 sectors 426 M -> 287 M; the layer's 8K prefill 17.83-17.85 -> 16.87-16.88
    // ms. (At two against one on the H200, 2026-12-01: w1 and w3 6.64 against 8.81 ms.)
    GroupedW4A8Args a = g;
    a.cols_fast = w4a8_cols_fast(g.max_tiles);
    static const int env_wg = static_cast<int>(cuda_env_int(
        "SPARROW_CUDA_W4A8_WARPGROUPS", 4, [](int64_t n) { return n == 1 || n == 2 || n == 4; },
        "the W4A8 prefill kernel's warpgroups a block must be 1, 2 or 4"));
    const int wg = g.wgmma_warpgroups != 0 ? g.wgmma_warpgroups : env_wg;
    if (wg == 1) launch_w4a8_wgmma<64, 1>(a, g.max_tiles);
    else if (const int ring = wg == 4 ? w4a8_ring_mode() : 0; ring != 0) {
      if (ring == 4 && g.N % kWgCols == 0 && g.K / kW4A8GroupK > kW4A8RingStages - 2 && g.rows_pad * g.k_pad < (int64_t{1} << 32)) {
        launch_w4a8_persistent(a);
        g_w4a8_persistent_launches.fetch_add(1);
      } else if (ring >= 3 && g.N % kWgCols == 0) {
        launch_w4a8_wgmma<64, 4, false, 1, kW4A8RingStages, 3>(a, g.max_tiles);
        g_w4a8_ring_bulk_launches.fetch_add(1);
      } else if (ring >= 2) {
        launch_w4a8_wgmma<64, 4, false, 1, kW4A8RingStages, 2>(a, g.max_tiles);
      } else {
        launch_w4a8_wgmma<64, 4, false, 1, kW4A8RingStages>(a, g.max_tiles);
      }
      g_w4a8_ring_launches.fetch_add(1);
    } else if (wg == 4) launch_w4a8_wgmma<64, 4>(a, g.max_tiles);
    else launch_w4a8_wgmma<64, 2>(a, g.max_tiles);
    return g.out;
  }
  if (g.tiled) {
    static const bool smem_set = [] {
      return cudaFuncSetAttribute(grouped_w4a8_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kTiledSmemBytes)) == cudaSuccess;
    }();
    (void)smem_set;  // a failure shows as the launch's error (launch_check)
    launch(grouped_w4a8_tiled_kernel, dim3(static_cast<unsigned>(g.max_tiles), blocks_for(g.N, kTiledCols)), kTiledThreads,
           kTiledSmemBytes, g);
  } else {
    static const bool smem_set = [] {
      return cudaFuncSetAttribute(grouped_w4a8_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(small_smem_bytes<1>())) == cudaSuccess &&
             cudaFuncSetAttribute(grouped_w4a8_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(small_smem_bytes<2>())) == cudaSuccess;
    }();
    (void)smem_set;  // a failure shows as the launch's error (launch_check)
    if (w4a8_small_tiles(g) == 1)
      launch(grouped_w4a8_kernel<1>, dim3(static_cast<unsigned>(g.max_items), blocks_for(g.N, 16)), 32 * kW4A8Warps,
             small_smem_bytes<1>(), g);
    else
      launch(grouped_w4a8_kernel<2>, dim3(static_cast<unsigned>(g.max_items), blocks_for(g.N, 32)), 32 * kW4A8Warps,
             small_smem_bytes<2>(), g);
  }
  return g.out;
}

namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime (the binary links no libcuda); null when the driver
// has none.
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // (not the next launch's error)
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// A 2-D map of a row-major [outer][inner] tensor with rows `pitch` bytes apart.
bool encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t outer,
               uint64_t pitch, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  const EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {inner, outer}, strides[1] = {pitch};
  const cuuint32_t box[2] = {box_inner, box_outer}, elem[2] = {1, 1};
  return fn(map, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int64_t fp8_tma_tiles(int64_t rows, int64_t N) { return (rows + kTmaRows - 1) / kTmaRows * blocks_for(N, kTmaCols); }

// Whether a TMA GEMM of `tiles` output tiles is better cut into `parts` work items a tile (K's
// parts, summed in order by parts_sum_kernel: the same bits either way): only where the items take
// fewer waves of the SMs than the tiles' one. At 128 tiles on 132 SMs the 4 x 128 items still take
// 4 waves of a quarter of K, so the split bought nothing and cost the parts' writes and their sum
// (batch 256's wo_a: 16 us, H200 2026-12-03).
bool tma_split_pays(int64_t tiles, int64_t parts) {
  const int64_t sms = sm_count();
  return tiles < sms && (parts * tiles + sms - 1) / sms < parts;
}

// Whether a TMA GEMM cut into `split` parts rounds its outputs to bf16 in its store (`round`, the
// op's round_bf16; unsplit and fused_round only).
bool tma_store_rounds(bool round, int split) {
  static const bool fused = cuda_feature_on("fused_round");  // (off: a rounding pass after, the same values)
  return round && fused && split == 1;
}
// The work after a TMA GEMM: a split one's parts summed in order (rounded there), an unsplit one's
// rounding pass where its store did not round.
void finish_tma(float* out, const float* partial, int64_t count, int split, bool round, bool store_rounded) {
  if (split > 1) add_parts(out, partial, count, split, round);
  else if (round && !store_rounded) launch_bf16_round(out, count);
}

// The TMA kernels' raster group (tma_tile_at) for a GEMM whose weight tiles each read
// `activation_bytes`: set_tma_raster_group's where set (1 to 64; -1 for 1), else
// SPARROW_CUDA_TMA_RASTER_GROUP's where set (1 to 64), else tma_raster_auto's choice. The same bits
// at any group.
std::atomic<int> g_tma_raster_group{0};
int tma_raster_group(int64_t activation_bytes) {
  static const int from_env = static_cast<int>(cuda_env_int(
      "SPARROW_CUDA_TMA_RASTER_GROUP", 0, [](int64_t n) { return n >= 0 && n <= 64; },
      "the TMA kernels' raster group must be 0 (chosen by size) to 64 weight tiles"));
  const int set = g_tma_raster_group.load();
  if (set != 0) return set > 0 ? set : 1;
  return from_env > 0 ? from_env : tma_raster_auto(activation_bytes);
}

// The pair form's switch (set_fp8_tma_pair; 0: SPARROW_CUDA_ENABLE=fp8_pair) and its launches.
std::atomic<int> g_fp8_tma_pair{0};
std::atomic<int64_t> g_fp8_tma_pair_launches{0};
bool fp8_tma_pair_on() {
  static const bool enabled = cuda_feature_enabled("fp8_pair");
  const int set = g_fp8_tma_pair.load();
  return set != 0 ? set > 0 : enabled;
}

// The FP8 linear's prefill form on fp8_linear_tma_kernel (K's quarters in separate work items when
// `partial` is given and splitting saves a wave of the SMs: tma_split_pays); nullptr when launched, else why not
// (nothing launched: no driver entry point, a map the driver refuses), for the 64-row kernel to run.
// `left` (GroupedW4A8Args::leave_parts): where the quarters ran as separate items, *left is set to
// them and they are not added here.
const char* launch_fp8_tma(const GroupedW4A8Args& g, PartsView* left = nullptr) {
  Fp8TmaArgs a{};
  const int64_t groups = g.K / kW4A8GroupK;
  if (groups < 1) return "K under 128";
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  if (!encode_2d(&a.w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.w_codes, g.K, g.N, g.K, kW4A8GroupK, kTmaCols,
                 CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_2d(&a.x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.codes, g.k_pad, g.rows_total, g.k_pad, kW4A8GroupK, kTmaRows,
                 CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_2d(&a.s_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, g.scales, g.rows_total, groups, g.rows_pad * sizeof(float),
                 kTmaRows, 1, CU_TENSOR_MAP_SWIZZLE_NONE))
    return "cuTensorMapEncodeTiled refused a map (an address or pitch not 16-byte aligned?)";
  a.out = g.out;
  a.w_scales = g.w_scales;
  a.w_scale_ld = g.w_scale_ld;
  a.rows_total = g.rows_total;
  a.N = static_cast<int>(g.N);
  a.groups = static_cast<int>(groups);
  static const bool smem_set =
      cudaFuncSetAttribute(fp8_linear_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kTmaSmemBytes)) == cudaSuccess &&
      cudaFuncSetAttribute(fp8_linear_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kTmaSmemBytes)) == cudaSuccess;
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  const int64_t tiles = fp8_tma_tiles(g.rows_total, g.N);
  a.split = g.partial != nullptr && tma_split_pays(tiles, kW4A8Warps) ? kW4A8Warps : 1;
  a.raster_group = tma_raster_group(g.rows_total * g.K);
  if (a.split > 1) a.out = g.partial;
  // Unsplit, whole tiles leave by TMA stores where the rows' pitch and the base allow (16-byte
  // multiples); the map is made only then.
  a.o_tma = a.split == 1 && g.N % 4 == 0 && aligned16(g.out) &&
            encode_2d(&a.o_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, g.out, g.N, g.rows_total, g.N * sizeof(float), 32, 64,
                      CU_TENSOR_MAP_SWIZZLE_128B);
  const bool round_here = tma_store_rounds(g.round_bf16, a.split);
  // The pair form (fp8_linear_tma_kernel's kPair) where it is on and applies: unsplit, an even number
  // of weight tiles, its half-box map made, and the device able to hold its clusters.
  const int64_t weight_tiles = blocks_for(g.N, kTmaCols);
  int pair_clusters = 0;
  if (fp8_tma_pair_on() && a.split == 1 && weight_tiles % 2 == 0 &&
      encode_2d(&a.xh_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.codes, g.k_pad, g.rows_total, g.k_pad, kW4A8GroupK,
                kTmaRows / 2, CU_TENSOR_MAP_SWIZZLE_128B)) {
    static const int held = [] {
      const bool set = cudaFuncSetAttribute(fp8_linear_tma_kernel<false, false, true>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kTmaSmemBytes)) == cudaSuccess &&
                       cudaFuncSetAttribute(fp8_linear_tma_kernel<true, false, true>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kTmaSmemBytes)) == cudaSuccess;
      return set ? max_active_clusters(fp8_linear_tma_kernel<false, false, true>, kTmaThreads, kTmaSmemBytes, 2) : 0;
    }();
    pair_clusters = held;
  }
  if (pair_clusters > 0) {
    const int64_t pairs = tiles / 2;
    g_fp8_tma_pair_launches.fetch_add(1);
    launch_clustered(round_here ? fp8_linear_tma_kernel<true, false, true> : fp8_linear_tma_kernel<false, false, true>,
                     static_cast<unsigned>(2 * std::min<int64_t>(pairs, pair_clusters)), kTmaThreads, kTmaSmemBytes, 2, a);
  } else {
    launch(round_here ? fp8_linear_tma_kernel<true> : fp8_linear_tma_kernel<false>,
           static_cast<unsigned>(std::min<int64_t>(tiles * a.split, sm_count())), kTmaThreads, kTmaSmemBytes, a);
  }
  if (left != nullptr && a.split > 1) *left = PartsView(g.partial, g.rows_total * g.N, a.split, g.round_bf16);
  else finish_tma(g.out, g.partial, g.rows_total * g.N, a.split, g.round_bf16, round_here);
  return nullptr;
}

// The expanded W4A8 form (GroupedW4A8Args::expanded): the experts' weights as e5m2 bytes, the rows
// in grouped order where they are not, then fp8_linear_tma_kernel<false, true>; nullptr when
// launched, else why not (nothing launched).
std::atomic<int64_t> g_w4a8_expanded_launches{0};
const char* launch_w4a8_expanded(const GroupedW4A8Args& g) {
  Fp8TmaArgs a{};
  const int64_t groups = g.K / kW4A8GroupK, E = g.experts;
  const bool gather = g.in_rows != nullptr;
  if (gather && g.sorted_codes == nullptr) return "no scratch for the grouped rows";
  if (g.tile_list == nullptr || g.tile_scales == nullptr) return "no scratch for the tile list";
  const uint8_t* codes = gather ? g.sorted_codes : g.codes;
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  const int64_t tiles = w4a8_tile_bound(g.rows_total, E, kTmaRows);
  if (!encode_2d(&a.w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.expanded, g.K, E * g.N, g.K, kW4A8GroupK, kTmaCols,
                 CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_2d(&a.x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, codes, g.k_pad, g.rows_total, g.k_pad, kW4A8GroupK, kTmaRows,
                 CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_2d(&a.s_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, g.tile_scales, kTmaRows, tiles * groups,
                 kTmaRows * sizeof(float), kTmaRows, 1, CU_TENSOR_MAP_SWIZZLE_NONE))
    return "cuTensorMapEncodeTiled refused a map";
  launch(w4a8_expand_kernel, dim3(blocks_for(g.N * groups * 4, 256), static_cast<unsigned>(E)), 256, 0, g.w, g.offsets,
         g.N, g.K, g.expanded);
  // The items: at most (rows / 128 + min(E, rows) + 1) tiles times the weight tiles.
  launch(w4a8_tma_tiles_kernel, static_cast<unsigned>(tiles), kTmaRows, 0, g.offsets, E, g.scales, g.rows_pad,
         g.in_rows, static_cast<int>(groups), g.tile_list, g.tile_scales);
  if (gather && !g.sorted_ready)
    launch(w4a8_gather_rows_kernel, static_cast<unsigned>(g.rows_total), 128, 0, g.codes, g.k_pad, g.in_rows,
           g.sorted_codes);
  a.out = g.out;
  a.rows_total = g.rows_total;
  a.N = static_cast<int>(g.N);
  a.groups = static_cast<int>(groups);
  a.split = 1;
  a.raster_group = 1;
  a.o_tma = 0;
  a.offsets = g.offsets;
  a.w = g.w;
  a.slots = g.scatter_slots;
  a.experts = E;
  a.tiles = g.tile_list;
  static const bool smem_set = cudaFuncSetAttribute(fp8_linear_tma_kernel<false, true>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(kTmaSmemBytes)) == cudaSuccess;
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  const int64_t items = tiles * ((g.N + kTmaCols - 1) / kTmaCols);
  launch(fp8_linear_tma_kernel<false, true>, static_cast<unsigned>(std::min<int64_t>(items, sm_count())), kTmaThreads,
         kTmaSmemBytes, a);
  g_w4a8_expanded_launches.fetch_add(1);
  return nullptr;
}

}  // namespace

int64_t w4a8_expanded_launches() { return g_w4a8_expanded_launches.load(); }
void set_fp8_tma_pair(int n) { g_fp8_tma_pair.store(n); }
int64_t fp8_tma_pair_launches() { return g_fp8_tma_pair_launches.load(); }

bool w4a8_expanded_takes(const GroupedW4A8Args& g) {
  return g.wgmma && g.tiled && g.w_b == nullptr && g.partial == nullptr && g.K % kW4A8GroupK == 0 &&
         g.K >= kW4A8GroupK && g.k_pad % kW4A8GroupK == 0 && g.experts > 0 && g.experts <= 65535 &&
         g.experts * g.N < (int64_t{1} << 31) && g.rows_total < (int64_t{1} << 31) && encode_tiled() != nullptr;
}

void set_tma_raster_group(int n) { g_tma_raster_group.store(n); }

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0
               ? n
               : 132;
  }();
  return sms;
}

bool fp8_wgmma_linear_wants_partial(int64_t rows, int64_t N) {
  return rows <= kTiledRows || tma_split_pays(fp8_tma_tiles(rows, N), kW4A8Warps);
}

namespace {

std::atomic<int64_t> g_fp8_quant_in_launches{0};

// The 8-row form's grid z for g (decode_quarter_blocks).
unsigned fp8_decode_quarters(const GroupedW4A8Args& g) {
  return decode_quarter_blocks(g, (g.rows_total + 7) / 8, blocks_for(g.N, kWgCols));
}

// Every column block reads its rows' inputs again (all of K over its quarters): col_blocks x rows x
// K x 4 bytes from L2 in all, against one act_quant's read. A bound on that: 16 MiB is wq_b (512
// column blocks of K = 1024) at 8 rows; at 64 rows it would be 128 MiB, four times its weights.
// (The bound is not measured: only batch 1 was timed, H100 2026-12-07.)
constexpr int64_t kFp8QuantInMaxReads = int64_t{16} << 20;

// The extra shared memory a block of the 8-row form takes to quantise its rows itself (its groups
// past the ring's kStages slots, kQuantInGroupBytes each, for the block of the most groups), or -1
// where it cannot (GroupedW4A8Args::x_f32) or its blocks' reads pass kFp8QuantInMaxReads.
int64_t fp8_quant_in_extra(const GroupedW4A8Args& g) {
  if (g.x_f32 == nullptr || g.rows_total > kTiledRows || g.rows_total <= 0 || g.x_k <= 0 || g.x_k > g.K ||
      g.x_ld < g.x_k || g.K % kW4A8GroupK != 0 ||
      blocks_for(g.N, kWgCols) * g.rows_total * g.x_k * static_cast<int64_t>(sizeof(float)) > kFp8QuantInMaxReads)
    return -1;
  const int groups = static_cast<int>(g.K / kW4A8GroupK);
  const unsigned z = fp8_decode_quarters(g);
  const int q_count = kW4A8Warps / static_cast<int>(z);
  int most = 0;
  for (int q = 0; q < kW4A8Warps; q += q_count)  // (w4a8_quarter's bounds)
    most = std::max(most, (q + q_count) * groups / kW4A8Warps - q * groups / kW4A8Warps);
  const int64_t past = std::max(0, most - wg_stages<8, true>());
  const int64_t bytes = past * static_cast<int64_t>(kQuantInGroupBytes);
  return bytes <= static_cast<int64_t>(kFp8QuantInMaxBytes) ? bytes : -1;
}

}  // namespace

bool fp8_wgmma_quant_in_takes(const GroupedW4A8Args& g) { return fp8_quant_in_extra(g) >= 0; }
int64_t fp8_wgmma_quant_in_launches() { return g_fp8_quant_in_launches.load(); }

PartsView launch_fp8_wgmma_linear(const GroupedW4A8Args& g) {
  if (g.rows_total == 0 || g.N == 0) return g.out;
  if (g.rows_total <= kTiledRows) {
    const int64_t items = (g.rows_total + 7) / 8;
    const unsigned z = fp8_decode_quarters(g);
    if (g.x_f32 != nullptr) {
      const int64_t extra = fp8_quant_in_extra(g);
      SPARROW_CHECK(extra >= 0 && "the FP8 linear's rows quantised in its kernel: fp8_wgmma_quant_in_takes first");
      launch_w4a8_wgmma<8, 1, true>(g, items, z, static_cast<size_t>(extra));
      g_fp8_quant_in_launches.fetch_add(1);
    } else {
      launch_w4a8_wgmma<8, 1, true>(g, items, z);
    }
    if (z > 1 && g.leave_parts) return PartsView(g.partial, g.rows_total * g.N, kW4A8Warps, g.round_bf16);
    if (z > 1) add_quarters(g.out, g.partial, g.rows_total * g.N, g.round_bf16);
    else if (g.round_bf16) launch_bf16_round(g.out, g.rows_total * g.N);
    return g.out;
  }
  static const bool tma = cuda_feature_on("fp8_tma");
  if (tma) {
    PartsView view = g.out;
    const char* why = launch_fp8_tma(g, g.leave_parts ? &view : nullptr);
    if (why == nullptr) return view;  // (rounded there, or by the reader of the quarters left)
    // The fallback gives the same bits at a third of the speed: said once, so that it is not silent.
    static std::once_flag said;
    std::call_once(said, [why] {
      std::fprintf(stderr, "sparrow: the FP8 linears' TMA kernel cannot run (%s); using the 64-row wgmma kernel\n", why);
    });
  }
  launch_w4a8_wgmma<64, 2, true>(g, (g.rows_total + kTiledRows - 1) / kTiledRows);
  if (g.round_bf16) launch_bf16_round(g.out, g.rows_total * g.N);
  return g.out;
}

namespace {

int64_t bf16_tma_tiles(int64_t rows, int64_t N) { return (rows + 127) / 128 * ((N + 127) / 128); }

template <bool kF32X, bool kFp8W>
void launch_bf16_decode_form(dim3 grid, const Bf16LinearArgs& c) {
  static const bool smem_set =
      cudaFuncSetAttribute(bf16_linear_decode_kernel<kF32X, kFp8W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bf16_dec_smem_bytes<kF32X, kFp8W>())) == cudaSuccess;
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  launch(bf16_linear_decode_kernel<kF32X, kFp8W>, grid, kWgThreads, bf16_dec_smem_bytes<kF32X, kFp8W>(), c);
}

// The decode form over rows [r0, r0 + n) of a (n <= the partial's rows), its parts then added, or
// (a.leave_parts) left in a.partial: the view returned.
PartsView launch_bf16_decode(const Bf16LinearArgs& a, int64_t r0, int64_t n) {
  Bf16LinearArgs c = a;
  if (a.x_f32 != nullptr) c.x_f32 = a.x_f32 + r0 * a.x_ld;
  else c.x = a.x + r0 * a.x_ld;
  c.rows = n;
  const int parts = bf16_parts(a.N);
  const dim3 grid(blocks_for(n, 8), blocks_for(a.N, kWgCols), static_cast<unsigned>(parts));
  const bool f32x = c.x_f32 != nullptr, fp8w = c.w8.data != nullptr;
  if (f32x && fp8w) launch_bf16_decode_form<true, true>(grid, c);
  else if (f32x) launch_bf16_decode_form<true, false>(grid, c);
  else if (fp8w) launch_bf16_decode_form<false, true>(grid, c);
  else launch_bf16_decode_form<false, false>(grid, c);
  if (a.leave_parts) return PartsView(a.partial, n * a.N, parts, a.round_bf16);
  add_parts(a.out + r0 * a.N, a.partial, n * a.N, parts, a.round_bf16);
  return a.out + r0 * a.N;
}

// The TMA form; nullptr when launched, else why not (nothing launched).
// `left`: as launch_fp8_tma's (Bf16LinearArgs::leave_parts).
const char* launch_bf16_tma(const Bf16LinearArgs& a, PartsView* left = nullptr) {
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  Bf16TmaArgs t{};
  if (!encode_2d(&t.w_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.w, a.K, a.N, 2 * static_cast<uint64_t>(a.K), kBf16Step,
                 128, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_2d(&t.x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.x, a.x_ld, a.rows, 2 * a.x_ld, kBf16Step, 128,
                 CU_TENSOR_MAP_SWIZZLE_128B))
    return "cuTensorMapEncodeTiled refused a map (an address or pitch not 16-byte aligned?)";
  static const bool smem_set =
      cudaFuncSetAttribute(bf16_linear_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kBf16TmaSmemBytes)) == cudaSuccess &&
      cudaFuncSetAttribute(bf16_linear_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kBf16TmaSmemBytes)) == cudaSuccess;
  (void)smem_set;  // a failure shows as the launch's error (launch_check)
  t.rows = a.rows;
  t.N = a.N, t.K = a.K, t.R = a.R, t.steps = a.K / kBf16Step;
  const int64_t tiles = bf16_tma_tiles(a.rows, a.N);
  t.parts = bf16_parts(a.N);
  t.split = tma_split_pays(tiles, t.parts) ? t.parts : 1;
  t.raster_group = tma_raster_group(a.rows * a.K * 2);
  t.out = t.split > 1 ? a.partial : a.out;
  const bool round_here = tma_store_rounds(a.round_bf16, t.split);
  launch(round_here ? bf16_linear_tma_kernel<true> : bf16_linear_tma_kernel<false>,
         static_cast<unsigned>(std::min<int64_t>(tiles * t.split, sm_count())), kTmaThreads, kBf16TmaSmemBytes, t);
  if (left != nullptr && t.split > 1) *left = PartsView(a.partial, a.rows * a.N, t.split, a.round_bf16);
  else finish_tma(a.out, a.partial, a.rows * a.N, t.split, a.round_bf16, round_here);
  return nullptr;
}

}  // namespace

bool bf16_wgmma_linear_takes(int64_t N, int64_t K, int64_t R) {
  constexpr int64_t kMax = int64_t{1} << 31;
  return N > 0 && K > 0 && K % kBf16Step == 0 && R > 0 && N % R == 0 && (R == N || R % 128 == 0) &&
         N <= int64_t{65535} * kWgCols /* the decode form's grid y */ && K < kMax;
}

int64_t bf16_wgmma_partial_floats(int64_t rows, int64_t N) {
  // (Else room for the decode form's 64-row chunks should the TMA form not run.)
  const bool split = rows <= kTiledRows || tma_split_pays(bf16_tma_tiles(rows, N), bf16_parts(N));
  return bf16_parts(N) * (split ? rows : kTiledRows) * N;
}

bool bf16_wgmma_reads_f32(int64_t rows) { return rows <= kTiledRows; }

PartsView launch_bf16_wgmma_linear(const Bf16LinearArgs& a) {
  if (a.rows == 0 || a.N == 0) return a.out;
  if (a.rows <= kTiledRows) return launch_bf16_decode(a, 0, a.rows);
  SPARROW_CHECK(a.x != nullptr && a.w != nullptr && "the bf16 linears' TMA form reads bf16 inputs and weights");
  static const bool tma = cuda_feature_on("bf16_tma");
  PartsView view = a.out;
  const char* why = tma ? launch_bf16_tma(a, a.leave_parts ? &view : nullptr) : "bf16_tma is off";
  if (why == nullptr) return view;
  // The decode form in chunks of 64 rows: the same bits, far slower; said once.
  static std::once_flag said;
  std::call_once(said, [why] {
    std::fprintf(stderr, "sparrow: the bf16 linears' TMA kernel cannot run (%s); using the 8-row wgmma kernel\n", why);
  });
  Bf16LinearArgs chunk = a;
  chunk.leave_parts = false;  // (each chunk's parts summed before the next chunk writes them)
  for (int64_t r0 = 0; r0 < a.rows; r0 += kTiledRows)
    launch_bf16_decode(chunk, r0, std::min<int64_t>(kTiledRows, a.rows - r0));
  return a.out;
}

void launch_grouped_expert_linear(const GroupedExpertLinearArgs& g) {
  if (g.max_items == 0 || g.N == 0) return;
  const dim3 grid(static_cast<unsigned>(g.max_items), blocks_for(g.N, kWarpsPerBlock));
  const int path = kernel_path(g.vectorized, g.format);
  if (path == 2) launch(grouped_expert_linear_kernel<2>, grid, 32 * kWarpsPerBlock, 0, g);
  else if (path == 1) launch(grouped_expert_linear_kernel<1>, grid, 32 * kWarpsPerBlock, 0, g);
  else launch(grouped_expert_linear_kernel<0>, grid, 32 * kWarpsPerBlock, 0, g);
}

// This translation unit's trace region (kernels.h set_kernel_trace).
cudaError_t set_kernel_trace_linear(KernelTraceSlot* region) { return set_kernel_trace_here(region); }

}  // namespace sparrow::cuda
