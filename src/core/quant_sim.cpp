#include "core/quant_sim.h"

#include <algorithm>
#include <cmath>

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
    case KeyPrecision::kFp4: {
      constexpr int64_t kBlock = 32;
      for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t e = std::min(n, b + kBlock);
        // The reference floors amax at 6 * 2^-126 so an all-zero block gets a finite scale.
        float amax = 6.0f * std::ldexp(1.0f, -126);
        for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float s = std::ldexp(1.0f, pow2_scale_exponent(amax, kE2m1Max));
        for (int64_t i = b; i < e; ++i) x[i] = e2m1_to_f32(f32_to_e2m1(std::clamp(x[i] / s, -6.0f, 6.0f))) * s;
      }
      return;
    }
  }
}

}  // namespace sparrow
