// The CPU backend's linear_fp8_block, the reference twin of the CUDA FP8 block-scaled GEMM
// (tests/backends/cuda/cuda_fp8_test.cpp compares the two on a GPU): it must be the product of the
// act_quant_fp8-quantised input and the weight dequantised from its e4m3 codes and 128x128 block
// scales, summed in fp64 and rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/compare.h"
#include "core/dtype.h"
#include "core/quant_sim.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace sparrow {
namespace {

TEST(CpuFp8Linear, IsTheQuantisedInputTimesTheDequantisedWeight) {
  std::mt19937_64 rng(701);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> byte(0, 255), scale_byte(118, 124);
  auto be = make_cpu_backend();
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 200, 129}, {7, 300, 64}, {3, 128, 257}}) {
    const int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
    std::vector<uint8_t> codes(N * K), scales(nb * kb);
    for (auto& c : codes) {
      c = static_cast<uint8_t>(byte(rng));
      if ((c & 0x7f) == 0x7f) c = 0;  // no NaN codes
    }
    for (auto& s : scales) s = static_cast<uint8_t>(scale_byte(rng));
    const WeightMatrix w{
        .format = WeightFormat::kFp8Block, .out = N, .in = K,
        .data = {.name = "w", .dtype = DType::kF8E4M3, .shape = {N, K}, .data = codes.data(), .nbytes = codes.size()},
        .scale = {.name = "s", .dtype = DType::kF8E8M0, .shape = {nb, kb}, .data = scales.data(), .nbytes = scales.size()},
        .block_out = 128, .block_in = 128};
    std::vector<float> x(M * K);
    for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(normal(rng) * std::ldexp(1.0, static_cast<int>(i % 5)));

    // The expected product, written out: x quantised per row in blocks of 128, W = e4m3 * scale.
    std::vector<float> xq(x);
    for (int64_t m = 0; m < M; ++m) fp8_pow2_quant_sim(xq.data() + m * K, K, 128);
    std::vector<float> want(M * N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += static_cast<double>(xq[m * K + k]) *
                 (e4m3_to_f32(codes[n * K + k]) * e8m0_to_f32(scales[(n / 128) * kb + k / 128]));
        want[m * N + n] = static_cast<float>(acc);
      }

    const Tensor in = be->upload_f32(x, {M, K}), out = be->alloc(ElemType::kF32, {M, N});
    be->linear_fp8_block({.out = out, .in = in, .weight = &w});
    const CompareResult c = compare_f32(be->download_f32(out), want, {.atol = 0, .rtol = 0}, {M, N});
    EXPECT_TRUE(c.ok) << "M=" << M << " K=" << K << " N=" << N << ": " << c.message;
  }
}

}  // namespace
}  // namespace sparrow
