// The device layout of MXFP4 weights (WeightFormat::kFp4Packed): the released bytes with each
// 32-bit word's eight sign bits moved, so that the W4A8 tensor-core kernels need no permute to put
// a code's sign in its e5m2 byte's bit 7. Included by host code (the upload) and by the kernels.
//
// A row's word k (bytes 4k .. 4k + 3, little-endian) holds inputs 8k .. 8k + 7. As released, input
// j (0..7) is nibble j: magnitude bits (e2m1 exponent and mantissa) 4j .. 4j + 2, sign bit 4j + 3.
// On the device the magnitudes stay where they are and the sign bits (every nibble's bit 3) are
// re-assigned: input j < 4 has its sign at bit 8j + 7 (bit 3 of nibble 2j + 1), input 4 + j at bit
// 8j + 3 (bit 3 of nibble 2j). Then, for e5m2 bytes of inputs 0..3 in one word and 4..7 in
// another, the signs are `w & 0x80808080` and `(w << 4) & 0x80808080`: one logic operation and a
// shift where the released layout takes two byte permutes.
//
// The row order is tiled too where the weight allows it (fp4_tiles: rows a multiple of 64, a row's
// bytes a multiple of 64, i.e. in % 128 == 0, every routed expert): for each block of 64 rows and
// each group of 64 bytes (128 inputs, the W4A8 kernels' group), the 64 rows' 64 bytes lie together
// (4 KB, row r of the block at 64 r), the groups of a row block in order, the row blocks in order.
// A W4A8 decode block's slot (64 columns x one or two groups) is then one contiguous piece where
// the released order scatters it over 64 rows 1-2 KB apart. A block of 64 rows starts where it
// starts in the released order (64 rows x row_bytes either way); within it a row is 64 bytes from
// the next and a group 4 KB from the next (fp4_row_step, fp4_group_step), against row_bytes and 64.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARROW_FP4_HD __host__ __device__
#else
#define SPARROW_FP4_HD
#endif

namespace sparrow::cuda {

// Where input j's sign bit lies in a device word.
SPARROW_FP4_HD constexpr int fp4_device_sign_bit(int j) { return j < 4 ? 8 * j + 7 : 8 * (j - 4) + 3; }

// A released word in the device layout.
SPARROW_FP4_HD constexpr uint32_t fp4_word_to_device(uint32_t w) {
  uint32_t d = w & 0x77777777u;
  for (int j = 0; j < 8; ++j) d |= ((w >> (4 * j + 3)) & 1u) << fp4_device_sign_bit(j);
  return d;
}

// A device word back in the released layout (the readers other than the W4A8 tensor-core kernels).
// The signs of inputs 0..3 (bits 7, 15, 23, 31) and 4..7 (bits 3, 11, 19, 27) are each four bits
// 8 apart, gathered to 4 apart and placed at bits 3, 7, 11, 15 and 19, 23, 27, 31.
SPARROW_FP4_HD constexpr uint32_t fp4_word_released(uint32_t d) {
  uint32_t lo = (d >> 4) & 0x08080808u, hi = d & 0x08080808u;  // bits 3, 11, 19, 27
  lo = (lo | (lo >> 4)) & 0x00ff00ffu;                          // bits 3, 7, 19, 23
  hi = (hi | (hi >> 4)) & 0x00ff00ffu;
  lo = (lo | (lo >> 8)) & 0x0000ffffu;                          // bits 3, 7, 11, 15
  hi = (hi | (hi >> 8)) & 0x0000ffffu;
  return (d & 0x77777777u) | lo | (hi << 16);
}

// Whether a weight of `rows` rows of `row_bytes` bytes is stored tiled.
SPARROW_FP4_HD constexpr bool fp4_tiles(int64_t rows, int64_t row_bytes) {
  return rows > 0 && rows % 64 == 0 && row_bytes > 0 && row_bytes % 64 == 0;
}
// The bytes from one row to the next within a block of 64 rows, and from one group of 64 bytes
// to the next within a row.
SPARROW_FP4_HD constexpr int64_t fp4_row_step(bool tiled, int64_t row_bytes) { return tiled ? 64 : row_bytes; }
SPARROW_FP4_HD constexpr int64_t fp4_group_step(bool tiled) { return tiled ? 4096 : 64; }
// Where byte b of row n lies (row_bytes a row).
SPARROW_FP4_HD constexpr int64_t fp4_offset(bool tiled, int64_t row_bytes, int64_t n, int64_t b) {
  return (n / 64) * 64 * row_bytes + (n % 64) * fp4_row_step(tiled, row_bytes) + (b / 64) * fp4_group_step(tiled) + b % 64;
}

// fp4_offset(true, ..) inverted: the row n and byte b that the tiled order puts at byte o.
SPARROW_FP4_HD constexpr void fp4_tiled_source(int64_t row_bytes, int64_t o, int64_t& n, int64_t& b) {
  const int64_t block = o / (64 * row_bytes), in_block = o % (64 * row_bytes);
  n = 64 * block + (in_block % 4096) / 64;
  b = 64 * (in_block / 4096) + in_block % 64;
}

}  // namespace sparrow::cuda
