// The FP8 block-scaled linear (linear_fp8_block, the first brick of the `fast` profile) on the GPU
// against its CPU reference twin, and its activation quantisation against the CPU's bit for bit.
//
// Run on a GPU machine: sparrow_cuda_tests --gtest_filter='CudaFp8*' (docs/cuda.md). Each
// CudaFp8Linear test skips when no GPU is present; those that call CUDA test-support functions also
// skip under SPARROW_CUDA_TESTS_ON_CPU=1 (they need the real backend). CudaFp8Layout needs no GPU.
//
// Tolerances (got = GPU, ref = CPU twin, S[m,n] = sum_k |xq[m,k]| |w[n,k]| over the dequantised
// operands, computed in fp64 on the host):
// - Inputs with few significant bits (ExactInputs*): every product, block sum and block-scaled sum
//   is exact in fp32 and in any accumulator of >= 10 significant bits, so any summation order gives
//   the exact result: tolerance 0. These carry the plumbing checks (layouts, padding, scale mapping,
//   transposition).
// - Fallback kernel (fp32 FMA, lanes stride over K, then a 5-level warp tree): the classical bound
//   |err| <= (K/32 + 5) u S, u = 2^-24, plus the twin's own final rounding u|ref| <= u S:
//   c = (K/32 + 8) 2^-24.
// - Tensor cores (cuBLASLt): within each 128-input block Hopper's FP8 MMA accumulates with about 14
//   significant bits (the DeepSeek-V3 report: "around 14 bits"), promoted to fp32 at least once per
//   block (the scales are applied per block; FAST_ACCUM is off). A truncating 13-bit accumulator
//   loses at most 2^-13 of the running magnitude per step; on random data the per-block error is a
//   few 2^-13 |block sum| and the total stays below 2^-11 S. We assert c = 2^-9 S (4x margin) and
//   print the measured max |err| / S. (The adversarial worst case, one dominant product and 127
//   tiny ones truncated away, approaches 2^-6 S; random inputs are far from it.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "backends/cpu/weight_reader.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/fp8_linear.h"
#include "core/quant.h"
#include "core/quant_sim.h"
#include "cuda_test_util.h"

namespace sparrow {
namespace {

using namespace cuda_test;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

class CudaFp8Linear : public ::testing::Test {
 protected:
  void SetUp() override { SPARROW_REQUIRE_GPU(gpu); }

  // The real CUDA backend (not the CPU stand-in of SPARROW_CUDA_TESTS_ON_CPU=1).
  bool real_cuda() const { return std::string(gpu->name()) == "cuda"; }
  std::string path() const { return real_cuda() ? cuda::fp8_linear_last_path(*gpu) : "cpu stand-in"; }
  // The GPU's act_quant linear of rows t0 .. t0 + n - 1 of x [*, K] through w [N, K].
  std::vector<float> gpu_rows(const std::vector<float>& x, int64_t K, const WeightMatrix& w, int64_t t0, int64_t n) {
    const Tensor xg = gpu->upload_f32(std::vector<float>(x.begin() + t0 * K, x.begin() + (t0 + n) * K), {n, K});
    const Tensor og = gpu->alloc(ElemType::kF32, {n, w.out});
    gpu->linear({.out = og, .in = xg, .weight = &w, .act_quant_fp8 = true});
    return gpu->download_f32(og);
  }

  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
};

// ---- activation quantisation ---------------------------------------------------------------------

// Rows of `K` values with every edge the quantiser has: saturation (448 and values that round to or
// past it), round-to-even ties, e4m3 subnormals and values below them, fp32 subnormals, signed zero,
// all-zero blocks (the 1e-4 floor), power-of-two amax, a partial last block, NaN, and random rows of
// magnitudes from 1e-6 to 1e4.
std::vector<float> edge_rows(Rng& rng, int64_t rows, int64_t K) {
  std::vector<float> v(rows * K);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = v.data() + r * K;
    const double mag = std::pow(10.0, rng.uniform(1, -6.0, 4.0)[0]);
    const std::vector<float> n = rng.normal(K, mag);
    std::copy(n.begin(), n.end(), x);
    switch (r % 9) {
      case 0:  // a saturating block: amax 448 exactly (s = 1), ties at 444 (-> 448), 440, 446
        for (int64_t k = 0; k < std::min<int64_t>(K, 128); ++k) {
          const float edge[] = {448.0f, -448.0f, 444.0f, -446.0f, 447.99997f, 440.0f, 232.0f, 240.0f, 0.5f};
          x[k] = edge[k % 9];
        }
        break;
      case 1:  // amax just above 448 (s = 2: 449 / 2 = 224.5 -> 224) and a power-of-two amax
        x[0] = 449.0f;
        if (K > 128) x[128] = 0x1p-10f * 448.0f;
        break;
      case 2:  // all zeros, one negative zero
        std::fill(x, x + K, 0.0f);
        x[K / 2] = -0.0f;
        break;
      case 3:  // amax 448 with e4m3 subnormals and below: 2^-9, 2^-10 (tie -> 0), 3*2^-10 (tie -> 2^-8)
        for (int64_t k = 0; k < K; ++k) {
          const float tiny[] = {448.0f, 0x1p-9f, 0x1p-10f, 3 * 0x1p-10f, -0x1p-9f, 1e-30f, 1e-40f, -1e-40f, 0x1p-7f};
          x[k] = tiny[k % 9];
        }
        break;
      case 4:  // a NaN (and a negative one): skipped by amax, encoded as the NaN code with its sign
        x[K - 1] = std::numeric_limits<float>::quiet_NaN();
        if (K > 2) x[0] = -std::numeric_limits<float>::quiet_NaN();
        break;
      case 5:  // huge values (scale 2^119 region)
        for (int64_t k = 0; k < K; k += 3) x[k] = 3.0e38f * (k % 2 ? -1.0f : 1.0f);
        break;
      case 6:  // tiny values only: below the 1e-4 floor
        for (int64_t k = 0; k < K; ++k) x[k] *= 1e-9f;
        break;
      default:
        break;
    }
  }
  return v;
}

void check_act_quant(Backend& gpu, const std::vector<float>& values, DType dtype, int64_t rows, int64_t K,
                     const std::string& what) {
  // The rows as the device reads them (bf16 rounded first: its CPU reference is the decoded value).
  std::vector<float> host(values);
  std::vector<uint8_t> raw;
  if (dtype == DType::kBF16) {
    raw.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = f32_to_bf16(values[i]);
      std::memcpy(raw.data() + 2 * i, &h, 2);
      host[i] = bf16_to_f32(h);
    }
  } else {
    raw.resize(values.size() * 4);
    std::memcpy(raw.data(), values.data(), raw.size());
  }
  const int64_t rows_pad = round_up(rows, 16) + 16, k_pad = round_up(K, 128), nb = k_pad / 128;
  const cuda::ActQuantFp8Rows q = cuda::act_quant_fp8_rows(raw.data(), dtype, rows, K, rows_pad);
  ASSERT_EQ(q.k_pad, k_pad);
  ASSERT_EQ(static_cast<int64_t>(q.codes.size()), rows_pad * k_pad);
  ASSERT_EQ(static_cast<int64_t>(q.scales.size()), nb * rows_pad);
  int64_t bad = 0;
  std::ostringstream first;
  auto fail = [&](const std::string& m) {
    if (bad++ == 0) first << m;
  };
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> ref(host.begin() + r * K, host.begin() + (r + 1) * K);
    fp8_pow2_quant_sim(ref.data(), K, 128);  // the CPU's act_quant_fp8
    for (int64_t b = 0; b < nb; ++b) {
      // The scale rule, independently: 2^ceil(log2(max(1e-4, amax) / 448)).
      float amax = 1e-4f;
      for (int64_t k = b * 128; k < std::min(K, (b + 1) * 128); ++k) amax = std::max(amax, std::fabs(host[r * K + k]));
      const float s = std::ldexp(1.0f, pow2_scale_exponent(amax, kE4m3Max));
      const float got_s = q.scales[b * rows_pad + r];
      if (bits(got_s) != bits(s)) fail("row " + std::to_string(r) + " block " + std::to_string(b) + ": scale " +
                                       std::to_string(got_s) + ", want " + std::to_string(s));
    }
    for (int64_t k = 0; k < k_pad; ++k) {
      const uint8_t code = q.codes[r * k_pad + k];
      if (k >= K) {
        if (code != 0) fail("row " + std::to_string(r) + " padding column " + std::to_string(k) + " is not 0");
        continue;
      }
      const float got = e4m3_to_f32(code) * q.scales[(k / 128) * rows_pad + r];
      if (!same_float(got, ref[k]))
        fail("row " + std::to_string(r) + " col " + std::to_string(k) + ": x " + std::to_string(host[r * K + k]) +
             " -> code " + std::to_string(code) + " = " + std::to_string(got) + ", cpu " + std::to_string(ref[k]));
    }
  }
  for (int64_t r = rows; r < rows_pad; ++r) {
    for (int64_t k = 0; k < k_pad; ++k)
      if (q.codes[r * k_pad + k] != 0) fail("padding row " + std::to_string(r) + " has a nonzero code");
    for (int64_t b = 0; b < nb; ++b)
      if (q.scales[b * rows_pad + r] != 1.0f) fail("padding row " + std::to_string(r) + " has a scale other than 1");
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatches; first: " << first.str();
}

