// Helpers of the CUDA backend tests: stored test weights in every checkpoint dtype, seeded random
// values, and the CUDA backend or a clean skip when no GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/compare.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "runtime/backend_factory.h"

namespace sparrow::cuda_test {

// The CUDA backend, or null with the reason in `why` (no device: the test skips).
// SPARROW_CUDA_TESTS_ON_CPU=1 substitutes a second CPU backend: a self-check of the test harness
// (inputs, edge cases, comparisons) on machines without a GPU.
inline std::unique_ptr<Backend> cuda_backend_or_null(std::string* why) {
  if (const char* env = std::getenv("SPARROW_CUDA_TESTS_ON_CPU"); env && std::string(env) == "1")
    return make_cpu_backend();
  auto be = backend_create("cuda");
  if (!be.is_ok()) {
    *why = be.status().to_string();
    return nullptr;
  }
  return std::move(be).value();
}

// Skips the calling test when no GPU is present.
#define SPARROW_REQUIRE_GPU(ptr)                                       \
  do {                                                                 \
    std::string why_;                                                  \
    ptr = ::sparrow::cuda_test::cuda_backend_or_null(&why_);           \
    if (!ptr) GTEST_SKIP() << "no GPU: " << why_;                      \
  } while (0)

// Skips the calling test unless `ptr` is the CUDA backend itself: a test of its own kernels, state
// or test support (under SPARROW_CUDA_TESTS_ON_CPU=1 `ptr` is a CPU backend).
#define SPARROW_SKIP_UNLESS_CUDA(ptr)                                                          \
  do {                                                                                         \
    if (std::string((ptr)->name()) != "cuda") GTEST_SKIP() << "needs the CUDA backend itself"; \
  } while (0)

// SPARROW_REQUIRE_GPU, then SPARROW_SKIP_UNLESS_CUDA.
#define SPARROW_REQUIRE_CUDA(ptr) \
  do {                            \
    SPARROW_REQUIRE_GPU(ptr);     \
    SPARROW_SKIP_UNLESS_CUDA(ptr); \
  } while (0)

inline std::filesystem::path fixtures_dir() {
  if (const char* env = std::getenv("SPARROW_FIXTURES_DIR"); env && *env) return env;
  return SPARROW_FIXTURES_DIR;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : rng_(seed) {}
  std::vector<float> normal(int64_t n, double std = 1.0, double mean = 0.0) {
    std::normal_distribution<double> d(mean, std);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(d(rng_));
    return v;
  }
  std::vector<float> uniform(int64_t n, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(d(rng_));
    return v;
  }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  std::vector<uint8_t> bytes(int64_t n, int lo = 0, int hi = 255) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(integer(lo, hi));
    return v;
  }

 private:
  std::mt19937_64 rng_;
};

// Bytes of one stored tensor and a view onto them. Copies share the bytes, so views stay valid.
struct Stored {
  std::shared_ptr<std::vector<uint8_t>> bytes;
  TensorView view;
};

inline Stored stored_raw(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> raw) {
  Stored s;
  s.bytes = std::make_shared<std::vector<uint8_t>>(std::move(raw));
  s.view.name = "test";
  s.view.dtype = dtype;
  s.view.shape = std::move(shape);
  s.view.data = s.bytes->data();
  s.view.nbytes = s.bytes->size();
  return s;
}

// Float values stored as F32 or BF16 (rounded to nearest even).
inline Stored stored_floats(DType dtype, std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint8_t> raw;
  if (dtype == DType::kF32) {
    raw.resize(v.size() * 4);
    std::memcpy(raw.data(), v.data(), raw.size());
  } else {
    EXPECT_EQ(dtype, DType::kBF16);
    raw.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(raw.data() + 2 * i, &h, 2);
    }
  }
  return stored_raw(dtype, std::move(shape), std::move(raw));
}

inline Stored stored_ints(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  std::vector<uint8_t> raw(v.size() * (dtype == DType::kI64 ? 8 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kI64) {
      std::memcpy(raw.data() + 8 * i, &v[i], 8);
    } else {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(raw.data() + 4 * i, &x, 4);
    }
  }
  return stored_raw(dtype, std::move(shape), std::move(raw));
}

// A weight matrix and the storage its views point into.
struct StoredMatrix {
  Stored data, scale;
  WeightMatrix w;
};

inline StoredMatrix float_matrix(DType dtype, int64_t out, int64_t in, const std::vector<float>& v) {
  StoredMatrix m;
  m.data = stored_floats(dtype, {out, in}, v);
  m.w.format = WeightFormat::kFloat;
  m.w.out = out;
  m.w.in = in;
  m.w.data = m.data.view;
  return m;
}

