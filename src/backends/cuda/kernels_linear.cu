// Linear layers over weights in their checkpoint formats (float, FP8 block-scaled, packed FP4),
// dequantised element by element as they are read. One warp per output row n and a tile of up to
// kTokenTile tokens: the lanes stride over K, so each weight element is decoded once per tile and
// the reduction order is fixed (a token's result does not depend on the other tokens).
#include <cstdint>

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

// One warp: output row n for the tokens t0 .. t0 + kTokenTile - 1 below a.T.
__device__ void linear_tile(const LinearArgs& a, int64_t n, int64_t t0, int lane) {
  const int64_t K = a.w.in;
  const float* x[kTokenTile];
  const int64_t nt = tile_inputs(a, n, t0, x);
  float acc[kTokenTile] = {};
  for (int64_t k = lane; k < K; k += 32) {
    const float w = weight_at(a.w, n, k);
#pragma unroll
    for (int j = 0; j < kTokenTile; ++j)
      if (j < nt) acc[j] += w * x[j][k];
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
template <int kPath>  // 0: element-wise, 1: vectorized FP8, 2: vectorized FP4
__device__ inline void tile(const LinearArgs& a, int64_t n, int64_t t0) {
  if constexpr (kPath == 0) linear_tile(a, n, t0, threadIdx.x % 32);
  else linear_vec_tile<kPath == 2>(a, n, t0, threadIdx.x % 32);
}

// The kernel path for a launch: element-wise unless the caller asked for and allows vectorized.
int kernel_path(bool vectorized, WeightFormat f) {
  static const bool on = cuda_feature_on("vec_linear");
  if (!vectorized || !on) return 0;
  return f == WeightFormat::kFp4Packed ? 2 : 1;
}

template <int kPath>
__global__ void linear_kernel(LinearArgs a) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= a.w.out) return;  // the whole warp leaves together
  tile<kPath>(a, n, static_cast<int64_t>(blockIdx.y) * kTokenTile);
}

// grid (ceil(N / kWarpsPerBlock), max_items), the same block: work item y = (expert, first row of
// its tile) from the plan; blocks past *n_items leave.
template <int kPath>
__global__ void grouped_expert_linear_kernel(GroupedExpertLinearArgs g) {
  const int64_t item = blockIdx.y;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= g.N) return;
  LinearArgs a{.out = g.out + r0 * g.N, .in = g.in_rows ? g.in : g.in + r0 * g.in_stride,
               .in_rows = g.in_rows ? g.in_rows + r0 : nullptr, .w = g.w[e], .T = R, .in_stride = g.in_stride,
               .rows_per_group = g.N};
  tile<kPath>(a, n, t0);
}

// Four e2m1 nibbles (the low nibble first) as four e4m3 bytes of the same values: magnitude index
// i = nibble & 7 is 0, 0.5, 1, 1.5, 2, 3, 4, 6; in e4m3 0.5 is 0x30 and (1 + m/2) 2^(e-1) for
// e = i >> 1 >= 1, m = i & 1 is exponent field e + 6, mantissa m << 2; the sign moves to bit 7.
__device__ inline uint32_t e2m1x4_to_e4m3x4(uint32_t nibbles) {
  uint32_t out = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t nib = (nibbles >> (4 * q)) & 0xfu, i = nib & 7u;
    const uint32_t mag = i == 0 ? 0u : i == 1 ? 0x30u : (((i >> 1) + 6u) << 3) | ((i & 1u) << 2);
    out |= (mag | ((nib & 8u) << 4)) << (8 * q);
  }
  return out;
}

// d = A (16 x 32, e4m3, row) x B (32 x 8, e4m3, col), fp32, from zero. A's a0/a2 and B's b0/b1 hold
// the same k's in the same byte order, so which k a register slot means in hardware does not matter.
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

