// Linear layers over weights in their checkpoint formats (float, FP8 block-scaled, packed FP4),
// dequantised element by element as they are read. One warp per output row n and a tile of up to
// kTokenTile tokens: the lanes stride over K, so each weight element is decoded once per tile and
// the reduction order is fixed (a token's result does not depend on the other tokens).
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/device_common.cuh"

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
  const uint4* wrow = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.w.data) + n * row_bytes);
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
        vs[u] = __ldg(wrow + c);
        ss[u] = dev_load(scales, scale_row + c * kIn / a.w.block_in);
      }
    }
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      const int64_t k0 = c * kIn;
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
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= a.w.out) return;  // the whole warp leaves together
  tile<kPath>(a, n, static_cast<int64_t>(blockIdx.y) * kTokenTile);
}

// grid (max_items, ceil(N / kWarpsPerBlock)), the same block: work item x = (expert, first row of
// its tile) from the plan (on grid x, which allows 2^31 - 1 blocks: a long prefill has more than
// grid y's 65,535 items); blocks past *n_items leave.
template <int kPath>
__global__ void grouped_expert_linear_kernel(GroupedExpertLinearArgs g) {
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

// Four e2m1 nibbles (the low nibble first) as four e4m3 bytes of the same values: magnitude index
// i = nibble & 7 is 0, 0.5, 1, 1.5, 2, 3, 4, 6, in e4m3 0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48,
// 0x4c (0.5 = 2^-1 is exponent field 6; (1 + m/2) 2^(e-1) for e = i >> 1 >= 1, m = i & 1 is exponent
// field e + 6, mantissa m << 2). One byte permute looks the four magnitudes up in that 8-byte table
// (its selector nibbles are the indices: bit 3, the sign, masked off), and the four sign bits move
// from bit 3 of each nibble to bit 7 of each byte.
__device__ inline uint32_t e2m1x4_to_e4m3x4(uint32_t nibbles) {
  constexpr uint32_t kTableLo = 0x3c383000u, kTableHi = 0x4c484440u;
  const uint32_t mag = __byte_perm(kTableLo, kTableHi, nibbles & 0x7777u);
  uint32_t t = (nibbles | (nibbles << 8)) & 0x00ff00ffu;  // nibbles 0, 1 -> bytes 0, 2 (low, high nibble)
  t = (t | (t << 4)) & 0x0f0f0f0fu;                       // each nibble in its own byte
  return mag | ((t & 0x08080808u) << 4);
}

// d = A (16 x 32, e4m3, row) x B (32 x 8, e4m3, col), fp32, from zero. A's a0/a2 (rows 0..7; a1/a3
// rows 8..15, d[2], d[3] their results) and B's b0/b1 hold the same k's in the same byte order, so
// which k a register slot means in hardware does not matter.
__device__ inline void mma_e4m3_16x8x32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
#else
  __trap();
#endif
}

static_assert(kMoeTileRows == 8, "the W4A8 kernel maps a lane group (lane / 4) to one of 8 tile rows");

constexpr int kW4A8Warps = 4;      // warps of a block, each a quarter of K (split-K, fixed)
constexpr int kW4A8Tiles = 1;      // n8 tiles of a block (2 measured no faster at batch 256 and slower at 1: fewer blocks)
constexpr int kW4A8Cols = 8 * kW4A8Tiles;  // output columns of a block
constexpr int kW4A8GroupK = 128;   // inputs of a warp's step: 4 MXFP4 blocks, one activation scale
static_assert(kW4A8GroupK == kFp8ActBlock && kW4A8GroupK / 32 == 4, "a step is one activation block of 4 MXFP4 blocks");

// The 128-input groups of K, G = ceil(K / 128) of them, cut in kW4A8Warps contiguous quarters:
// quarter p is groups [w4a8_quarter(p, G), w4a8_quarter(p + 1, G)) (some empty when G < 4).
__device__ inline int64_t w4a8_quarter(int64_t p, int64_t groups) { return p * groups / kW4A8Warps; }

