// The released formats' scalar codecs, code by code (spec §2.2): all 256 e4m3 codes, all 16 e2m1
// codes, the e8m0 edge codes, and the encoders' rounding (nearest, ties to even) and saturation
// checked against a brute-force nearest-code search over the decoded tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"

namespace sparrow {
namespace {

// The e4m3fn value of a code, written from the OCP definition independently of dtype.cpp:
// normal (-1)^s * 2^(E-7) * (1 + M/8), subnormal (-1)^s * 2^-6 * M/8, S.1111.111 = NaN.
double e4m3_reference(uint8_t c) {
  const int s = c >> 7, E = (c >> 3) & 15, M = c & 7;
  if (E == 15 && M == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = E == 0 ? std::ldexp(M / 8.0, -6) : std::ldexp(1.0 + M / 8.0, E - 7);
  return s ? -mag : mag;
}

// The code nearest to x among the finite non-negative codes of a table, ties to the even code,
// saturating at the largest; the sign is applied by the caller.
template <typename Decode>
uint8_t nearest_code(double a, int num_codes, Decode decode) {
  int best = 0;
  double best_err = std::fabs(decode(0) - a);
  for (int c = 1; c < num_codes; ++c) {
    const double v = decode(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

uint8_t e4m3_brute(float x) {
  const double a = std::min(std::fabs(static_cast<double>(x)), 448.0);
  return (std::signbit(x) ? 0x80 : 0) | nearest_code(a, 0x7F, [](uint8_t c) { return e4m3_reference(c); });
}

uint8_t e2m1_brute(float x) {
  const double a = std::min(std::fabs(static_cast<double>(x)), 6.0);
  return (std::signbit(x) ? 0x8 : 0) | nearest_code(a, 8, [](uint8_t c) { return double(e2m1_to_f32(c)); });
}

TEST(QuantE4m3, All256CodesDecodeExactly) {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const double ref = e4m3_reference(static_cast<uint8_t>(c));
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nan_codes;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), ref) << "code " << c;
    EXPECT_EQ(std::signbit(got), c >= 0x80) << "code " << c;  // 0x80 is -0
  }
  EXPECT_EQ(nan_codes, 2);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
}

TEST(QuantE4m3, EncodeOfDecodeIsIdentityOnEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if (c == 0x7F || c == 0xFF) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(QuantE4m3, MidpointsRoundToEvenAndMatchBruteForce) {
  // Every midpoint between neighbouring positive codes, and points just either side of it.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_f32(static_cast<uint8_t>(c)), hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact: both have few significant bits
    const uint8_t even = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "midpoint of codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | even);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1e9f)), c + 1);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log_mag(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(log_mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_e4m3(x), e4m3_brute(x)) << "x = " << x;
  }
}

TEST(QuantE4m3, SaturatesLikeTheReferenceClampThenCast) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(463.99f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // an unclamped RNE cast would give 480: not representable
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);            // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01);            // above half: rounds up
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// The reference's FP8 block quantisation as codes, against the spec written out in doubles: the
// scale 2^k the smallest power of two with max(|x|, 1e-4) / 2^k <= 448 (NaN skipped), each code the
// brute-force nearest of x / 2^k clamped; blocks of one magnitude each from 2^-30 to 2^30, an
// all-zero block, a block under the floor, one with a NaN, one at exactly 448.
TEST(QuantFp8Block, CodesAndScaleAreTheSpecs) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> mag(-30, 30);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = trial % 3 == 0 ? 45 : 128;
    std::vector<float> x(static_cast<size_t>(n));
    const float m = std::ldexp(1.0f, mag(rng));
    for (float& v : x) v = normal(rng) * m;
    if (trial == 1) std::fill(x.begin(), x.end(), 0.0f);
    if (trial == 2) for (float& v : x) v *= 1e-12f;
    if (trial == 4) x[7] = std::numeric_limits<float>::quiet_NaN();
    if (trial == 5) x[0] = 448.0f, x[1] = -448.0f;
    double amax = 1e-4;
    for (float v : x)
      if (!std::isnan(v)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    int k_ref = -127;
    while (amax / std::ldexp(1.0, k_ref) > 448.0) ++k_ref;
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    ASSERT_EQ(fp8_pow2_block_encode(x.data(), n, codes.data()), k_ref) << "trial " << trial << " amax " << amax;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t want = std::isnan(x[i]) ? 0x7F : e4m3_brute(static_cast<float>(x[i] / std::ldexp(1.0, k_ref)));
      ASSERT_EQ(codes[i], want) << "trial " << trial << " value " << i << " = " << x[i];
    }
  }
}

TEST(QuantE2m1, All16CodesDecodeExactly) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -mags[c & 7] : mags[c & 7];
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), want) << "code " << c;
    EXPECT_EQ(std::signbit(e2m1_to_f32(static_cast<uint8_t>(c))), (c & 8) != 0) << "code " << c;  // 8 is -0
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(QuantE2m1, MidpointsRoundToEvenAndSaturate) {
  // (value, code): midpoints go to the even code.
  const std::pair<float, uint8_t> cases[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},
                                             {3.5f, 6},  {5.0f, 6},  {5.01f, 7}, {6.5f, 7},  {1e9f, 7},
                                             {0.26f, 1}, {0.74f, 1}, {-0.1f, 8}, {-5.5f, 15}};
  for (auto [x, code] : cases) EXPECT_EQ(f32_to_e2m1(x), code) << "x = " << x;
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(f32_to_e2m1(-std::numeric_limits<float>::infinity()), 15);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(f32_to_e2m1(x), e2m1_brute(x)) << "x = " << x;
  }
  for (int c = 0; c < 7; ++c) {  // every midpoint and its neighbours
    const float lo = e2m1_to_f32(c), hi = e2m1_to_f32(c + 1), mid = (lo + hi) / 2;
    EXPECT_EQ(f32_to_e2m1(mid), e2m1_brute(mid));
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 9.0f)), c + 1);
  }
}