TEST_F(CudaFp8Linear, ActQuantIsTheCpuOneBitForBit) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  Rng rng(601);
  // (The last two have more than 2^17 (row, block) pairs with their padding rows: the many-pair
  // forms, a half-warp a pair from 2^15 (`act_quant_half`; off: four pairs a warp from 2^17); K % 8
  // != 0 in both, a row's last lane element by element.)
  for (auto [rows, K] : {std::pair<int64_t, int64_t>{1, 128}, {3, 200}, {37, 45}, {9, 1152}, {19, 300}, {2, 1},
                         {18, 257}, {300, 131}, {1030, 16300}, {1100, 15999}}) {
    const std::vector<float> v = edge_rows(rng, rows, K);
    for (DType dtype : {DType::kF32, DType::kBF16})
      check_act_quant(*gpu, v, dtype, rows, K,
                      std::string(dtype == DType::kF32 ? "f32" : "bf16") + " rows=" + std::to_string(rows) +
                          " K=" + std::to_string(K));
  }
}

// The W4A8 wgmma kernels' code order (ActQuantFp8Args::w4a8_order): within each block of 128, input
// 32 t + 8 i + r at 32 i + 4 t + r (r < 4) or 32 i + 16 + 4 t + r - 4; the same codes and scales as
// the plain layout otherwise, padding included.
TEST_F(CudaFp8Linear, ActQuantW4A8OrderPermutesEachBlock) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  Rng rng(602);
  // (The last two have more than 2^17 (row, block) pairs: the many-pair forms, act_quant_half's and
  // the four-pair kernel's.)
  for (auto [rows, K] : {std::pair<int64_t, int64_t>{3, 256}, {5, 200}, {1, 128}, {1030, 16300}, {1100, 15999}}) {
    const std::vector<float> v = edge_rows(rng, rows, K);
    const int64_t rows_pad = rows + 3;
    const cuda::ActQuantFp8Rows plain = cuda::act_quant_fp8_rows(v.data(), DType::kF32, rows, K, rows_pad);
    const cuda::ActQuantFp8Rows perm = cuda::act_quant_fp8_rows(v.data(), DType::kF32, rows, K, rows_pad, true);
    ASSERT_EQ(perm.codes.size(), plain.codes.size());
    EXPECT_EQ(perm.scales, plain.scales) << "rows " << rows << " K " << K;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows_pad; ++r)
      for (int64_t k = 0; k < plain.k_pad; ++k) {
        const int64_t b = k / 128, t = k % 128 / 32, i = k % 32 / 8, q = k % 8;
        const int64_t at = 128 * b + 32 * i + (q < 4 ? 4 * t + q : 16 + 4 * t + q - 4);
        bad += perm.codes[r * plain.k_pad + at] != plain.codes[r * plain.k_pad + k];
      }
    EXPECT_EQ(bad, 0) << "rows " << rows << " K " << K;
  }
}

TEST_F(CudaFp8Linear, ActQuantOfNoRows) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  // Zero rows: only padding is written.
  check_act_quant(*gpu, {}, DType::kF32, 0, 200, "rows=0");
}

// ---- the GEMM ------------------------------------------------------------------------------------

// S[m, n] = sum_k |xq[m, k]| |w[n, k]|, xq the CPU's quantised input, w the weight dequantised.
std::vector<double> abs_products(const std::vector<float>& x, const WeightMatrix& w, int64_t M) {
  const int64_t K = w.in, N = w.out;
  std::vector<float> xq(x);
  for (int64_t m = 0; m < M; ++m) fp8_pow2_quant_sim(xq.data() + m * K, K, 128);
  std::vector<double> S(M * N, 0.0);
  std::vector<float> row(K);
  for (int64_t n = 0; n < N; ++n) {
    cpu::weight_row(w, n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += std::fabs(static_cast<double>(xq[m * K + k]) * row[k]);
      S[m * N + n] = acc;
    }
  }
  return S;
}

struct BoundCheck {
  int64_t failures = 0, worst = -1;
  double worst_ratio = 0;  // max |got - ref| / S
  std::string report;
};

// |got - ref| <= c S element by element (NaN positions must match).
BoundCheck check_bound(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& S,
                       double c) {
  BoundCheck b;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(got[i])) {
      if (std::isnan(ref[i]) != std::isnan(got[i])) ++b.failures;
      continue;
    }
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double ratio = S[i] > 0 ? err / S[i] : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    if (err > c * S[i]) ++b.failures;
    if (ratio > b.worst_ratio || b.worst < 0) {
      b.worst_ratio = std::max(b.worst_ratio, ratio);
      b.worst = static_cast<int64_t>(i);
    }
  }
  std::ostringstream os;
  os << b.failures << " elements beyond " << c << " S; max |err|/S = " << b.worst_ratio;
  if (b.worst >= 0) os << " at " << b.worst << " (got " << got[b.worst] << ", ref " << ref[b.worst] << ", S " << S[b.worst] << ")";
  b.report = os.str();
  return b;
}

// Random odd shapes against the twin: a per-element bound for the path that ran (header comment),
// the shared comparator for the report and a cosine check, and the quantisation error against the
// plain fp32 linear printed (asserted only loosely).
void gemm_against_twin(Backend& cpu, Backend& gpu, bool real_cuda, bool force_fallback, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes;
  for (int64_t M : {1, 3, 37, 300})
    for (int64_t K : {128, 200, 1152})
      for (int64_t N : {64, 129, 1000}) shapes.emplace_back(M, K, N);
  shapes.emplace_back(2000, 1152, 129);  // prefill-sized M
  if (real_cuda) cuda::fp8_linear_force_fallback(gpu, force_fallback);
  std::ostringstream table;
  for (auto [M, K, N] : shapes) {
    // E8M0 scales, except F32 scales (V4-Flash-Base) on the N = 129 weights.
    const DType sdt = N == 129 ? DType::kF32 : DType::kF8E8M0;
    StoredMatrix w = fp8_matrix(rng, N, K, 128, 128, sdt);
    // Rows of different magnitudes, so the activation scales differ from row to row.
    std::vector<float> x = rng.normal(M * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) x[m * K + k] *= static_cast<float>(std::ldexp(1.0, static_cast<int>(m % 7) - 3));
    const Tensor xc = cpu.upload_f32(x, {M, K}), xg = gpu.upload_f32(x, {M, K});
    const Tensor oc = cpu.alloc(ElemType::kF32, {M, N}), og = gpu.alloc(ElemType::kF32, {M, N});
    const Tensor plain = cpu.alloc(ElemType::kF32, {M, N});
    cpu.linear_fp8_block({.out = oc, .in = xc, .weight = &w.w});
    gpu.linear_fp8_block({.out = og, .in = xg, .weight = &w.w});
    cpu.linear({.out = plain, .in = xc, .weight = &w.w});
    const std::string path = real_cuda ? cuda::fp8_linear_last_path(gpu) : "cpu stand-in";
    const bool tc = path.rfind("tensor cores", 0) == 0;
    if (force_fallback) {
      EXPECT_EQ(path.rfind("fallback", 0), 0u) << path;
    }
    const double c = tc ? std::ldexp(1.0, -9) : (static_cast<double>(K) / 32 + 8) * std::ldexp(1.0, -24);
    const std::vector<float> got = gpu.download_f32(og), ref = cpu.download_f32(oc), fp32 = cpu.download_f32(plain);
    const std::vector<double> S = abs_products(x, w.w, M);
    const std::string tag = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) + " [" +
                            path + "]";
    const BoundCheck b = check_bound(got, ref, S, c);
    EXPECT_EQ(b.failures, 0) << tag << ": " << b.report;
    double max_s = 0;
    for (double s : S) max_s = std::max(max_s, s);
    const CompareResult cr = compare_f32(got, ref, {.atol = c * max_s, .max_cosine_distance = 1e-6}, {M, N});
    EXPECT_TRUE(cr.ok) << tag << ": " << cr.message << " (" << cr.summary() << ")";
    // What FP8 costs against the fp32 linear: reported; asserted only as a sanity bound (e4m3 keeps
    // 3 mantissa bits, so each dequantised input is within 2^-4 of its value).
    const CompareResult q = compare_f32(ref, fp32, {.atol = 1e30}, {M, N});
    EXPECT_LT(q.rel_to_max, 0.25) << tag << " quantisation error: " << q.summary();
    table << "  " << tag << ": max|err|/S " << b.worst_ratio << ", vs twin rel_to_max " << cr.rel_to_max
          << ", fp8 vs fp32 linear rel_to_max " << q.rel_to_max << "\n";
  }
  if (real_cuda) cuda::fp8_linear_force_fallback(gpu, false);
  std::printf("linear_fp8_block%s against the CPU twin:\n%s", force_fallback ? " (forced fallback)" : "",
              table.str().c_str());
}

