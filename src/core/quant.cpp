#include "core/quant.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace sparrow {

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;  // 0x7E = exponent 15, mantissa 6 = 448
  // a = m * 2^e with m in [0.5, 1): floor(log2 a) = e - 1. Below 2^-6 the spacing stays 2^-9
  // (subnormals); otherwise 3 mantissa bits give a spacing of 2^(floor(log2 a) - 3).
  int e = 0;
  std::frexp(a, &e);
  const int quantum_exp = std::max(e - 1, -6) - 3;
  // Scaling by a power of two is exact here (a >= 2^-149 and the result is at most 16), so the
  // only rounding is nearbyint's, which rounds to nearest even in the default mode.
  const float n = std::nearbyint(std::ldexp(a, -quantum_exp));
  const float v = std::ldexp(n, quantum_exp);  // the rounded magnitude, <= 448 since a < 448
  if (v == 0.0f) return sign;
  if (v < 0x1p-6f) return sign | static_cast<uint8_t>(n);  // subnormal: v = man * 2^-9, man 1..7
  int ve = 0;
  std::frexp(v, &ve);
  const int exp_field = ve - 1 + 7;                          // bias 7, 1..15
  const int man = static_cast<int>(std::ldexp(v, -(ve - 1) + 3)) - 8;  // v / 2^(E-3) in [8, 16)
  return sign | static_cast<uint8_t>(exp_field << 3 | man);
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

}  // namespace sparrow
