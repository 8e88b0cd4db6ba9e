// The deepseek-ref numerics profile (spec §3.0.5-§3.0.8, §4): its primitives against hand values,
// and the model-level contracts it must keep (chunking invariance; closeness to fp32).
#include <gtest/gtest.h>

#include "model/test_model.h"

#include <cmath>

#include "core/compare.h"
#include "core/npy.h"
#include "core/quant_sim.h"
#include "model/model.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

using testing::fixture_ids;

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

TEST(RefNumerics, Fp8ActQuantUsesPowerOfTwoScales) {
  // Block amax 100 -> s = 2^ceil(log2(100/448)) = 2^-2. x/s = 400 lies halfway between the e4m3
  // grid points 384 and 416 (step 32 there) and goes to the even mantissa, 384 -> 96; 1/s = 4 is on
  // the grid; 3.3/s = 13.2 rounds to 13 (step 1 below 16) -> 3.25.
  std::vector<float> x = {100, 1, 3.3f, -0.3f};
  fp8_pow2_quant_sim(x.data(), 4, 128);
  EXPECT_EQ(x[0], 96);
  EXPECT_EQ(x[1], 1);
  EXPECT_EQ(x[2], 3.25f);
  EXPECT_EQ(x[3], -0.3125f);  // -0.3/s = -1.2 -> -1.25 (step 0.125 in [1, 2)) -> -0.3125
  // Blocks are independent: the second block of 2 has its own scale (amax 0.5 -> s = 2^-9).
  std::vector<float> y = {448, 448, 0.5f, 0.3f};
  fp8_pow2_quant_sim(y.data(), 4, 2);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_NEAR(y[3], 0.3f, 0.3f / 16);
}

TEST(RefNumerics, HadamardIsOrthonormalSylvester) {
  std::vector<float> x = {1, 0, 0, 0};
  hadamard_transform(x.data(), 4);
  for (float v : x) EXPECT_FLOAT_EQ(v, 0.5f);
  std::vector<float> e1 = {0, 1, 0, 0};  // second row of H_4 = [1, -1, 1, -1] / 2
  hadamard_transform(e1.data(), 4);
  EXPECT_EQ(e1, (std::vector<float>{0.5f, -0.5f, 0.5f, -0.5f}));
  std::vector<float> v = {0.3f, -1.2f, 2.5f, 7.0f, 0.0f, 1.0f, -3.0f, 0.25f};
  std::vector<float> w = v;
  hadamard_transform(w.data(), 8);
  hadamard_transform(w.data(), 8);  // H/sqrt(n) is its own inverse
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(w[i], v[i], 1e-6);
}

TEST(RefNumerics, ProfileKeepsChunkingInvarianceAndStaysNearFp32) {
  auto backend = make_cpu_backend();
  auto ref = Model::load(kFixtures / "mixed_hc2", {.precision = Precision::kDeepseekRef}).value();
  auto fp32 = Model::load(kFixtures / "mixed_hc2").value();
  const auto ids = fixture_ids("mixed_hc2");
  const int64_t T = static_cast<int64_t>(ids.size()), V = ref->config().vocab_size;
  Session rs(*ref, *backend), fs(*fp32, *backend);
  const auto one_shot = rs.logits(ids, 0).value();
  for (int64_t chunk : {1, 7}) {
    const auto r = compare_f32(rs.logits(ids, chunk).value(), one_shot, {.atol = 0, .rtol = 0}, {T, V});
    EXPECT_TRUE(r.ok) << "chunk " << chunk << ": " << r.message;
  }
  // Same model, coarser arithmetic: clearly different logits, yet pointing the same way.
  const auto exact = fs.logits(ids, 0).value();
  const auto d = compare_f32(one_shot, exact, {.atol = INFINITY});
  std::printf("[deepseek-ref vs fp32] mixed_hc2: %s\n", d.summary().c_str());
  EXPECT_GT(d.rel_to_max, 1e-3);
  EXPECT_LT(d.cosine_distance, 0.1);
}

TEST(RefNumerics, OtherBackendsAreRefusedClearly) {
  auto backend = make_cpu_backend();
  auto ref = Model::load(kFixtures / "csa", {.precision = Precision::kDeepseekRef}).value();
  EXPECT_TRUE(ref->check_backend(*backend).is_ok());
  EXPECT_EQ(precision_from_name("deepseek-ref"), Precision::kDeepseekRef);
  EXPECT_FALSE(precision_from_name("fast").has_value());
}

}  // namespace
}  // namespace sparrow