TEST_F(CudaFp8Linear, GemmMatchesCpuTwinOnOddShapes) { gemm_against_twin(*cpu, *gpu, real_cuda(), false, 611); }

TEST_F(CudaFp8Linear, FallbackMatchesCpuTwinOnOddShapes) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  gemm_against_twin(*cpu, *gpu, true, true, 612);
}

// The fast profiles' FP8 linears on the tensor cores (cuda::set_fp8_gemm_in_linear, on by default): linear
// with act_quant_fp8 on a 128x128 FP8 weight takes cuBLASLt's GEMM, stays within the tensor-core
// bound of the CPU twin, and is batch invariant: a token's row is the same bits alone, in a batch of
// 37 (M_pad 48), of 300 (M_pad 304) and of 4100 (M_pad 4112, past the M the plan is chosen for),
// because one algorithm serves every M.
// Run on cuBLASLt and on the project's wgmma kernels (cuda::set_fp8_wgmma): 37 rows take the
// decode form (8-row items, K's quarters in separate blocks, A from registers), 300 and 4100 the TMA
// kernel's 128 x 128 tiles (both operands from shared memory; K's quarters in separate work items
// where the tiles number fewer than the SMs: 300 rows, and 4100 rows of N = 129), so the rows'
// bits compare the forms with each other. (With SPARROW_CUDA_DISABLE=fp8_tma, the 64-row tiles.)
class CudaFp8LinearPaths : public CudaFp8Linear, public ::testing::WithParamInterface<bool> {};

TEST_P(CudaFp8LinearPaths, TensorCoresInTheFastLinearAreBatchInvariant) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  const bool wgmma = GetParam();
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_fp8_wgmma(*gpu, wgmma);
  Rng rng(614);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{129, 1152}, std::pair<int64_t, int64_t>{1000, 4096},
                      std::pair<int64_t, int64_t>{2048, 4096}}) {
    StoredMatrix w = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
    const int64_t T = 300;
    const std::vector<float> x = rng.normal(T * K);
    auto run = [&](int64_t t0, int64_t n) { return gpu_rows(x, K, w.w, t0, n); };
    const std::vector<float> all = run(0, T);
    const std::string path = cuda::fp8_linear_last_path(*gpu);
    EXPECT_EQ(path.rfind("tensor cores", 0), 0u) << path;
    EXPECT_EQ(path.find("wgmma kernel") != std::string::npos, wgmma) << path;
    // Within the tensor-core bound of the CPU twin (the first 37 rows).
    const Tensor xc = cpu->upload_f32(std::vector<float>(x.begin(), x.begin() + 37 * K), {37, K});
    const Tensor oc = cpu->alloc(ElemType::kF32, {37, N});
    cpu->linear({.out = oc, .in = xc, .weight = &w.w, .act_quant_fp8 = true});
    const std::vector<float> ref = cpu->download_f32(oc);
    const std::vector<double> S = abs_products(std::vector<float>(x.begin(), x.begin() + 37 * K), w.w, 37);
    const BoundCheck b = check_bound(std::vector<float>(all.begin(), all.begin() + 37 * N), ref, S, std::ldexp(1.0, -9));
    EXPECT_EQ(b.failures, 0) << "N=" << N << " K=" << K << ": " << b.report;
    // Batch invariance.
    const std::vector<float> first37 = run(0, 37);
    for (int64_t i = 0; i < 37 * N; ++i)
      ASSERT_EQ(first37[i], all[i]) << "N=" << N << " K=" << K << ": row " << i / N << " differs in batches of 37 and 300";
    for (int64_t t : {int64_t{0}, int64_t{20}, int64_t{299}}) {
      const std::vector<float> alone = run(t, 1);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(alone[n], all[t * N + n]) << "N=" << N << " K=" << K << ": token " << t << " alone differs";
    }
    // The decode form's quarters over 1, 2 or 4 blocks (cuda::set_decode_quarter_blocks).
    if (wgmma) {
      for (int qb : {1, 2, 4}) {
        cuda::set_decode_quarter_blocks(qb);
        const std::vector<float> a = run(0, 37), b = run(20, 1);
        cuda::set_decode_quarter_blocks(0);
        for (int64_t i = 0; i < 37 * N; ++i)
          ASSERT_EQ(a[i], all[i]) << "N=" << N << " K=" << K << ", quarter blocks " << qb << ": row " << i / N << " of 37";
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(b[n], all[20 * N + n]) << "N=" << N << " K=" << K << ", quarter blocks " << qb << ": token 20 alone";
      }
    }
    // And in a batch of 4100 (M_pad 4112, past the size the plan is chosen for): the first 300 rows.
    {
      std::vector<float> big(static_cast<size_t>(4100 * K));
      for (int64_t r = 0; r < 4100; ++r) std::copy(x.begin() + (r % T) * K, x.begin() + (r % T + 1) * K, big.begin() + r * K);
      const Tensor xg = gpu->upload_f32(big, {4100, K});
      const Tensor og = gpu->alloc(ElemType::kF32, {4100, N});
      gpu->linear({.out = og, .in = xg, .weight = &w.w, .act_quant_fp8 = true});
      const std::vector<float> o = gpu->download_f32(og);
      for (int64_t i = 0; i < T * N; ++i)
        ASSERT_EQ(o[i], all[i]) << "N=" << N << " K=" << K << ": row " << i / N << " differs in batches of 4100 and 300";
      for (int64_t r = T; r < 4100; r += 997)
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(o[r * N + n], all[(r % T) * N + n]) << "N=" << N << " K=" << K << ": row " << r << " of 4100";
      // The TMA kernel's raster (cuda::set_tma_raster_group: a weight tile's 33 token tiles in a row
      // (1), groups of 3 and 8 weight tiles, the last group narrower at N = 129 and 1000) is not
      // part of the arithmetic: each gives the bits of the order chosen by size.
      for (int group : {1, 3, 8}) {
        cuda::set_tma_raster_group(group);
        gpu->linear({.out = og, .in = xg, .weight = &w.w, .act_quant_fp8 = true});
        const std::vector<float> og_group = gpu->download_f32(og);
        cuda::set_tma_raster_group(0);
        for (int64_t i = 0; i < 4100 * N; ++i)
          ASSERT_EQ(og_group[i], o[i]) << "N=" << N << " K=" << K << ", raster group " << group << ": row " << i / N << " of 4100";
      }
      // The TMA kernel's pair form (cuda::set_fp8_tma_pair: clusters of two blocks on weight tiles
      // 2 n and 2 n + 1, each copying half of the shared activation box to both; at N = 1000 and 2048
      // the 33 token tiles run unsplit on 8 and 16 weight tiles, the last token tile's 4 rows leaving
      // the second half-box wholly past the rows) gives the same bits, in the order chosen by size and
      // in groups of 3 pairs.
      if (wgmma) {
        for (int group : {0, 3}) {
          const int64_t before = cuda::fp8_tma_pair_launches();
          cuda::set_fp8_tma_pair(1);
          cuda::set_tma_raster_group(group);
          gpu->linear({.out = og, .in = xg, .weight = &w.w, .act_quant_fp8 = true});
          const std::vector<float> og_pair = gpu->download_f32(og);
          cuda::set_tma_raster_group(0);
          cuda::set_fp8_tma_pair(0);
          if (N != 129 && cuda::cuda_feature_on("fp8_tma")) {  // (SPARROW_CUDA_DISABLE=fp8_tma: the 64-row tiles)
            EXPECT_GT(cuda::fp8_tma_pair_launches(), before) << "N=" << N << ": the pair form did not run";
          }
          for (int64_t i = 0; i < 4100 * N; ++i)
            ASSERT_EQ(og_pair[i], o[i]) << "N=" << N << " K=" << K << ", pair form, raster group " << group << ": row " << i / N
                                        << " of 4100";
        }
      }
    }
  }
  cuda::set_fp8_wgmma(*gpu, cuda::cuda_feature_on("fp8_wgmma"));
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

