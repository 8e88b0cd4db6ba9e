#include "core/quant_sim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace sparrow {

std::optional<KeyPrecision> key_precision_from_name(std::string_view name) {
  if (name == "fp32") return KeyPrecision::kF32;
  if (name == "bf16") return KeyPrecision::kBf16;
  if (name == "fp8") return KeyPrecision::kFp8;
  if (name == "fp4") return KeyPrecision::kFp4;
  return std::nullopt;
}

const char* key_precision_name(KeyPrecision p) {
  switch (p) {
    case KeyPrecision::kF32: return "fp32";
    case KeyPrecision::kBf16: return "bf16";
    case KeyPrecision::kFp8: return "fp8";
    case KeyPrecision::kFp4: return "fp4";
  }
  return "?";
}

void simulate_key_precision(float* x, int64_t n, KeyPrecision p) {
  switch (p) {
    case KeyPrecision::kF32:
      return;
    case KeyPrecision::kBf16:
      for (int64_t i = 0; i < n; ++i) x[i] = bf16_round(x[i]);
      return;
    case KeyPrecision::kFp8: {
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
      if (amax == 0) return;
      const float s = amax / kE4m3Max;
      for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(f32_to_e4m3(x[i] / s)) * s;
      return;
    }
    case KeyPrecision::kFp4:
      fp4_pow2_quant_sim(x, n);
      return;
  }
}

void fp8_pow2_quant_sim(float* x, int64_t n, int64_t block) {
  // (The blocks used are 64 and 128: their codes on the stack, no allocation on the CPU's act_quant path.)
  std::array<uint8_t, 128> small{};
  std::vector<uint8_t> large(block > 128 ? static_cast<size_t>(std::min(n, block)) : 0);
  uint8_t* const codes = block > 128 ? large.data() : small.data();
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = std::min(n, b + block);
    const float s = std::ldexp(1.0f, fp8_pow2_block_encode(x + b, e - b, codes));
    for (int64_t i = b; i < e; ++i) x[i] = e4m3_to_f32(codes[i - b]) * s;
  }
}

void fp4_pow2_quant_sim(float* x, int64_t n) {
  constexpr int64_t kBlock = 32;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    // The reference floors amax at 6 * 2^-126 so an all-zero block gets a finite scale.
    float amax = kE2m1Max * std::ldexp(1.0f, -126);
    for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = std::ldexp(1.0f, pow2_scale_exponent(amax, kE2m1Max));
    for (int64_t i = b; i < e; ++i) x[i] = e2m1_to_f32(f32_to_e2m1(std::clamp(x[i] / s, -kE2m1Max, kE2m1Max))) * s;
  }
}

void hadamard_transform(float* x, int64_t n) {
  SPARROW_CHECK(n > 0 && (n & (n - 1)) == 0);
  // In-place butterflies in fp64, then one scale: the result is the exact product rounded once.
  std::vector<double> v(x, x + n);
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const double scale = 1.0 / std::sqrt(static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(v[i] * scale);
}

void bf16_round_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_round(x[i]);
}

}  // namespace sparrow
