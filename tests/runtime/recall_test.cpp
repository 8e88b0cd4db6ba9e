#include <gtest/gtest.h>

#include "model/test_model.h"
#include "core/quant_sim.h"
#include "runtime/recall.h"

namespace sparrow {
namespace {

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

TEST(KeyPrecision, RoundingForms) {
  std::vector<float> x = {1.0f + 1.0f / 1024, -3.0f};
  simulate_key_precision(x.data(), 2, KeyPrecision::kBf16);
  EXPECT_EQ(x[0], 1.0f);  // 2^-10 is below bf16's 2^-7 step
  EXPECT_EQ(x[1], -3.0f);
  // fp8, one scale per key: amax 448 -> scale 1; 5 and 17 are e4m3 grid points at that scale, 17.5
  // is not (the grid there is 16, 18): it rounds to the nearer, 18.
  x = {448, 5, 17.5f};
  simulate_key_precision(x.data(), 3, KeyPrecision::kFp8);
  EXPECT_EQ(x[0], 448);
  EXPECT_EQ(x[1], 5);
  EXPECT_EQ(x[2], 18);
  // fp4 in blocks of 32 with power-of-two scales: amax 6 -> scale 1; 5 is halfway between 4 and 6
  // and goes to the even code (4); 0.7 -> 0.5.
  std::vector<float> y(32, 0.0f);
  y[0] = 6;
  y[1] = 5;
  y[2] = 0.7f;
  simulate_key_precision(y.data(), 32, KeyPrecision::kFp4);
  EXPECT_EQ(y[0], 6);
  EXPECT_EQ(y[1], 4);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_EQ(key_precision_from_name("fp4"), KeyPrecision::kFp4);
  EXPECT_FALSE(key_precision_from_name("int4").has_value());
}

TEST(Recall, Fp32KeysKeepTheExactSelectionAndFp4LosesSome) {
  auto backend = make_cpu_backend();
  auto rows = indexer_recall(kFixtures / "mixed_hc2", *backend, testing::fixture_ids("mixed_hc2"),
                             {.keys = {KeyPrecision::kF32, KeyPrecision::kFp4}});
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 4u);  // CSA layers 1 and 3, two precisions each
  double fp4_worst = 1;
  for (const RecallRow& r : *rows) {
    EXPECT_GT(r.contested, 0) << "layer " << r.layer;
    if (r.keys == "fp32") {
      EXPECT_EQ(r.min_overlap, 1.0) << "layer " << r.layer;
    }
    if (r.keys == "fp4") fp4_worst = std::min(fp4_worst, r.mean_overlap);
  }
  EXPECT_LT(fp4_worst, 1.0) << "fp4 keys should flip some selections on this fixture";
}

// The measured side under the fast profile: even fp32 keys no longer reproduce every selection
// (bf16 roundings and FP8 activations reach the indexer's inputs), but the upstream decisions are
// forced, so the overlap stays high.
TEST(Recall, FastProfileIsMeasuredAgainstTheFp32Selection) {
  auto backend = make_cpu_backend();
  auto rows = indexer_recall(kFixtures / "mixed_hc2", *backend, testing::fixture_ids("mixed_hc2"),
                             {.keys = {KeyPrecision::kF32}, .precision = Precision::kFast});
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 2u);
  double worst = 1;
  for (const RecallRow& r : *rows) {
    EXPECT_GT(r.contested, 0) << "layer " << r.layer;
    EXPECT_GT(r.mean_overlap, 0.8) << "layer " << r.layer;
    worst = std::min(worst, r.min_overlap);
  }
  EXPECT_LT(worst, 1.0) << "the fast profile should move some selection on this fixture";
}

TEST(Recall, ModelWithoutCsaIsAClearError) {
  auto backend = make_cpu_backend();
  auto rows = indexer_recall(kFixtures / "swa_hash", *backend, testing::fixture_ids("swa_hash"), {});
  ASSERT_FALSE(rows.is_ok());
  EXPECT_NE(rows.status().message().find("no CSA layer"), std::string::npos);
}

}  // namespace
}  // namespace sparrow
