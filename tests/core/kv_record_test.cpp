// The KV record codec (core/kv_record.h) against the reference's simulation of the same storage:
// decoding an encoded entry must give fp8_pow2_quant_sim's values on the nope dims and bf16's on
// the RoPE dims, bit for bit, over random entries and the blocks that reach the quantiser's edges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/kv_record.h"
#include "core/quant_sim.h"

namespace sparrow {
namespace {

// What the reference keeps for an entry: the nope dims FP8-simulated in blocks of 64, the rest bf16.
std::vector<float> simulated(std::vector<float> x, const KvRecordLayout& l) {
  fp8_pow2_quant_sim(x.data(), l.nope, kKvRecordBlock);
  for (int64_t i = l.nope; i < l.dim; ++i) x[i] = bf16_round(x[i]);
  return x;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << ": value " << i;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << ": value " << i << " decoded " << got[i] << ", simulated " << want[i];
  }
}

TEST(KvRecord, FlashLayoutIs584Bytes) {
  const KvRecordLayout l = kv_record_layout(512, 64);
  EXPECT_EQ(l.nope, 448);
  EXPECT_EQ(l.blocks, 7);
  EXPECT_EQ(l.scales_at, 448);
  EXPECT_EQ(l.rope_at, 456);  // 448 codes, 7 scales, 1 byte of padding
  EXPECT_EQ(l.bytes, 584);
  const KvRecordLayout even = kv_record_layout(128 + 64, 64);  // two scales: no padding
  EXPECT_EQ(even.rope_at, 130);
  EXPECT_EQ(even.bytes, 258);
  EXPECT_EQ(kv_record_layout(64, 0).bytes, 66);  // no RoPE dims (the padding stays: one layout rule)
  EXPECT_DEATH(kv_record_layout(500, 64), "");   // 436 nope dims: not whole blocks
  EXPECT_DEATH(kv_record_layout(64, 64), "");    // no nope dims
}

TEST(KvRecord, DecodeGivesTheSimulatedValues) {
  const KvRecordLayout l = kv_record_layout(512, 64);
  std::mt19937 gen(584);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<uint8_t> rec(static_cast<size_t>(l.bytes));
  std::vector<float> x(static_cast<size_t>(l.dim)), back(static_cast<size_t>(l.dim));
  for (int trial = 0; trial < 200; ++trial) {
    // Each block at its own magnitude, so the scales range widely.
    for (int64_t b = 0; b < l.dim / 64; ++b) {
      const float m = std::ldexp(1.0f, exponent(gen));
      for (int64_t i = 0; i < 64; ++i) x[b * 64 + i] = normal(gen) * m;
    }
    kv_record_encode(x.data(), l, rec.data());
    kv_record_decode(rec.data(), l, back.data());
    expect_same_bits(back, simulated(x, l), "trial " + std::to_string(trial));
    EXPECT_EQ(rec[l.scales_at + l.blocks], 0) << "the padding byte";
  }
}

TEST(KvRecord, EdgeBlocks) {
  const KvRecordLayout l = kv_record_layout(448 + 64, 64);
  std::vector<float> x(static_cast<size_t>(l.dim), 0.0f);
  // Block 0 all zero (the 1e-4 floor's scale); block 1 tiny values under the floor; block 2 the
  // e4m3 maximum at an exact power-of-two scale and values that round to it; block 3 a NaN among
  // normal values; block 4 negative zeros and ties of e4m3's rounding; block 5 huge values; block 6
  // subnormal codes next to a large value. RoPE dims: bf16 ties, a NaN, -0.
  for (int64_t i = 0; i < 64; ++i) x[64 + i] = (i % 2 ? 1e-7f : -3e-9f) * static_cast<float>(i);
  for (int64_t i = 0; i < 64; ++i) x[128 + i] = i == 0 ? 448.0f : (i % 3 == 0 ? 447.9f : -300.0f + static_cast<float>(i));
  for (int64_t i = 0; i < 64; ++i) x[192 + i] = i == 17 ? std::numeric_limits<float>::quiet_NaN() : 0.25f * static_cast<float>(i);
  for (int64_t i = 0; i < 64; ++i) x[256 + i] = i % 2 ? -0.0f : 1.0f + 0.0625f * static_cast<float>(i % 16);  // 1 + 1/16: a tie
  for (int64_t i = 0; i < 64; ++i) x[320 + i] = (i % 2 ? 1.0f : -1.0f) * 3.0e37f;
  for (int64_t i = 0; i < 64; ++i) x[384 + i] = i == 0 ? 1000.0f : 1e-3f * static_cast<float>(i);
  for (int64_t i = 0; i < 64; ++i) x[448 + i] = 1.0f + std::ldexp(1.0f, -8) * static_cast<float>(i);  // bf16 ties at odd i
  x[448 + 5] = std::numeric_limits<float>::quiet_NaN();
  x[448 + 6] = -0.0f;
  std::vector<uint8_t> rec(static_cast<size_t>(l.bytes));
  std::vector<float> back(static_cast<size_t>(l.dim));
  kv_record_encode(x.data(), l, rec.data());
  kv_record_decode(rec.data(), l, back.data());
  expect_same_bits(back, simulated(x, l), "edge blocks");
  EXPECT_TRUE(std::signbit(back[256 + 1])) << "-0 stays -0";
  EXPECT_TRUE(std::signbit(back[448 + 6])) << "-0 stays -0 in the RoPE dims";
  EXPECT_EQ(back[128], 448.0f);
  EXPECT_EQ(rec[l.scales_at + 2], 127) << "448 at scale 2^0";
}

}  // namespace
}  // namespace sparrow