INSTANTIATE_TEST_SUITE_P(Paths, CudaFp8LinearPaths, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Wgmma" : "CuBlasLt"; });

// Rows through the decode kernel (up to 64: 8-row items) give the bits of the same rows in a batch of
// 300 (the TMA kernel) on inputs that reach act_quant's corners: K not a multiple of 128 (its last
// block partly past K), an all-zero block (the scale's floor), tiny and huge values, the e4m3
// maximum, negative zero.
TEST_F(CudaFp8Linear, DecodeRowsGiveTheBatchBitsOnActQuantCorners) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_fp8_wgmma(*gpu, true);
  Rng rng(618);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{200, 1000}, std::pair<int64_t, int64_t>{128, 1152}}) {
    const StoredMatrix w = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
    const int64_t T = 300;
    std::vector<float> x = rng.normal(T * K);
    for (int64_t k = 128; k < 256 && k < K; ++k) x[3 * K + k] = 0.0f;           // row 3: a zero block
    for (int64_t k = 0; k < K; ++k) x[4 * K + k] *= 1e-7f;                       // row 4: tiny values
    for (int64_t k = 0; k < K; ++k) x[5 * K + k] *= 1e30f;                       // row 5: huge values
    for (int64_t k = 0; k < K; k += 7) x[6 * K + k] = k % 2 ? 448.0f : -448.0f;  // row 6: the e4m3 maximum
    x[7 * K + 1] = -0.0f;
    auto run = [&](int64_t t0, int64_t n) { return gpu_rows(x, K, w.w, t0, n); };
    const std::vector<float> all = run(0, T);
    for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, 1}, std::pair<int64_t, int64_t>{3, 5},
                         std::pair<int64_t, int64_t>{0, 64}, std::pair<int64_t, int64_t>{250, 37}}) {
      const std::vector<float> part = run(t0, n);
      const std::string path = cuda::fp8_linear_last_path(*gpu);
      EXPECT_NE(path.find("wgmma kernel"), std::string::npos) << path;
      for (int64_t i = 0; i < n * N; ++i)
        ASSERT_TRUE(same_float(part[i], all[t0 * N + i]))
            << "N=" << N << " K=" << K << ": row " << t0 + i / N << " column " << i % N << " in a batch of " << n
            << ": " << part[i] << " vs " << all[t0 * N + i] << " in the batch of 300";
    }
  }
  cuda::set_fp8_wgmma(*gpu, cuda::cuda_feature_on("fp8_wgmma"));
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// The decode form quantising its rows itself (`fp8_quant_in`, GroupedW4A8Args::x_f32) gives the
// bits of an act_quant launch first, on inputs with every act_quant corner (edge_rows: saturation,
// ties, subnormals, all-zero blocks, NaN, huge and tiny rows): 1, 5, 8, 37 and 64 rows; K not a
// multiple of 128 and of 4 (the last block partly past K; scalar loads); groups a block from 2 to 16
// (those past the ring's 4 slots in the extra shared memory) with the quarters over 4, 2 and 1
// blocks. Where a block would have more groups than kFp8QuantInMaxBytes holds (K = 4096 unsplit:
// 32), or the column blocks would read the rows more than kFp8QuantInMaxReads (N = 4096, K = 2048:
// 512 KB a row, so up to 32 rows), act_quant runs instead. Each linear's act_quant launches and
// in-kernel quantisations are counted, so a path that silently took the other one fails.
TEST_F(CudaFp8Linear, DecodeRowsQuantisedInTheKernelGiveActQuantsBits) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_fp8_wgmma(*gpu, true);
  Rng rng(627);
  struct Case {
    int64_t N, K;
    int quarter_blocks;  // 0: decode_quarter_blocks chooses (4 at these sizes)
    int64_t takes_up_to;  // the most rows the kernel quantises itself (0: none)
  };
  for (const Case c : {Case{200, 1000, 0, 64}, Case{192, 1002, 0, 64}, Case{128, 4096, 0, 64}, Case{64, 8192, 0, 64},
                       Case{136, 2048, 1, 64}, Case{72, 4096, 2, 64}, Case{64, 4096, 1, 0}, Case{4096, 2048, 0, 32}}) {
    const StoredMatrix w = fp8_matrix(rng, c.N, c.K, 128, 128, DType::kF8E8M0);
    cuda::set_decode_quarter_blocks(c.quarter_blocks);
    for (const int64_t T : {int64_t{1}, int64_t{5}, int64_t{8}, int64_t{37}, int64_t{64}}) {
      SCOPED_TRACE("N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " quarter blocks " +
                   std::to_string(c.quarter_blocks) + " T=" + std::to_string(T));
      const std::vector<float> x = edge_rows(rng, T, c.K);
      const Tensor xg = gpu->upload_f32(x, {T, c.K});
      std::vector<float> got[2];
      for (const bool in_kernel : {false, true}) {
        cuda::fp8_linear_set_quant_in(*gpu, in_kernel);
        const int64_t quantised = cuda::fp8_linear_quantisations(*gpu), in_kernels = cuda::fp8_wgmma_quant_in_launches();
        const Tensor og = gpu->alloc(ElemType::kF32, {T, c.N});
        gpu->linear({.out = og, .in = xg, .weight = &w.w, .act_quant_fp8 = true});
        got[in_kernel] = gpu->download_f32(og);
        const std::string path = cuda::fp8_linear_last_path(*gpu);
        EXPECT_NE(path.find("wgmma kernel"), std::string::npos) << path;
        const bool fused = in_kernel && T <= c.takes_up_to;
        EXPECT_EQ(cuda::fp8_wgmma_quant_in_launches() - in_kernels, fused ? 1 : 0) << (in_kernel ? "in the kernel" : "act_quant");
        EXPECT_EQ(cuda::fp8_linear_quantisations(*gpu) - quantised, fused ? 0 : 1) << (in_kernel ? "in the kernel" : "act_quant");
      }
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < T * c.N; ++i)
        if (!same_float(got[1][i], got[0][i]) && bad++ == 0) first = i;
      EXPECT_EQ(bad, 0) << "first at row " << first / c.N << " column " << first % c.N << ": " << got[1][first] << " vs "
                        << got[0][first] << " after act_quant";
    }
  }
  cuda::set_decode_quarter_blocks(0);
  cuda::fp8_linear_set_quant_in(*gpu, cuda::cuda_feature_on("fp8_quant_in"));
  cuda::set_fp8_wgmma(*gpu, cuda::cuda_feature_on("fp8_wgmma"));
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// An op's round_bf16 on the tensor-core linears is done in the kernel that writes the outputs where
// it can (the split kernels' sum of parts; `fused_round`) and by a pass after elsewhere: on every
// path the rounded outputs must be bf16 of the unrounded ones, bit for bit. FP8 (wgmma): 1, 5 and 37
// rows through the decode form (its quarters over 4, 2 and 1 blocks: the last with no parts' sum),
// 300 rows through the TMA kernel's split, 4100 rows unsplit. BF16 (input_bf16): the decode form's
// parts, the TMA kernel split (300 rows) and unsplit (4100 rows).
TEST_F(CudaFp8Linear, RoundedOutputsAreTheSumsRoundedOnEveryPath) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_fp8_wgmma(*gpu, true);
  Rng rng(617);
  const int64_t N = 1024, K = 1024;
  const StoredMatrix fp8 = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
  std::vector<float> vb = rng.normal(N * K);
  const StoredMatrix b16 = float_matrix(DType::kBF16, N, K, vb);
  for (const bool is_fp8 : {true, false}) {
    for (const int64_t T : {int64_t{1}, int64_t{5}, int64_t{37}, int64_t{300}, int64_t{4100}}) {
      for (const int qb : {0, 1}) {
        if (qb == 1 && T > 64) continue;
        cuda::set_decode_quarter_blocks(qb);
        std::vector<float> x = rng.normal(T * K);
        if (!is_fp8)
          for (float& v : x) v = bf16_round(v);
        auto run = [&](bool round) {
          const Tensor xg = gpu->upload_f32(x, {T, K});
          const Tensor og = gpu->alloc(ElemType::kF32, {T, N});
          if (is_fp8) gpu->linear({.out = og, .in = xg, .weight = &fp8.w, .act_quant_fp8 = true, .round_bf16 = round});
          else gpu->linear({.out = og, .in = xg, .weight = &b16.w, .round_bf16 = round, .input_bf16 = true});
          return gpu->download_f32(og);
        };
        const std::vector<float> plain = run(false), rounded = run(true);
        const std::string what = std::string(is_fp8 ? "fp8" : "bf16") + " T=" + std::to_string(T) +
                                 " quarter blocks " + std::to_string(qb);
        ASSERT_EQ(rounded.size(), plain.size());
        for (size_t i = 0; i < plain.size(); ++i)
          ASSERT_TRUE(same_float(rounded[i], bf16_round(plain[i]))) << what << ": value " << i << " " << rounded[i]
                                                                     << " is not bf16(" << plain[i] << ")";
      }
    }
  }
  cuda::set_decode_quarter_blocks(0);
  cuda::set_fp8_wgmma(*gpu, cuda::cuda_feature_on("fp8_wgmma"));
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// linears() of one input (the model's wq_a and wkv): the CUDA backend runs FP8 weights whose N are
// multiples of 128 as one GEMM over the weights stacked (fp8_stack). Each output must be exactly
// the matching columns of one linear over the stacked matrix built here by hand (which also checks
// the stacked scales' rows), rounded to bf16 under round_bf16, within the tensor-core bound of the
// CPU twin, and batch invariant; a stack it cannot take (an N of 129) must give each linear's own
// bits.
TEST_F(CudaFp8Linear, LinearsOfOneInputRunStackedWithTheStackedMatrixBits) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  Rng rng(615);
  const int64_t K = 1000, T = 300;
  const std::vector<float> x = rng.normal(T * K);
  for (const bool round : {false, true})
    for (const int64_t N1 : {int64_t{256}, int64_t{129}}) {
      const int64_t N2 = 128;
      SCOPED_TRACE("N1=" + std::to_string(N1) + (round ? " round_bf16" : ""));
      const StoredMatrix a = fp8_matrix(rng, N1, K, 128, 128, DType::kF8E8M0);
      const StoredMatrix b = fp8_matrix(rng, N2, K, 128, 128, DType::kF8E8M0);
      // The stacked matrix: a's rows then b's, a's scale rows then b's (N1 = 256: whole blocks).
      std::vector<uint8_t> codes(*a.data.bytes), scales(*a.scale.bytes);
      codes.insert(codes.end(), b.data.bytes->begin(), b.data.bytes->end());
      scales.insert(scales.end(), b.scale.bytes->begin(), b.scale.bytes->end());
      const int64_t L = (K + 127) / 128;
      StoredMatrix st;
      st.data = stored_raw(DType::kF8E4M3, {N1 + N2, K}, codes);
      st.scale = stored_raw(DType::kF8E8M0, {(N1 + 127) / 128 + 1, L}, scales);
      st.w = {.format = WeightFormat::kFp8Block, .out = N1 + N2, .in = K, .data = st.data.view, .scale = st.scale.view,
              .block_out = 128, .block_in = 128};
      auto run_pair = [&](int64_t t0, int64_t n) {
        const Tensor xg = gpu->upload_f32(std::vector<float>(x.begin() + t0 * K, x.begin() + (t0 + n) * K), {n, K});
        const Tensor oa = gpu->alloc(ElemType::kF32, {n, N1}), ob = gpu->alloc(ElemType::kF32, {n, N2});
        const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a.w, .act_quant_fp8 = true, .round_bf16 = round},
                                   {.out = ob, .in = xg, .weight = &b.w, .act_quant_fp8 = true, .round_bf16 = round}};
        gpu->linears(ps);
        return std::pair{gpu->download_f32(oa), gpu->download_f32(ob)};
      };
      auto run_one = [&](const WeightMatrix& w, int64_t n) {
        const Tensor xg = gpu->upload_f32(std::vector<float>(x.begin(), x.begin() + n * K), {n, K});
        const Tensor o = gpu->alloc(ElemType::kF32, {n, w.out});
        gpu->linear({.out = o, .in = xg, .weight = &w, .act_quant_fp8 = true, .round_bf16 = round});
        return gpu->download_f32(o);
      };
      const auto [ga, gb] = run_pair(0, T);
      if (N1 % 128 == 0) {
        const std::vector<float> whole = run_one(st.w, T);  // rounded by linear() under round_bf16
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t n = 0; n < N1; ++n)
            ASSERT_TRUE(same_float(ga[t * N1 + n], whole[t * (N1 + N2) + n])) << "row " << t << " col " << n;
          for (int64_t n = 0; n < N2; ++n)
            ASSERT_TRUE(same_float(gb[t * N2 + n], whole[t * (N1 + N2) + N1 + n])) << "row " << t << " col " << N1 + n;
        }
      } else {
        const std::vector<float> sa = run_one(a.w, T), sb = run_one(b.w, T);
        for (size_t i = 0; i < sa.size(); ++i) ASSERT_TRUE(same_float(ga[i], sa[i])) << "first output, value " << i;
        for (size_t i = 0; i < sb.size(); ++i) ASSERT_TRUE(same_float(gb[i], sb[i])) << "second output, value " << i;
      }
      // Within the tensor-core bound of the CPU twin (37 rows), without the rounding.
      if (!round) {
        const std::vector<float> x37(x.begin(), x.begin() + 37 * K);
        for (const auto* m : {&a, &b}) {
          const Tensor xc = cpu->upload_f32(x37, {37, K});
          const Tensor oc = cpu->alloc(ElemType::kF32, {37, m->w.out});
          cpu->linear({.out = oc, .in = xc, .weight = &m->w, .act_quant_fp8 = true});
          const std::vector<float>& got = m == &a ? ga : gb;
          const BoundCheck bc = check_bound(std::vector<float>(got.begin(), got.begin() + 37 * m->w.out),
                                            cpu->download_f32(oc), abs_products(x37, m->w, 37), std::ldexp(1.0, -9));
          EXPECT_EQ(bc.failures, 0) << bc.report;
        }
      }
      // Batch invariance: a token alone and the first 37.
      for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, 37}, std::pair<int64_t, int64_t>{123, 1}}) {
        const auto [pa, pb] = run_pair(t0, n);
        for (int64_t i = 0; i < n * N1; ++i) ASSERT_TRUE(same_float(pa[i], ga[t0 * N1 + i])) << "rows from " << t0;
        for (int64_t i = 0; i < n * N2; ++i) ASSERT_TRUE(same_float(pb[i], gb[t0 * N2 + i])) << "rows from " << t0;
      }
    }
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// linears() of one input whose outputs are wider than it (a CSA layer's wq_b and indexer wq_b: 40960
// of 1024) run as separate linears, never stacked (the rule is of the shapes, not the rows), and
// quantise their input once (`act_quant_shared`): each output must be its own linear's bits, with
// one act_quant launch for the pair where the FP8 tensor-core path runs (two with the switch off).
// At 1, 5 and 100 rows (the decode forms and the TMA kernel), with and without round_bf16.
TEST_F(CudaFp8Linear, LinearsOfOneInputTooWideToStackQuantiseItOnce) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  Rng rng(618);
  const int64_t K = 256, N1 = 768, N2 = 256;
  const StoredMatrix a = fp8_matrix(rng, N1, K, 128, 128, DType::kF8E8M0);
  const StoredMatrix b = fp8_matrix(rng, N2, K, 128, 128, DType::kF8E8M0);
  for (const int64_t T : {int64_t{1}, int64_t{5}, int64_t{100}})
    for (const bool round : {false, true}) {
      SCOPED_TRACE("T=" + std::to_string(T) + (round ? " round_bf16" : ""));
      const Tensor xg = gpu->upload_f32(rng.normal(T * K), {T, K});
      const Tensor oa = gpu->alloc(ElemType::kF32, {T, N1}), ob = gpu->alloc(ElemType::kF32, {T, N2});
      const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a.w, .act_quant_fp8 = true, .round_bf16 = round},
                                 {.out = ob, .in = xg, .weight = &b.w, .act_quant_fp8 = true, .round_bf16 = round}};
      const int64_t before = cuda::fp8_linear_quantisations(*gpu);
      gpu->linears(ps);
      const int64_t launched = cuda::fp8_linear_quantisations(*gpu) - before;
      // (Up to 64 rows the wgmma kernel quantises them itself, `fp8_quant_in`: no act_quant at all.)
      if (cuda::last_linear_tensor_cores(*gpu)) {
        const bool in_kernel = T <= 64 && cuda::cuda_feature_on("fp8_quant_in") && cuda::cuda_feature_on("fp8_wgmma");
        EXPECT_EQ(launched, in_kernel ? 0 : cuda::cuda_feature_on("act_quant_shared") ? 1 : 2);
      }
      const std::vector<float> ga = gpu->download_f32(oa), gb = gpu->download_f32(ob);
      const Tensor sa = gpu->alloc(ElemType::kF32, {T, N1}), sb = gpu->alloc(ElemType::kF32, {T, N2});
      gpu->linear({.out = sa, .in = xg, .weight = &a.w, .act_quant_fp8 = true, .round_bf16 = round});
      gpu->linear({.out = sb, .in = xg, .weight = &b.w, .act_quant_fp8 = true, .round_bf16 = round});
      const std::vector<float> wa = gpu->download_f32(sa), wb = gpu->download_f32(sb);
      for (size_t i = 0; i < wa.size(); ++i) ASSERT_TRUE(same_float(ga[i], wa[i])) << "first output, value " << i;
      for (size_t i = 0; i < wb.size(); ++i) ASSERT_TRUE(same_float(gb[i], wb[i])) << "second output, value " << i;
      // The same input tensor written afresh (in place) after the call: a linear of it quantises the
      // new values (nothing kept past linears()), as a copy of them in a fresh tensor gives.
      gpu->rms_norm({.out = xg, .in = xg, .weight = {}, .group = K, .eps = 1e-6});
      const Tensor fresh = gpu->upload_f32(gpu->download_f32(xg), {T, K});
      const Tensor na = gpu->alloc(ElemType::kF32, {T, N1}), nf = gpu->alloc(ElemType::kF32, {T, N1});
      gpu->linear({.out = na, .in = xg, .weight = &a.w, .act_quant_fp8 = true, .round_bf16 = round});
      gpu->linear({.out = nf, .in = fresh, .weight = &a.w, .act_quant_fp8 = true, .round_bf16 = round});
      const std::vector<float> vn = gpu->download_f32(na), vf = gpu->download_f32(nf);
      for (size_t i = 0; i < vn.size(); ++i) ASSERT_TRUE(same_float(vn[i], vf[i])) << "after the input changed, value " << i;
    }
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// linears() of one bf16-valued input without act_quant (a compressor's wkv and wgate): BF16 weights
// whose N are multiples of 8 run as one bf16 GEMM over the stack; each output must be exactly the
// matching columns of one linear over the stacked matrix, and batch invariant; an N of 129 (not
// stackable) must give each linear's own bits.
TEST_F(CudaFp8Linear, Bf16LinearsOfOneInputRunStackedWithTheStackedMatrixBits) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  Rng rng(616);
  const int64_t K = 1000, T = 300;
  std::vector<float> x = rng.normal(T * K);
  for (float& v : x) v = bf16_round(v);
  for (const int64_t N1 : {int64_t{200}, int64_t{129}}) {
    const int64_t N2 = 56;
    SCOPED_TRACE("N1=" + std::to_string(N1));
    const std::vector<float> va = rng.normal(N1 * K), vb = rng.normal(N2 * K);
    std::vector<float> vs = va;
    vs.insert(vs.end(), vb.begin(), vb.end());
    const StoredMatrix a = float_matrix(DType::kBF16, N1, K, va), b = float_matrix(DType::kBF16, N2, K, vb),
                       st = float_matrix(DType::kBF16, N1 + N2, K, vs);
    auto run_pair = [&](int64_t t0, int64_t n) {
      const Tensor xg = gpu->upload_f32(std::vector<float>(x.begin() + t0 * K, x.begin() + (t0 + n) * K), {n, K});
      const Tensor oa = gpu->alloc(ElemType::kF32, {n, N1}), ob = gpu->alloc(ElemType::kF32, {n, N2});
      const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a.w, .input_bf16 = true},
                                 {.out = ob, .in = xg, .weight = &b.w, .input_bf16 = true}};
      gpu->linears(ps);
      return std::pair{gpu->download_f32(oa), gpu->download_f32(ob)};
    };
    auto run_one = [&](const WeightMatrix& w) {
      const Tensor xg = gpu->upload_f32(x, {T, K});
      const Tensor o = gpu->alloc(ElemType::kF32, {T, w.out});
      gpu->linear({.out = o, .in = xg, .weight = &w, .input_bf16 = true});
      return gpu->download_f32(o);
    };
    const auto [ga, gb] = run_pair(0, T);
    std::vector<float> ea, eb;
    if (N1 % 8 == 0) {
      const std::vector<float> whole = run_one(st.w);
      for (int64_t t = 0; t < T; ++t) {
        ea.insert(ea.end(), whole.begin() + t * (N1 + N2), whole.begin() + t * (N1 + N2) + N1);
        eb.insert(eb.end(), whole.begin() + t * (N1 + N2) + N1, whole.begin() + (t + 1) * (N1 + N2));
      }
    } else {
      ea = run_one(a.w);
      eb = run_one(b.w);
    }
    for (size_t i = 0; i < ea.size(); ++i) ASSERT_TRUE(same_float(ga[i], ea[i])) << "first output, value " << i;
    for (size_t i = 0; i < eb.size(); ++i) ASSERT_TRUE(same_float(gb[i], eb[i])) << "second output, value " << i;
    // Close to the fp64 product (bf16 values, fp32 sums).
    for (int64_t n = 0; n < N1; n += 17) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(x[5 * K + k]) * bf16_round(va[n * K + k]);
      EXPECT_NEAR(ga[5 * N1 + n], ref, 1e-3 * (1 + std::fabs(ref))) << "col " << n;
    }
    const auto [pa, pb] = run_pair(123, 1);
    for (int64_t i = 0; i < N1; ++i) ASSERT_TRUE(same_float(pa[i], ga[123 * N1 + i])) << "token 123 alone";
    for (int64_t i = 0; i < N2; ++i) ASSERT_TRUE(same_float(pb[i], gb[123 * N2 + i])) << "token 123 alone";
  }
}