// One block: output columns n0 .. n0 + kW4A8Cols - 1 (kW4A8Tiles n8 tiles) of one tile of 8 rows.
// Warp w takes quarter w of K's groups; for each group, one mma.sync.m16n8k32 per MXFP4 block of 32
// inputs, its fp32 result times the activation scale times the column's block scale added to the
// warp's sum (groups and blocks in increasing order); the four warps' sums are then added in warp
// order (v = s0, v += s1, v += s2, v += s3). The order of every sum depends only on K, never on the
// rows or the batch.
//
// Lane l: g = l / 4 is its A row (tile row), its B column and its C row; t = l % 4. The k's a
// register slot stands for only have to agree between A and B (the mma sums over all 32): in block
// b, lane t holds inputs 32b + 8t .. 32b + 8t + 7, so its weight is one aligned 4-byte word of the
// packed row (8 nibbles, low first: b0 = the first 4, b1 = the last 4, widened to e4m3) and its
// activations one 8-byte word of the codes (a0, a2). Rows 8..15 of the m16 shape are unused.
__global__ void grouped_w4a8_kernel(GroupedW4A8Args g) {
  const int64_t item = blockIdx.x;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kW4A8Cols;
  const DevWeight W = g.w[e];
  const DevView wscale{W.scale, W.scale_dtype};
  const bool packed_scales = W.scale_dtype == DType::kF8E8M0 && W.scale_cols % 4 == 0;
  const int64_t tr = t0 + gid;
  const bool row_ok = tr < R;
  const int64_t src = row_ok ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : 0;
  const uint8_t* arow = g.codes + src * g.k_pad;
  // n8 tile q: this lane's B column n0 + 8q + gid and C columns (row gid) n0 + 8q + 2 tig (+1).
  const uint8_t* wrow[kW4A8Tiles];
  bool col_ok[kW4A8Tiles];
  int64_t nc[kW4A8Tiles][2];
#pragma unroll
  for (int q = 0; q < kW4A8Tiles; ++q) {
    const int64_t nb = n0 + 8 * q + gid;
    col_ok[q] = nb < g.N;
    wrow[q] = static_cast<const uint8_t*>(W.data) + (col_ok[q] ? nb : 0) * (g.K / 2);
    nc[q][0] = n0 + 8 * q + 2 * tig;
    nc[q][1] = nc[q][0] + 1;
  }
  const int64_t blocks = g.K / 32;
  float acc[kW4A8Tiles][2] = {};
  const int64_t groups = (g.K + kW4A8GroupK - 1) / kW4A8GroupK;
  for (int64_t kg = w4a8_quarter(warp, groups); kg < w4a8_quarter(warp + 1, groups); ++kg) {
    const int64_t b0 = kg * (kW4A8GroupK / 32);
    // Issue every load of the group before the first mma. (Measured no faster on the H200: staging
    // the weights through shared memory with 16-byte loads; issuing the next group's loads before
    // this group's mma, 80 registers: 2.8 -> 3.1 ms for w1, w3 at batch 256.)
    uint32_t wbits[kW4A8Tiles][4];
    uint2 abits[4];
    float ws[kW4A8Tiles][2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = b0 + j < blocks;
      const int64_t k = (b0 + j) * 32 + 8 * tig;
      abits[j] = ok && row_ok ? *reinterpret_cast<const uint2*>(arow + k) : make_uint2(0u, 0u);
#pragma unroll
      for (int q = 0; q < kW4A8Tiles; ++q)
        wbits[q][j] = ok && col_ok[q] ? __ldg(reinterpret_cast<const uint32_t*>(wrow[q] + k / 2)) : 0u;
    }
#pragma unroll
    for (int q = 0; q < kW4A8Tiles; ++q)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t n = nc[q][c] < g.N ? nc[q][c] : 0;
        if (packed_scales) {
          const uint32_t four = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(W.scale) +
                                                                         n * W.scale_cols + b0));
#pragma unroll
          for (int j = 0; j < 4; ++j) ws[q][c][j] = dev_e8m0(static_cast<uint8_t>(four >> (8 * j)));
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) ws[q][c][j] = b0 + j < blocks ? dev_load(wscale, n * W.scale_cols + b0 + j) : 0.0f;
        }
      }
    const float sa = row_ok ? g.scales[kg * g.rows_pad + src] : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (b0 + j >= blocks) break;  // the same for the whole warp
