// Linear layers over weights in their checkpoint formats (float, FP8 block-scaled, packed FP4),
// dequantised element by element as they are read. One warp per output row n and a tile of up to
// kTokenTile tokens: the lanes stride over K, so each weight element is decoded once per tile and
// the reduction order is fixed (a token's result does not depend on the other tokens).
#include "backends/cuda/device_common.cuh"

namespace sparrow::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kTokenTile = 8;

// grid (ceil(N / kWarpsPerBlock), ceil(T / kTokenTile)), block (32 * kWarpsPerBlock).
__global__ void linear_kernel(LinearArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= a.w.out) return;  // the whole warp leaves together
  const int64_t K = a.w.in;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokenTile;
  const int64_t nt = a.T - t0 < kTokenTile ? a.T - t0 : kTokenTile;
  const int64_t col0 = (n / a.rows_per_group) * K;
  const float* x[kTokenTile];
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const int64_t t = t0 + (j < nt ? j : 0);
    const int64_t row = a.in_rows ? a.in_rows[t] : t;
    x[j] = a.in + row * a.in_stride + col0;
  }
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

}  // namespace

void launch_linear(const LinearArgs& a) {
  if (a.T == 0 || a.w.out == 0) return;
  const dim3 grid(blocks_for(a.w.out, kWarpsPerBlock), blocks_for(a.T, kTokenTile));
  linear_kernel<<<grid, 32 * kWarpsPerBlock>>>(a);
}

}  // namespace sparrow::cuda
