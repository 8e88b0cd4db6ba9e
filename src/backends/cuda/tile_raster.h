// The order in which the TMA GEMM kernels' persistent blocks take their output tiles
// (kernels_linear.cu: fp8_linear_tma_kernel, bf16_linear_tma_kernel). Included by the kernels and
// by the host tests (no GPU needed to check that every tile is taken once).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARROW_RASTER_HD __host__ __device__
#else
#define SPARROW_RASTER_HD
#endif

namespace sparrow::cuda {

// Tile `tile` of token_tiles x weight_tiles as (token tile m, weight tile n). With group > 1 the
// weight tiles go in groups of `group` (the last one narrower), a group's tiles token tile by token
// tile, each token tile's group of weight tiles in a row: the persistent blocks' wave then spans
// few weight tiles' and few token tiles' bytes (L2 reuse of both), where a weight tile's token tiles
// in a row (group 0 or 1) read all of the activations again for every second or third weight tile
// at 8192 rows. Every tile's arithmetic is the same either way: the same bits.
SPARROW_RASTER_HD inline void tma_tile_at(int tile, int token_tiles, int weight_tiles, int group, int& m, int& n) {
  if (group > 1) {
    const int span = group * token_tiles, first = (tile / span) * group, in = tile % span;
    const int left = weight_tiles - first, width = group < left ? group : left;
    m = in / width, n = first + in % width;
  } else {
    m = tile % token_tiles, n = tile / token_tiles;
  }
}

// The group the kernels take unless one is set (set_tma_raster_group, SPARROW_CUDA_TMA_RASTER_GROUP),
// from the bytes of activations one weight tile reads (rows x K, the element's size): 8 past 24 MiB,
// else 1 (a weight tile's token tiles in a row). Measured on an H200 (2026-12-04, ncu of a CSA
// layer's 8K prefill): where the activations pass about half of the 50 MB L2 the default order
// reads them from HBM once a wave (wo_a's bf16 GEMM, 64 MB a weight tile: 2.87 GB read, 1.00 ms;
// in groups of 8, 0.70 GB and 0.79 ms; wo_b 0.55 -> 0.52 ms; wq_a, wkv and the shared expert's w1,
// 32 MB, 2-4 % faster), while below it they stay in L2 and the groups only cost (wq_b, 8 MB: 0.69 ->
// 0.74 ms in groups of 8; the shared w2, 16 MB, the same either way).
constexpr int64_t kTmaRasterAutoBytes = int64_t{24} << 20;
SPARROW_RASTER_HD inline int tma_raster_auto(int64_t activation_bytes) {
  return activation_bytes > kTmaRasterAutoBytes ? 8 : 1;
}

}  // namespace sparrow::cuda