TEST(QuantE8m0, EdgeCodes) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));  // a float subnormal, still exact and non-zero
  EXPECT_GT(e8m0_to_f32(0), 0.0f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128);  // 2^-7: a numeric uint8 cast of this scale would give 0
  for (int k = -127; k <= 127; ++k) {
    EXPECT_EQ(e8m0_from_exponent(k), k + 127);
    EXPECT_EQ(e8m0_to_f32(e8m0_from_exponent(k)), std::ldexp(1.0f, k));
  }
}

TEST(QuantScale, PowerOfTwoScaleIsTheSmallestThatFits) {
  EXPECT_EQ(pow2_scale_exponent(448.0f, kE4m3Max), 0);      // exactly qmax: scale 1
  EXPECT_EQ(pow2_scale_exponent(449.0f, kE4m3Max), 1);
  EXPECT_EQ(pow2_scale_exponent(224.0f, kE4m3Max), -1);
  EXPECT_EQ(pow2_scale_exponent(225.0f, kE4m3Max), 0);
  EXPECT_EQ(pow2_scale_exponent(1.0f, kE4m3Max), -8);       // 1/448 in (2^-9, 2^-8]
  EXPECT_EQ(pow2_scale_exponent(6.0f, kE2m1Max), 0);
  EXPECT_EQ(pow2_scale_exponent(0.1f, kE2m1Max), -5);       // 0.1/6 = 0.0167 in (2^-6, 2^-5]
  EXPECT_EQ(pow2_scale_exponent(0.0f, kE4m3Max), 0);
  EXPECT_EQ(pow2_scale_exponent(1e30f, 1.0f), 100);         // 1e30 in (2^99, 2^100]
  EXPECT_EQ(pow2_scale_exponent(3e38f, 1e-10f), 127);       // clamped to e8m0's range
  EXPECT_EQ(pow2_scale_exponent(1e-40f, 448.0f), -127);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> log_mag(-60.0f, 60.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(log_mag(rng));
    for (float qmax : {kE4m3Max, kE2m1Max}) {
      const int k = pow2_scale_exponent(amax, qmax);
      ASSERT_LE(amax / std::ldexp(1.0f, k), qmax) << amax;
      ASSERT_GT(amax / std::ldexp(1.0f, k - 1), qmax) << amax;
    }
  }
}

}  // namespace
}  // namespace sparrow
