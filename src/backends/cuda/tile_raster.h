// The order in which the TMA GEMM kernels' persistent blocks take their output tiles
// (kernels_linear.cu: fp8_linear_tma_kernel, bf16_linear_tma_kernel). Included by the kernels and
// by the host tests (no GPU needed to check that every tile is taken once).
#pragma once

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

}  // namespace sparrow::cuda
