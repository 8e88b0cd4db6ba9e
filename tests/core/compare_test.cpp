#include <gtest/gtest.h>

#include <cmath>

#include "core/compare.h"

namespace sparrow {
namespace {

TEST(Compare, PassesWithinTolerance) {
  const std::vector<float> ref = {1, 2, 3}, got = {1.001f, 2, 3};
  EXPECT_TRUE(compare_f32(got, ref, {.atol = 1e-2}).ok);
}

TEST(Compare, NamesWorstElementWithIndex) {
  const std::vector<float> ref = {1, 2, 3, 4}, got = {1, 2, 3.5f, 4};
  const auto r = compare_f32(got, ref, {.atol = 1e-3, .rtol = 1e-3}, {2, 2});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worst_index, 2);
  EXPECT_NE(r.message.find("[1, 0]"), std::string::npos) << r.message;
}

TEST(Compare, NanPositionsMustMatch) {
  const std::vector<float> ref = {1, NAN}, same = {1, NAN}, moved = {NAN, 1};
  EXPECT_TRUE(compare_f32(same, ref, {.atol = 1}).ok);
  EXPECT_FALSE(compare_f32(moved, ref, {.atol = 1}).ok);
}

TEST(Compare, RelToMaxAndCosine) {
  const std::vector<float> ref = {10, 0, 0}, got = {10, 0.01f, 0};
  const auto r = compare_f32(got, ref, {.atol = 1, .max_rel_to_max = 1e-4});
  EXPECT_FALSE(r.ok);  // 0.01 / 10 = 1e-3 > 1e-4
  EXPECT_NEAR(r.rel_to_max, 1e-3, 1e-6);
  EXPECT_FALSE(compare_f32(std::vector<float>{-10, 0, 0}, ref, {.atol = 100, .max_cosine_distance = 1e-3}).ok);
  EXPECT_FALSE(compare_f32(std::vector<float>{1, 2}, ref, {.atol = 100}).ok);  // size mismatch
}

}  // namespace
}  // namespace sparrow
