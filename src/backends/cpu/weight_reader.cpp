#include "backends/cpu/weight_reader.h"

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

void float_row(const WeightMatrix& w, int64_t row, float* dst) {
  const int64_t base = row * w.in;
  switch (w.data.dtype) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(w.data.data) + base, sizeof(float) * w.in);
      return;
    case DType::kBF16: {
      const auto* src = static_cast<const uint16_t*>(w.data.data) + base;
      for (int64_t i = 0; i < w.in; ++i) dst[i] = bf16_to_f32(src[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < w.in; ++i) dst[i] = load_float(w.data, base + i);
      return;
  }
}

// FP8 e4m3 with one scale per [block_out, block_in] tile; partial edge tiles allowed.
void fp8_row(const WeightMatrix& w, int64_t row, float* dst) {
  const auto* src = static_cast<const uint8_t*>(w.data.data) + row * w.in;
  const int64_t scale_cols = w.scale.dim(1);
  const int64_t srow = row / w.block_out;
  for (int64_t i = 0; i < w.in; ++i) {
    const float s = load_float(w.scale, srow * scale_cols + i / w.block_in);
    dst[i] = e4m3_to_f32(src[i]) * s;
  }
}

// Packed e2m1: byte j of a row holds input 2j in its low nibble and 2j+1 in its high nibble;
// one scale per 1 x block_in run of inputs.
void fp4_row(const WeightMatrix& w, int64_t row, float* dst) {
  const auto* src = static_cast<const uint8_t*>(w.data.data) + row * (w.in / 2);
  const int64_t scale_cols = w.scale.dim(1);
  for (int64_t j = 0; j < w.in / 2; ++j) {
    const uint8_t b = src[j];
    const int64_t i0 = 2 * j;
    const float s = load_float(w.scale, row * scale_cols + i0 / w.block_in);
    dst[i0] = e2m1_to_f32(b & 0xf) * s;
    dst[i0 + 1] = e2m1_to_f32(b >> 4) * s;
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
