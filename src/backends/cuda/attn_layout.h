// How the tensor-core attention's blocks share a token's work (kernels_attention.cu,
// attention_mma_kernel). Included by the kernels and by the host tests (no GPU needed to check that
// every output dimension is made once).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARROW_ATTN_HD __host__ __device__
#else
#define SPARROW_ATTN_HD
#endif

namespace sparrow::cuda {

// The weighted sum's dims come in pairs of n8 tiles (16 dims; `pairs` = Dh / 16 in all). A block of
// slice `slice` of `slices` (the grid's z) makes pairs [slice pairs / slices, + pairs /
// slices); its `warps` weighted-sum warps take them in order, `count` each from `first`, the first
// (pairs / slices) % warps of them one more. REQUIRES pairs % slices == 0, 0 <= slice < slices;
// warp_index < 0 (a warp that makes no weighted sum) gets none.
SPARROW_ATTN_HD inline void attention_pv_pairs(int pairs, int slices, int slice, int warp_index, int warps, int& first,
                                               int& count) {
  const int here = pairs / slices, each = here / warps, extra = here % warps;
  if (warp_index < 0) {
    first = slice * here, count = 0;
    return;
  }
  count = each + (warp_index < extra ? 1 : 0);
  first = slice * here + warp_index * each + (warp_index < extra ? warp_index : extra);
}

// The dim slices the launch gives a call of `blocks` 16-head blocks (each a token's 16 heads over a
// split) on `sms` SMs when none is forced: the most of 4 and 2 that keeps the blocks within the SMs
// (one 16-warp block an SM), else 1.
SPARROW_ATTN_HD inline int attention_dim_slices_for(int64_t blocks, int64_t sms) {
  return 4 * blocks <= sms ? 4 : 2 * blocks <= sms ? 2 : 1;
}

}  // namespace sparrow::cuda