// Stacks are cached under their first weight: two stacks sharing it must get their own entries,
// also when the views carry ids as a checkpoint's do (view_fingerprint is 0 for those, so the
// stack's fingerprint mixes every weight's identity: cuda_state.h stack_fingerprint). {a, b} then
// {a, c}, FP8 and BF16: c's output must be c's (close to its own linear), not b's again.
TEST_F(CudaFp8Linear, StacksSharingAFirstWeightAreToldApart) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  Rng rng(617);
  const int64_t K = 256, T = 5, N = 128;
  std::vector<float> x = rng.normal(T * K);
  for (float& v : x) v = bf16_round(v);
  for (const bool fp8 : {true, false}) {
    SCOPED_TRACE(fp8 ? "FP8" : "BF16");
    std::vector<StoredMatrix> m;
    for (uint64_t i = 0; i < 3; ++i) {
      m.push_back(fp8 ? fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0)
                      : float_matrix(DType::kBF16, N, K, rng.normal(N * K)));
      m.back().w.data.id = (fp8 ? 7100 : 7200) + 2 * i;
      if (fp8) m.back().w.scale.id = 7101 + 2 * i;
    }
    const Tensor xg = gpu->upload_f32(x, {T, K});
    auto stack = [&](const StoredMatrix& a, const StoredMatrix& b) {
      const Tensor oa = gpu->alloc(ElemType::kF32, {T, N}), ob = gpu->alloc(ElemType::kF32, {T, N});
      const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a.w, .act_quant_fp8 = fp8, .input_bf16 = !fp8},
                                 {.out = ob, .in = xg, .weight = &b.w, .act_quant_fp8 = fp8, .input_bf16 = !fp8}};
      gpu->linears(ps);
      return gpu->download_f32(ob);
    };
    const std::vector<float> second_b = stack(m[0], m[1]), second_c = stack(m[0], m[2]);
    const Tensor oc = gpu->alloc(ElemType::kF32, {T, N});
    gpu->linear({.out = oc, .in = xg, .weight = &m[2].w, .act_quant_fp8 = fp8, .input_bf16 = !fp8});
    const std::vector<float> alone_c = gpu->download_f32(oc);
    double scale = 0, to_c = 0, b_to_c = 0;
    for (size_t i = 0; i < alone_c.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(alone_c[i])));
      to_c = std::max(to_c, std::fabs(static_cast<double>(second_c[i]) - alone_c[i]));
      b_to_c = std::max(b_to_c, std::fabs(static_cast<double>(second_b[i]) - alone_c[i]));
    }
    EXPECT_LE(to_c, 1e-3 * scale) << "the stack {a, c} gave something other than c's product";
    EXPECT_GT(b_to_c, 0.1 * scale) << "b and c too alike for the test to tell them apart";
  }
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// The device weight caches are keyed by host address: new contents at the same address and of the
// same size (what a freed model's storage reused by the next one looks like) must be uploaded again,
// on the FP8 tensor-core path, its fallback and the plain linear. Found on the H200 on 2026-11-30:
// the odd-shape tests above, whose matrices are freed and reallocated in a loop, got stale scales.
TEST_F(CudaFp8Linear, NewContentsAtACachedAddressAreUploadedAgain) {
  Rng rng(613);
  const int64_t M = 5, K = 200, N = 129;
  StoredMatrix a = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
  const StoredMatrix b = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
  const std::vector<float> x = rng.normal(M * K);
  const Tensor xc = cpu->upload_f32(x, {M, K}), xg = gpu->upload_f32(x, {M, K});
  const Tensor oc = cpu->alloc(ElemType::kF32, {M, N}), og = gpu->alloc(ElemType::kF32, {M, N});
  auto overwrite = [](const Stored& dst, const Stored& src) {
    const size_t bytes = static_cast<size_t>(src.view.numel()) * dtype_size(src.view.dtype);
    ASSERT_EQ(static_cast<size_t>(dst.view.numel()) * dtype_size(dst.view.dtype), bytes);
    std::memcpy(const_cast<void*>(dst.view.data), src.view.data, bytes);
  };
  for (bool fallback : {false, true}) {
    if (real_cuda()) cuda::fp8_linear_force_fallback(*gpu, fallback);
    for (bool plain : {false, true}) {
      StoredMatrix fresh = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
      overwrite(a.data, fresh.data);
      overwrite(a.scale, fresh.scale);
      auto run = [&](Backend& be, const Tensor& out, const Tensor& in, const WeightMatrix* w) {
        if (plain) be.linear({.out = out, .in = in, .weight = w});
        else be.linear_fp8_block({.out = out, .in = in, .weight = w});
      };
      run(*gpu, og, xg, &a.w);  // fills the caches with the first contents
      overwrite(a.data, b.data);
      overwrite(a.scale, b.scale);
      run(*gpu, og, xg, &a.w);
      run(*cpu, oc, xc, &b.w);
      const CompareResult r = compare_f32(gpu->download_f32(og), cpu->download_f32(oc),
                                          {.atol = 1e-2, .max_cosine_distance = 1e-5}, {M, N});
      EXPECT_TRUE(r.ok) << (plain ? "linear" : "linear_fp8_block") << (fallback ? " (fallback)" : "") << ": "
                        << r.message;
    }
  }
  if (real_cuda()) cuda::fp8_linear_force_fallback(*gpu, false);
}