// Lane l of a warp: g = l / 4 is its A row (tile row), its B column and its C row; t = l % 4 picks
// 4 of each 16 k's. Tile rows 8..15 of the m16 shape are never rows here (a1 = a3 = 0).
__global__ void grouped_w4a8_kernel(GroupedW4A8Args g) {
  const int64_t item = blockIdx.y;
  if (item >= *g.n_items) return;
  const int64_t e = g.items[2 * item], t0 = g.items[2 * item + 1];
  const int64_t r0 = g.offsets[e], R = g.offsets[e + 1] - r0;
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 32 + (threadIdx.x / 32) * 8;
  if (n0 >= g.N) return;  // the whole warp leaves together
  const DevWeight W = g.w[e];
  const DevView wscale{W.scale, W.scale_dtype};
  // This lane's A row (tile row gid) and B column (n0 + gid).
  const int64_t tr = t0 + gid;
  const bool row_ok = tr < R;
  const int64_t src = row_ok ? (g.in_rows ? g.in_rows[r0 + tr] : r0 + tr) : 0;
  const uint8_t* arow = g.codes + src * g.k_pad;
  const int64_t nb = n0 + gid;
  const bool col_ok = nb < g.N;
  const uint8_t* wrow = static_cast<const uint8_t*>(W.data) + (col_ok ? nb : 0) * (g.K / 2);
  // This lane's C columns n0 + 2 tig, n0 + 2 tig + 1 (row gid).
  const int64_t nc0 = n0 + 2 * tig, nc1 = nc0 + 1;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int64_t kb = 0; kb < g.K / 32; ++kb) {
    const int64_t k0 = kb * 32;
    const uint32_t a0 = row_ok ? *reinterpret_cast<const uint32_t*>(arow + k0 + 4 * tig) : 0u;
    const uint32_t a2 = row_ok ? *reinterpret_cast<const uint32_t*>(arow + k0 + 16 + 4 * tig) : 0u;
    const uint32_t w0 = col_ok ? *reinterpret_cast<const uint16_t*>(wrow + (k0 + 4 * tig) / 2) : 0u;
    const uint32_t w1 = col_ok ? *reinterpret_cast<const uint16_t*>(wrow + (k0 + 16 + 4 * tig) / 2) : 0u;
    float d[4];
    mma_e4m3_16x8x32(d, a0, 0u, a2, 0u, e2m1x4_to_e4m3x4(w0), e2m1x4_to_e4m3x4(w1));
    if (row_ok) {
      const float sa = g.scales[(k0 / 128) * g.rows_pad + src];
      if (nc0 < g.N) acc0 += d[0] * (sa * dev_load(wscale, nc0 * W.scale_cols + kb));
      if (nc1 < g.N) acc1 += d[1] * (sa * dev_load(wscale, nc1 * W.scale_cols + kb));
    }
  }
  if (row_ok) {
    float* out = g.out + (r0 + tr) * g.N;
    if (nc0 < g.N) out[nc0] = acc0;
    if (nc1 < g.N) out[nc1] = acc1;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  const int path = kernel_path(a.vectorized && linear_vectorizable(a), a.w.format);
  if (path == 2) linear_kernel<2><<<grid, 32 * kWarpsPerBlock>>>(a);
  else if (path == 1) linear_kernel<1><<<grid, 32 * kWarpsPerBlock>>>(a);
  else linear_kernel<0><<<grid, 32 * kWarpsPerBlock>>>(a);
  return path != 0;
}

void launch_grouped_w4a8(const GroupedW4A8Args& g) {
  if (g.max_items == 0 || g.N == 0) return;
  grouped_w4a8_kernel<<<dim3(blocks_for(g.N, 32), static_cast<unsigned>(g.max_items)), 128>>>(g);
}

void launch_grouped_expert_linear(const GroupedExpertLinearArgs& g) {
  if (g.max_items == 0 || g.N == 0) return;
  const dim3 grid(blocks_for(g.N, kWarpsPerBlock), static_cast<unsigned>(g.max_items));
  const int path = kernel_path(g.vectorized, g.format);
  if (path == 2) grouped_expert_linear_kernel<2><<<grid, 32 * kWarpsPerBlock>>>(g);
  else if (path == 1) grouped_expert_linear_kernel<1><<<grid, 32 * kWarpsPerBlock>>>(g);
  else grouped_expert_linear_kernel<0><<<grid, 32 * kWarpsPerBlock>>>(g);
}

}  // namespace sparrow::cuda
