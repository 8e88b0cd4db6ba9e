#include "core/dtype.h"

#include <cmath>
#include <limits>

namespace sparrow {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kF8E8M0: return 1;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kTable[] = {{"F32", DType::kF32},         {"F16", DType::kF16},        {"BF16", DType::kBF16},
                {"F8_E4M3", DType::kF8E4M3}, {"F8_E8M0", DType::kF8E8M0}, {"I8", DType::kI8},
                {"U8", DType::kU8},           {"I32", DType::kI32},        {"I64", DType::kI64}};
  for (const auto& e : kTable)
    if (e.name == name) return e.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // subnormal: man * 2^-24
  } else if (exp == 31) {
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

float e4m3_to_f32(uint8_t b) {
  const bool neg = b & 0x80;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    v = std::ldexp(static_cast<float>(man | 8u), static_cast<int>(exp) - 10);  // (1+man/8)*2^(e-7)
  }
  return neg ? -v : v;
}

float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return std::numeric_limits<float>::quiet_NaN();
  // 2^(e-127); e = 0 gives 2^-127, a float subnormal, still exact.
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

}  // namespace sparrow
