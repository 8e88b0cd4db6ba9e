#include "core/quant.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace sparrow {

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;  // 0x7E = exponent 15, mantissa 6 = 448
  if (a < 0x1p-6f) {
    // Subnormal range: multiples of 2^-9. a * 512 is exact and nearbyint rounds to nearest even;
    // n = 8 is the smallest normal, whose code is also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: round the 23-bit fp32 mantissa to 3 bits, nearest even (a carry into the exponent is
  // the correct result), then rebias the exponent from 127 to 7. a < 448 keeps the result <= 448.
  uint32_t u = f32_to_bits(a);
  u += 0x7FFFFu + ((u >> 20) & 1u);
  const uint32_t exp_field = (u >> 23) - 127 + 7;  // 1..15
  return sign | static_cast<uint8_t>(exp_field << 3 | ((u >> 20) & 7u));
}

uint8_t f32_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7). At a midpoint the even code wins, so the
  // comparison is <= when the lower neighbour's code is even and < when it is odd.
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

uint8_t e8m0_from_exponent(int k) {
  SPARROW_CHECK(k >= -127 && k <= 127);
  return static_cast<uint8_t>(k + 127);
}

int pow2_scale_exponent(float amax, float qmax) {
  SPARROW_CHECK(amax >= 0.0f && std::isfinite(amax) && qmax > 0.0f);
  if (amax == 0.0f) return 0;
  const float q = amax / qmax;
  if (q == 0.0f) return -127;  // underflowed: 2^-127 is as close as e8m0 gets
  if (std::isinf(q)) return 127;  // overflowed: clamped to the largest scale
  // q = m * 2^e, m in [0.5, 1): q is a power of two iff m == 0.5, and then log2 q = e - 1 exactly.
  int e = 0;
  const float m = std::frexp(q, &e);
  const int k = m == 0.5f ? e - 1 : e;
  return std::clamp(k, -127, 127);
}

int fp8_pow2_block_encode(const float* x, int64_t n, uint8_t* codes) {
  float amax = 1e-4f;  // the reference's floor: an all-zero block still gets a finite scale
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int k = pow2_scale_exponent(amax, kE4m3Max);
  const float s = std::ldexp(1.0f, k);
  for (int64_t i = 0; i < n; ++i) codes[i] = f32_to_e4m3(std::clamp(x[i] / s, -kE4m3Max, kE4m3Max));
  return k;
}

}  // namespace sparrow