#pragma unroll
      for (int q = 0; q < kW4A8Tiles; ++q) {
        float d[4];
        mma_e4m3_16x8x32(d, abits[j].x, 0u, abits[j].y, 0u, e2m1x4_to_e4m3x4(wbits[q][j] & 0xffffu),
                         e2m1x4_to_e4m3x4(wbits[q][j] >> 16));
        acc[q][0] += d[0] * (sa * ws[q][0][j]);
        acc[q][1] += d[1] * (sa * ws[q][1][j]);
      }
    }
  }
  __shared__ float part[kW4A8Warps][32][kW4A8Tiles][2];
#pragma unroll
  for (int q = 0; q < kW4A8Tiles; ++q) {
    part[warp][lane][q][0] = acc[q][0];
    part[warp][lane][q][1] = acc[q][1];
  }
  __syncthreads();
  if (warp != 0 || !row_ok) return;
  float* out = g.out + (r0 + tr) * g.N;
#pragma unroll
  for (int q = 0; q < kW4A8Tiles; ++q)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float v = part[0][lane][q][c];
#pragma unroll
      for (int w = 1; w < kW4A8Warps; ++w) v += part[w][lane][q][c];
      if (nc[q][c] < g.N) out[nc[q][c]] = v;
    }
}

// The same products and sums for many rows an expert (prefill): a block computes rows t0 .. t0+63 of
// one expert (the items whose t0 is a multiple of 64; the others leave) times 64 output columns,
// with the codes of 64 rows x 128 inputs and the weights of 64 columns x 128 inputs staged in shared
// memory per group of 128 inputs (each code read once for 64 columns, each weight once for 64
// rows), the next group's loaded into registers while this one computes. Warp w owns rows
// 16w .. 16w+15 (the whole m16 shape) and the 8 n8 tiles of the 64 columns. Every output is the
// small kernel's arithmetic: the same k's in the same register slots of the same mma, the same
// scaling expression, groups in order, and at each quarter's end (w4a8_quarter) the quarter's sum
// added to the total as the small kernel adds its warps' sums: so each row is the same bits
// whichever kernel ran it.
constexpr int kTiledRows = 64, kTiledCols = 64, kTiledThreads = 128, kTiledNTiles = kTiledCols / 8;
constexpr int kCodeStride = 160;   // bytes per staged code row (128 + padding: no bank conflicts)
constexpr int kWeightStride = 80;  // bytes per staged weight column (64 + padding)
static_assert(kTiledRows % kMoeTileRows == 0 && kTiledThreads == 32 * kW4A8Warps && kTiledRows == 16 * kW4A8Warps,
              "warp w owns rows 16w .. 16w+15");

constexpr int kCodePieces = kTiledRows * kW4A8GroupK / 16 / kTiledThreads;    // 16-byte pieces a thread stages
constexpr int kWeightPieces = kTiledCols * kW4A8GroupK / 32 / kTiledThreads;  // (FP4: 16 bytes = 32 inputs)
struct TiledStage {
  uint4 codes[kCodePieces];
  uint4 weights[kWeightPieces];
  float row_scale;      // (threads < kTiledRows) its row's activation scale
  float col_scales[4];  // (threads < kTiledCols) its column's 4 block scales
};

