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

}  // namespace sparrow::cuda
