#include "backends/cpu/weight_reader.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace sparrow::cpu {

float load_float(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::kF8E8M0:
      return e8m0_to_f32(static_cast<const uint8_t*>(t.data)[i]);
    case DType::kF8E4M3:
      return e4m3_to_f32(static_cast<const uint8_t*>(t.data)[i]);
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
      break;
  }
  SPARROW_CHECK(false && "load_float on a non-float tensor (the weight table should have refused it)");
  return 0.0f;
}

namespace {

// Safetensors does not promise aligned data (a file may pack a BF16 tensor after an odd-sized
// one), so rows are read through byte pointers and memcpy, never through a cast pointer.
void float_row(const WeightMatrix& w, int64_t row, float* dst) {
  const int64_t base = row * w.in;
  const auto* bytes = static_cast<const uint8_t*>(w.data.data);
  switch (w.data.dtype) {
    case DType::kF32:
      std::memcpy(dst, bytes + 4 * base, sizeof(float) * w.in);
      return;
    case DType::kBF16: {
      const uint8_t* src = bytes + 2 * base;
      for (int64_t i = 0; i < w.in; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    default:
      for (int64_t i = 0; i < w.in; ++i) dst[i] = load_float(w.data, base + i);
      return;
  }
}

// Every e4m3 code's value (the same floats e4m3_to_f32 returns), so a row decodes by lookup.
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int c = 0; c < 256; ++c) v[c] = e4m3_to_f32(static_cast<uint8_t>(c));
  }
};
const E4m3Table kE4m3;

// FP8 e4m3 with one scale per [block_out, block_in] tile; partial edge tiles allowed. The scale is
// decoded once per tile (e8m0 bits or F32); each element is code value * scale, one fp32 rounding.
void fp8_row(const WeightMatrix& w, int64_t row, float* dst) {
  const auto* src = static_cast<const uint8_t*>(w.data.data) + row * w.in;
  const int64_t scale_cols = w.scale.dim(1);
  const int64_t srow = row / w.block_out;
  for (int64_t b = 0; b * w.block_in < w.in; ++b) {
    const float s = load_float(w.scale, srow * scale_cols + b);
    const int64_t end = std::min(w.in, (b + 1) * w.block_in);
    for (int64_t i = b * w.block_in; i < end; ++i) dst[i] = kE4m3.v[src[i]] * s;
  }
}

// Packed e2m1: byte j of a row holds input 2j in its low nibble and 2j+1 in its high nibble;
// one scale per 1 x block_in run of inputs (block_in is even: the loader requires 32).
void fp4_row(const WeightMatrix& w, int64_t row, float* dst) {
  const auto* src = static_cast<const uint8_t*>(w.data.data) + row * (w.in / 2);
  const int64_t scale_cols = w.scale.dim(1);
  for (int64_t b = 0; b * w.block_in < w.in; ++b) {
    const float s = load_float(w.scale, row * scale_cols + b);
    const int64_t end = std::min(w.in, (b + 1) * w.block_in) / 2;
    for (int64_t j = b * w.block_in / 2; j < end; ++j) {
      const uint8_t byte = src[j];
      dst[2 * j] = e2m1_to_f32(byte & 0xf) * s;
      dst[2 * j + 1] = e2m1_to_f32(byte >> 4) * s;
    }
  }
}

}  // namespace

void weight_row(const WeightMatrix& w, int64_t row, float* dst) {
  switch (w.format) {
    case WeightFormat::kFloat: return float_row(w, row, dst);
    case WeightFormat::kFp8Block: return fp8_row(w, row, dst);
    case WeightFormat::kFp4Packed: return fp4_row(w, row, dst);
  }
}

}  // namespace sparrow::cpu