// Inputs whose every sum is exact (header comment): x integers in [-2, 2] (each block's scale is
// 2^-7, 2^-8 or, for a zero block, 2^-22, and every code is exact), weight codes in {0, ±1, ±2},
// e8m0 block scales 2^-3 .. 2^3 that differ between blocks and are not symmetric. The result must
// equal the twin exactly on every path, and would not if the scales were read transposed (checked
// here on the host: the transposed reading gives a different product).
struct ExactCase {
  StoredMatrix w;
  std::vector<float> x;
  int64_t M, K, N;
};

ExactCase exact_case(Rng& rng, int64_t M, int64_t K, int64_t N) {
  ExactCase e;
  e.M = M;
  e.K = K;
  e.N = N;
  const int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
  std::vector<uint8_t> codes(N * K);
  const uint8_t kCodes[] = {0x00, 0x38, 0x40, 0xB8, 0xC0};  // 0, 1, 2, -1, -2
  for (auto& c : codes) c = kCodes[rng.integer(0, 4)];
  std::vector<uint8_t> scales(nb * kb);
  for (int64_t r = 0; r < nb; ++r)
    for (int64_t c = 0; c < kb; ++c) scales[r * kb + c] = static_cast<uint8_t>(127 - 3 + (r * 3 + c * 5 + r * c) % 7);
  e.w.data = stored_raw(DType::kF8E4M3, {N, K}, std::move(codes));
  e.w.scale = stored_raw(DType::kF8E8M0, {nb, kb}, std::move(scales));
  e.w.w = {.format = WeightFormat::kFp8Block, .out = N, .in = K, .data = e.w.data.view, .scale = e.w.scale.view,
           .block_out = 128, .block_in = 128};
  e.x.resize(M * K);
  for (auto& v : e.x) v = static_cast<float>(rng.integer(-2, 2));
  // Some all-zero blocks (scale 2^-22) and some blocks with amax 1 (scale 2^-8).
  for (int64_t m = 0; m < M; m += 5)
    for (int64_t k = 0; k < std::min<int64_t>(K, 128); ++k) e.x[m * K + k] = 0;
  for (int64_t m = 1; m < M; m += 4)
    for (int64_t k = 0; k < K; ++k) e.x[m * K + k] = std::clamp(e.x[m * K + k], -1.0f, 1.0f);
  return e;
}

