// RoPE/YaRN frequency tables against the values in spec §9 (V4-Flash: θ=160000, 64 rope dims,
// YaRN factor 16 over 65536 original positions, β 32/1).
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope.h"

namespace sparrow {
namespace {

TEST(Rope, PlainTableIsThetaPowers) {
  const RopeTable t = rope_table_make({.theta = 10000.0}, 64);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  EXPECT_DOUBLE_EQ(t.inv_freq[0], 1.0);
  EXPECT_NEAR(t.inv_freq[1], std::pow(10000.0, -2.0 / 64), 1e-15);
  EXPECT_NEAR(t.inv_freq[31], std::pow(10000.0, -62.0 / 64), 1e-15);
}

TEST(Rope, YarnTableMatchesSpecValues) {
  const RopeConfig flash{.theta = 160000.0, .yarn = true, .yarn_factor = 16.0, .yarn_original_max_position = 65536,
                         .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0};
  const RopeTable t = rope_table_make(flash, 64);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  EXPECT_DOUBLE_EQ(t.inv_freq[0], 1.0);
  EXPECT_NEAR(t.inv_freq[1], 0.6877, 1e-4);       // spec §9
  EXPECT_NEAR(t.inv_freq[31], 5.681e-7, 1e-10);   // spec §9
  // lo = 15, hi = 25: pairs up to 15 keep θ^(-2i/64); from 25 on they are divided by 16.
  for (int i = 0; i <= 15; ++i) EXPECT_NEAR(t.inv_freq[i], std::pow(160000.0, -2.0 * i / 64), 1e-15) << i;
  for (int i = 25; i < 32; ++i) EXPECT_NEAR(t.inv_freq[i], std::pow(160000.0, -2.0 * i / 64) / 16, 1e-18) << i;
  // Pair 20 is halfway along the ramp.
  const double f20 = std::pow(160000.0, -40.0 / 64);
  EXPECT_NEAR(t.inv_freq[20], f20 * 0.5 + f20 / 16 * 0.5, 1e-15);
}

}  // namespace
}  // namespace sparrow