__global__ void __launch_bounds__(kTiledThreads) grouped_w4a8_tiled_kernel(GroupedW4A8Args g) {
  const int64_t item = blockIdx.x;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  if (t0 % kTiledRows != 0) return;  // the item that starts this 64-row tile does its rows
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTiledCols;
  const DevWeight W = g.w[e];
  const DevView wscale{W.scale, W.scale_dtype};
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int64_t blocks = g.K / 32, groups = (g.K + kW4A8GroupK - 1) / kW4A8GroupK;
  __shared__ __align__(16) uint8_t s_codes[kTiledRows * kCodeStride];
  __shared__ __align__(16) uint8_t s_weights[kTiledCols * kWeightStride];
  __shared__ float s_row_scale[kTiledRows];
  __shared__ float s_col_scale[kTiledCols][4];
  __shared__ int64_t s_src[kTiledRows];
  if (tid < kTiledRows) {
    const int64_t tr = t0 + tid;
    s_src[tid] = tr < R ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : -1;
  }
  __syncthreads();

  // Global -> registers for group kg: code piece i of this thread is row p / 8, bytes 16 (p % 8);
  // weight piece i is column p / 4, bytes 16 (p % 4) (p = tid + 128 i).
  auto load = [&](int64_t kg, TiledStage& st) {
    const int64_t k0 = kg * kW4A8GroupK;
#pragma unroll
    for (int i = 0; i < kCodePieces; ++i) {
      const int p = tid + kTiledThreads * i, row = p / 8, off = 16 * (p % 8);
      const int64_t src = s_src[row];
      st.codes[i] = src >= 0 ? *reinterpret_cast<const uint4*>(g.codes + src * g.k_pad + k0 + off) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kWeightPieces; ++i) {
      const int p = tid + kTiledThreads * i, col = p / 4, off = 16 * (p % 4);
      const int64_t n = n0 + col;
      const bool ok = n < g.N && (k0 + 2 * off) < g.K;  // 16 bytes = 32 inputs: one MXFP4 block
      st.weights[i] = ok ? __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(W.data) + n * (g.K / 2) + k0 / 2 + off))
                         : make_uint4(0, 0, 0, 0);
    }
    if (tid < kTiledRows) {
      const int64_t src = s_src[tid];
      st.row_scale = src >= 0 ? g.scales[kg * g.rows_pad + src] : 0.0f;
    }
    if (tid < kTiledCols) {
      const int64_t n = n0 + tid < g.N ? n0 + tid : 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t b = kg * 4 + j;
        st.col_scales[j] = b < blocks ? dev_load(wscale, n * W.scale_cols + b) : 0.0f;
      }
    }
  };
  auto store = [&](const TiledStage& st) {
#pragma unroll
    for (int i = 0; i < kCodePieces; ++i) {
      const int p = tid + kTiledThreads * i, row = p / 8, off = 16 * (p % 8);
      *reinterpret_cast<uint4*>(s_codes + row * kCodeStride + off) = st.codes[i];
    }
#pragma unroll
    for (int i = 0; i < kWeightPieces; ++i) {
      const int p = tid + kTiledThreads * i;
      *reinterpret_cast<uint4*>(s_weights + (p / 4) * kWeightStride + 16 * (p % 4)) = st.weights[i];
    }
    if (tid < kTiledRows) s_row_scale[tid] = st.row_scale;
    if (tid < kTiledCols)
#pragma unroll
      for (int j = 0; j < 4; ++j) s_col_scale[tid][j] = st.col_scales[j];
  };

  // acc: the current quarter's sums, total: the finished quarters' (slots: n8 tile nt, C slot c =
  // rows gid, gid + 8 x columns 2 tig, 2 tig + 1).
  float acc[kTiledNTiles][4] = {}, total[kTiledNTiles][4] = {};
  int quarter = 0;
  auto finish_quarter = [&] {
#pragma unroll
    for (int nt = 0; nt < kTiledNTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        total[nt][c] = quarter == 0 ? acc[nt][c] : total[nt][c] + acc[nt][c];
        acc[nt][c] = 0.0f;
      }
    ++quarter;
  };
  const int ra = 16 * warp + gid, rb = ra + 8;  // this lane's two A rows (tile-local)
  TiledStage st;
  load(0, st);
  for (int64_t kg = 0; kg < groups; ++kg) {
    while (kg >= w4a8_quarter(quarter + 1, groups)) finish_quarter();
    __syncthreads();  // the previous group's readers are done
    store(st);
    __syncthreads();
    if (kg + 1 < groups) load(kg + 1, st);
    const float sa_a = s_row_scale[ra], sa_b = s_row_scale[rb];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (kg * 4 + j >= blocks) break;  // the same for the whole block
      const uint2 a_lo = *reinterpret_cast<const uint2*>(s_codes + ra * kCodeStride + 32 * j + 8 * tig);
      const uint2 a_hi = *reinterpret_cast<const uint2*>(s_codes + rb * kCodeStride + 32 * j + 8 * tig);
#pragma unroll
      for (int nt = 0; nt < kTiledNTiles; ++nt) {
        const uint32_t wbits = *reinterpret_cast<const uint32_t*>(s_weights + (8 * nt + gid) * kWeightStride + 16 * j + 4 * tig);
        float d[4];
        mma_e4m3_16x8x32(d, a_lo.x, a_hi.x, a_lo.y, a_hi.y, e2m1x4_to_e4m3x4(wbits & 0xffffu),
                         e2m1x4_to_e4m3x4(wbits >> 16));
        const float ws0 = s_col_scale[8 * nt + 2 * tig][j], ws1 = s_col_scale[8 * nt + 2 * tig + 1][j];
        acc[nt][0] += d[0] * (sa_a * ws0);
        acc[nt][1] += d[1] * (sa_a * ws1);
        acc[nt][2] += d[2] * (sa_b * ws0);
        acc[nt][3] += d[3] * (sa_b * ws1);
      }
    }
  }
  while (quarter < kW4A8Warps) finish_quarter();