// y[m, n] = sum_k x[m, k] code[n, k] scale(n / 128, k / 128), with the scale tensor read as stored
// (`misread` false) or with its block indices swapped (square grids: scale[kb][nb]; otherwise the
// [nb, kb] bytes read as if they were [kb, nb]).
std::vector<float> exact_product(const ExactCase& e, bool misread) {
  const int64_t nb = (e.N + 127) / 128, kb = (e.K + 127) / 128;
  const auto* codes = static_cast<const uint8_t*>(e.w.w.data.data);
  const auto* sc = static_cast<const uint8_t*>(e.w.w.scale.data);
  std::vector<float> y(e.M * e.N);
  for (int64_t m = 0; m < e.M; ++m)
    for (int64_t n = 0; n < e.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < e.K; ++k) {
        const int64_t r = n / 128, c = k / 128;
        const uint8_t s = misread ? (nb == kb ? sc[c * kb + r] : sc[c * nb + r]) : sc[r * kb + c];
        acc += static_cast<double>(e.x[m * e.K + k]) * e4m3_to_f32(codes[n * e.K + k]) * e8m0_to_f32(s);
      }
      y[m * e.N + n] = static_cast<float>(acc);
    }
  return y;
}

void exact_inputs(Backend& cpu, Backend& gpu, bool real_cuda, bool force_fallback) {
  Rng rng(621);
  if (real_cuda) cuda::fp8_linear_force_fallback(gpu, force_fallback);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{37, 520, 300}, {300, 384, 384}, {1, 200, 129},
                         {16, 1152, 1000}, {3, 128, 64}}) {
    const ExactCase e = exact_case(rng, M, K, N);
    const std::string tag = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
    // The host product is the twin's (the inputs quantise exactly), and a misread scale tensor
    // would change it.
    const std::vector<float> want = exact_product(e, false), misread = exact_product(e, true);
    // (With one block row or column both readings are the same bytes: nothing to check.)
    if ((N + 127) / 128 > 1 && (K + 127) / 128 > 1) {
      int64_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != misread[i];
      ASSERT_GT(differ, static_cast<int64_t>(want.size()) / 4) << tag << ": the case cannot detect transposed scales";
    }
    const Tensor xc = cpu.upload_f32(e.x, {M, K}), xg = gpu.upload_f32(e.x, {M, K});
    const Tensor oc = cpu.alloc(ElemType::kF32, {M, N}), og = gpu.alloc(ElemType::kF32, {M, N});
    cpu.linear_fp8_block({.out = oc, .in = xc, .weight = &e.w.w});
    gpu.linear_fp8_block({.out = og, .in = xg, .weight = &e.w.w});
    const std::string path = real_cuda ? cuda::fp8_linear_last_path(gpu) : "cpu stand-in";
    const std::vector<float> ref = cpu.download_f32(oc), got = gpu.download_f32(og);
    const CompareResult twin = compare_f32(ref, want, kExact, {M, N});
    EXPECT_TRUE(twin.ok) << tag << ": CPU twin vs exact product: " << twin.message;
    const CompareResult c = compare_f32(got, ref, kExact, {M, N});
    EXPECT_TRUE(c.ok) << tag << " [" << path << "]: " << c.message << " (" << c.summary() << ")";
    std::printf("exact inputs %s [%s]: %s\n", tag.c_str(), path.c_str(), c.ok ? "identical" : c.summary().c_str());
  }
  if (real_cuda) cuda::fp8_linear_force_fallback(gpu, false);
}

