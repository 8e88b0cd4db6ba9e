// Element types of checkpoint tensors and their scalar codecs.
//
// Codecs are exact: bf16/f16/e4m3/e8m0 decode to the float they denote; bf16 encode rounds to
// nearest even. Quantised formats (e4m3 blocks, packed e2m1) are decoded by the weight readers in
// src/model; these are the per-element building blocks they use.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sparrow {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kF8E8M0, kI8, kU8, kI32, kI64 };

// Bytes per element as stored.
size_t dtype_size(DType t);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; nullopt for anything unknown.
std::optional<DType> dtype_from_name(std::string_view name);

inline float f32_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);

// OCP FP8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; 0x7F/0xFF are NaN;
// max finite 448.
float e4m3_to_f32(uint8_t b);
// UE8M0 scale byte: 2^(e-127); 0xFF is NaN.
float e8m0_to_f32(uint8_t e);
// Packed FP4 e2m1 nibble (bits 0..3): magnitudes {0,0.5,1,1.5,2,3,4,6}, sign in bit 3.
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 7];
  return (nibble & 8) ? -m : m;
}

}  // namespace sparrow