#pragma unroll
  for (int nt = 0; nt < kTiledNTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t tr = t0 + (c < 2 ? ra : rb), n = n0 + 8 * nt + 2 * tig + (c & 1);
      if (tr < R && n < g.N) g.out[(r0 + tr) * g.N + n] = total[nt][c];
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ inline uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

__global__ void weight_to_bf16_kernel(DevWeight w, uint16_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < w.out * w.in) out[i] = bf16_bits(weight_at(w, i / w.in, i % w.in));
}

__global__ void f32_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bf16_bits(in[i]);
}

}  // namespace

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
  if (path == 2) linear_kernel<2><<<grid, 32 * kWarpsPerBlock>>>(a);
  else if (path == 1) linear_kernel<1><<<grid, 32 * kWarpsPerBlock>>>(a);
  else if (path == 3) linear_kernel<3><<<grid, 32 * kWarpsPerBlock>>>(a);
  else if (path == 4) linear_kernel<4><<<grid, 32 * kWarpsPerBlock>>>(a);
  else linear_kernel<0><<<grid, 32 * kWarpsPerBlock>>>(a);
  return vectorized;
}

void launch_weight_to_bf16(const DevWeight& w, uint16_t* out) {
  if (w.out * w.in > 0) weight_to_bf16_kernel<<<blocks_for(w.out * w.in, 256), 256>>>(w, out);
}

void launch_f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  if (n > 0) f32_to_bf16_kernel<<<blocks_for(n, 256), 256>>>(in, out, n);
}

void launch_grouped_w4a8(const GroupedW4A8Args& g) {
  if (g.max_items == 0 || g.N == 0) return;
  if (g.tiled)
    grouped_w4a8_tiled_kernel<<<dim3(static_cast<unsigned>(g.max_items), blocks_for(g.N, kTiledCols)), kTiledThreads>>>(g);
  else
    grouped_w4a8_kernel<<<dim3(static_cast<unsigned>(g.max_items), blocks_for(g.N, kW4A8Cols)), 32 * kW4A8Warps>>>(g);
}

void launch_grouped_expert_linear(const GroupedExpertLinearArgs& g) {
  if (g.max_items == 0 || g.N == 0) return;
  const dim3 grid(static_cast<unsigned>(g.max_items), blocks_for(g.N, kWarpsPerBlock));
  const int path = kernel_path(g.vectorized, g.format);
  if (path == 2) grouped_expert_linear_kernel<2><<<grid, 32 * kWarpsPerBlock>>>(g);
  else if (path == 1) grouped_expert_linear_kernel<1><<<grid, 32 * kWarpsPerBlock>>>(g);
  else grouped_expert_linear_kernel<0><<<grid, 32 * kWarpsPerBlock>>>(g);
}

}  // namespace sparrow::cuda