// F16 with random finite bit patterns of moderate exponent (|v| within about 2^-6 .. 2^2).
inline StoredMatrix f16_matrix(Rng& rng, int64_t out, int64_t in) {
  std::vector<uint8_t> raw(out * in * 2);
  for (int64_t i = 0; i < out * in; ++i) {
    const uint16_t h = static_cast<uint16_t>((rng.integer(0, 1) << 15) | (rng.integer(9, 16) << 10) | rng.integer(0, 1023));
    std::memcpy(raw.data() + 2 * i, &h, 2);
  }
  StoredMatrix m;
  m.data = stored_raw(DType::kF16, {out, in}, std::move(raw));
  m.w.format = WeightFormat::kFloat;
  m.w.out = out;
  m.w.in = in;
  m.w.data = m.data.view;
  return m;
}

// FP8 e4m3 with one scale per [bo, bi] tile (partial edge tiles when the sizes do not divide).
// Codes are random non-NaN bytes with exponent field <= max_exp; e8m0 scales in [slo, shi], or F32.
inline StoredMatrix fp8_matrix(Rng& rng, int64_t out, int64_t in, int64_t bo, int64_t bi, DType scale_dtype,
                               int max_exp = 10, int slo = 118, int shi = 124) {
  std::vector<uint8_t> codes(out * in);
  for (auto& c : codes) c = static_cast<uint8_t>((rng.integer(0, 1) << 7) | (rng.integer(0, max_exp) << 3) | rng.integer(0, 7));
  for (auto& c : codes)
    if ((c & 0x7f) == 0x7f) c = 0;
  const int64_t so = (out + bo - 1) / bo, si = (in + bi - 1) / bi;
  StoredMatrix m;
  m.data = stored_raw(DType::kF8E4M3, {out, in}, std::move(codes));
  if (scale_dtype == DType::kF8E8M0) {
    m.scale = stored_raw(DType::kF8E8M0, {so, si}, rng.bytes(so * si, slo, shi));
  } else {
    std::vector<float> s = rng.uniform(so * si, 0.002, 0.02);
    m.scale = stored_floats(DType::kF32, {so, si}, s);
  }
  m.w = {.format = WeightFormat::kFp8Block, .out = out, .in = in, .data = m.data.view, .scale = m.scale.view,
         .block_out = bo, .block_in = bi};
  return m;
}

// Packed e2m1 (every nibble value) with e8m0 scales per 1 x 32 inputs in [slo, shi].
inline StoredMatrix fp4_matrix(Rng& rng, int64_t out, int64_t in, int slo = 121, int shi = 126) {
  StoredMatrix m;
  m.data = stored_raw(DType::kI8, {out, in / 2}, rng.bytes(out * in / 2));
  m.scale = stored_raw(DType::kF8E8M0, {out, in / 32}, rng.bytes(out * (in / 32), slo, shi));
  m.w = {.format = WeightFormat::kFp4Packed, .out = out, .in = in, .data = m.data.view, .scale = m.scale.view,
         .block_out = 1, .block_in = 32};
  return m;
}

// fp32 arithmetic against the fp64-accumulating reference. expect_close adds kAtolOfMax * max|ref|
// to atol whenever rtol > 0: an element that is a sum with cancellation carries the rounding of
// its terms, which scale with the tensor, not with the element.
inline constexpr Tolerance kOpTol{.atol = 1e-6, .rtol = 1e-4, .max_cosine_distance = 1e-9};
inline constexpr Tolerance kExact{.atol = 0, .rtol = 0};
inline constexpr double kAtolOfMax = 1e-5;

inline void expect_close(Backend& gpu, const Tensor& got, Backend& cpu, const Tensor& ref, const Tolerance& tol,
                         const std::string& what) {
  const std::vector<float> g = gpu.download_f32(got), r = cpu.download_f32(ref);
  Tolerance t = tol;
  if (t.rtol > 0) {
    double mx = 0;
    for (float v : r)
      if (std::isfinite(v)) mx = std::max(mx, static_cast<double>(std::fabs(v)));
    t.atol += kAtolOfMax * mx;
  }
  const CompareResult c = compare_f32(g, r, t, ref.shape());
  EXPECT_TRUE(c.ok) << what << ": " << c.message << " (" << c.summary() << ")";
}

}  // namespace sparrow::cuda_test