TEST_F(CudaFp8Linear, ExactInputsGiveExactResultsAndCatchTransposedScales) { exact_inputs(*cpu, *gpu, real_cuda(), false); }

TEST_F(CudaFp8Linear, ExactInputsOnTheFallback) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  exact_inputs(*cpu, *gpu, true, true);
}

// No GPU needed: the weight bytes the tensor-core path uploads (fp8_weight_layout) and the
// activations in the layout the quantisation kernel writes (rebuilt here with the CPU's rule), read
// with cuBLASLt's documented semantics (cuBLAS docs §3.1.4.5: D[n, m] = sum over K-blocks b of
// A_scale(b, n / 128) B_scale(m, b) sum_{k in b} A[k, n] B[k, m]; A = weight [K_pad, N_pad]
// column-major, its BLK128x128 scales K-major with column stride l4; B = input [K_pad, M_pad]
// column-major, its VEC128 scales token-major), give the exact product on the exact inputs, with
// zeros in the padding. This checks the layouts against the documentation; the GPU tests check them
// against cuBLASLt itself.
TEST(CudaFp8Layout, PaddedLayoutsUnderTheDocumentedSemanticsGiveTheProduct) {
  Rng rng(651);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{37, 520, 300}, {1, 200, 129}, {16, 1152, 1000}}) {
    const ExactCase e = exact_case(rng, M, K, N);
    const cuda::Fp8WeightLayout wl = cuda::fp8_weight_layout(e.w.w);
    const int64_t m_pad = round_up(M, 16), k_pad = round_up(K, 128), L = k_pad / 128, n_pad = round_up(N, 16);
    ASSERT_EQ(wl.k_pad, k_pad);
    ASSERT_EQ(wl.n_pad, n_pad);
    ASSERT_EQ(wl.l4, round_up(L, 4));
    std::vector<uint8_t> acodes(m_pad * k_pad, 0);
    std::vector<float> ascales(L * m_pad, 1.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < L; ++b) {
        float amax = 1e-4f;
        for (int64_t k = b * 128; k < std::min(K, (b + 1) * 128); ++k) amax = std::max(amax, std::fabs(e.x[m * K + k]));
        const float s = std::ldexp(1.0f, pow2_scale_exponent(amax, kE4m3Max));
        ascales[b * m_pad + m] = s;
        for (int64_t k = b * 128; k < std::min(K, (b + 1) * 128); ++k)
          acodes[m * k_pad + k] = f32_to_e4m3(std::clamp(e.x[m * K + k] / s, -kE4m3Max, kE4m3Max));
      }
    const std::vector<float> want = exact_product(e, false);
    int64_t bad = 0;
    for (int64_t m = 0; m < m_pad; ++m)
      for (int64_t n = 0; n < n_pad; ++n) {
        double d = 0;
        for (int64_t b = 0; b < L; ++b) {
          double block = 0;
          for (int64_t k = b * 128; k < (b + 1) * 128; ++k)
            block += static_cast<double>(e4m3_to_f32(wl.codes[n * k_pad + k])) * e4m3_to_f32(acodes[m * k_pad + k]);
          d += block * wl.scales[(n / 128) * wl.l4 + b] * ascales[b * m_pad + m];
        }
        const double expect = m < M && n < N ? want[m * N + n] : 0.0;
        if (d != expect && bad++ == 0)
          ADD_FAILURE() << "M=" << M << " K=" << K << " N=" << N << ": D[" << m << ", " << n << "] = " << d << ", want "
                        << expect;
      }
    EXPECT_EQ(bad, 0);
  }
}

// The point of the op: on an H200 with cuBLAS >= 12.9 the GEMM runs on the tensor cores. Fails,
// naming the reason, when it falls back (cuBLASLt missing, too old, or no algorithm for the shape).
TEST_F(CudaFp8Linear, TensorCorePathRunsForCheckpointWeights) {
  if (!real_cuda()) GTEST_SKIP() << "needs the CUDA backend's test support";
  Rng rng(631);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 7168, 1536}, {64, 1024, 512}, {37, 200, 129}}) {
    StoredMatrix w = fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0);
    const Tensor x = gpu->upload_f32(rng.normal(M * K), {M, K});
    const Tensor y = gpu->alloc(ElemType::kF32, {M, N});
    gpu->linear_fp8_block({.out = y, .in = x, .weight = &w.w});
    const std::string p = cuda::fp8_linear_last_path(*gpu);
    std::printf("M=%lld K=%lld N=%lld: %s\n", static_cast<long long>(M), static_cast<long long>(K),
                static_cast<long long>(N), p.c_str());
    EXPECT_EQ(p.rfind("tensor cores", 0), 0u) << p;
  }
}

// Weights the tensor-core path does not take (float, FP8 with other block shapes) go to the
// fallback, which computes the same twin; no tokens writes nothing.
TEST_F(CudaFp8Linear, OtherWeightFormatsTakeTheFallback) {
  Rng rng(641);
  std::vector<std::pair<std::string, StoredMatrix>> ws;
  ws.emplace_back("bf16", float_matrix(DType::kBF16, 67, 259, rng.normal(67 * 259, 0.06)));
  ws.emplace_back("fp8_16x64_f32", fp8_matrix(rng, 37, 150, 16, 64, DType::kF32));
  ws.emplace_back("fp4", fp4_matrix(rng, 37, 96));
  for (auto& [name, m] : ws) {
    for (int64_t T : {1, 19}) {
      const int64_t K = m.w.in, N = m.w.out;
      const std::vector<float> x = rng.normal(T * K);
      const Tensor xc = cpu->upload_f32(x, {T, K}), xg = gpu->upload_f32(x, {T, K});
      const Tensor oc = cpu->alloc(ElemType::kF32, {T, N}), og = gpu->alloc(ElemType::kF32, {T, N});
      cpu->linear_fp8_block({.out = oc, .in = xc, .weight = &m.w});
      gpu->linear_fp8_block({.out = og, .in = xg, .weight = &m.w});
      const std::string tag = name + " T=" + std::to_string(T) + " [" + path() + "]";
      if (real_cuda()) {
        EXPECT_EQ(path().rfind("fallback", 0), 0u) << tag;
      }
      const BoundCheck b = check_bound(gpu->download_f32(og), cpu->download_f32(oc), abs_products(x, m.w, T),
                                       (static_cast<double>(K) / 32 + 8) * std::ldexp(1.0, -24));
      EXPECT_EQ(b.failures, 0) << tag << ": " << b.report;
    }
  }
  // T = 0: nothing to do, nothing written.
  StoredMatrix w = fp8_matrix(rng, 64, 128, 128, 128, DType::kF8E8M0);
  const Tensor x = gpu->alloc(ElemType::kF32, {0, 128}), y = gpu->alloc(ElemType::kF32, {0, 64});
  gpu->linear_fp8_block({.out = y, .in = x, .weight = &w.w});
  EXPECT_TRUE(gpu->download_f32(y).empty());
}

}  // namespace
}  // namespace sparrow
