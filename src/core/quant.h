// Encoders for the released checkpoint formats (spec §2.2) and the power-of-two block scale.
//
// The decoders live in core/dtype.h; these are their inverses. Both encoders round to nearest,
// ties to even (the mantissa's last bit), like PyTorch's casts, and saturate instead of producing
// NaN: the reference clamps to ±qmax before it casts (spec §3.0.5, §3.0.7), so a saturating cast
// gives the same bytes. For every finite code c, f32_to_e4m3(e4m3_to_f32(c)) == c and
// f32_to_e2m1(e2m1_to_f32(c)) == c (signed zero included).
//
// Scales are powers of two chosen like the release (`scale_fmt = ue8m0`):
// s = 2^ceil(log2(amax / qmax)), so every |x / s| <= qmax and dividing by s is exact.
#pragma once

#include <cstdint>

namespace sparrow {

inline constexpr float kE4m3Max = 448.0f;  // largest finite OCP e4m3fn value
inline constexpr float kE2m1Max = 6.0f;    // largest e2m1 magnitude

// f32 -> OCP e4m3fn byte. |x| >= 448 (and ±inf) saturate to ±448; NaN gives 0x7F (0xFF if its sign
// bit is set). Values below the smallest subnormal (2^-9) round to a signed zero.
uint8_t f32_to_e4m3(float x);

// f32 -> e2m1 nibble (bits 0..3, sign in bit 3). |x| > 6 and ±inf saturate to ±6. e2m1 has no NaN:
// NaN encodes as +0, so callers must reject non-finite input themselves (the quantiser does).
uint8_t f32_to_e2m1(float x);

// UE8M0 byte of 2^k. REQUIRES -127 <= k <= 127 (0xFF, the NaN code, is never produced).
uint8_t e8m0_from_exponent(int k);

// k = ceil(log2(amax / qmax)) clamped to e8m0's range [-127, 127], so that 2^k is the smallest power
// of two with amax / 2^k <= qmax. amax / qmax is computed in fp32 as the reference does. An
// all-zero block (amax == 0) gets k = 0: any scale represents zeros exactly.
// REQUIRES amax >= 0 and finite, qmax > 0.
int pow2_scale_exponent(float amax, float qmax);

// One block of the reference's power-of-two FP8 quantisation (spec §3.0.5, §3.0.6) as codes:
// amax = max(|x|, 1e-4) (a NaN is skipped), k = pow2_scale_exponent(amax, 448),
// codes[i] = e4m3(clamp(x[i] / 2^k, ±448)) (a NaN keeps its code); returns k. REQUIRES every x
// finite or NaN. fp8_pow2_quant_sim's rounding and the KV record's bytes (core/kv_record.h).
int fp8_pow2_block_encode(const float* x, int64_t n, uint8_t* codes);

}  // namespace sparrow
