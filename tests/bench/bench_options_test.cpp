// `sparrow bench`'s option parsing and report naming (the device part needs a GPU: bench/README.md).
#include <gtest/gtest.h>

#include "bench/bench_run.h"

namespace sparrow::bench {
namespace {

TEST(BenchOptions, CardSlugIsLowerCaseWithDashes) {
  EXPECT_EQ(card_slug("NVIDIA H200"), "nvidia-h200");
  EXPECT_EQ(card_slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
  EXPECT_EQ(card_slug("  a/b__c  "), "a-b-c");
  EXPECT_EQ(card_slug("***"), "unknown-gpu");
}

TEST(BenchOptions, SizesTakeAKSuffix) {
  auto v = parse_sizes("1,8,4k,128K,131072", "--contexts");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(*v, (std::vector<int64_t>{1, 8, 4096, 131072, 131072}));
  for (const char* bad : {"", "4q", "1,,2", "0", "k", "-1", "1.5k"}) {
    auto e = parse_sizes(bad, "--batches");
    EXPECT_FALSE(e.is_ok()) << bad;
    if (!e.is_ok()) {
      EXPECT_NE(e.status().message().find("--batches"), std::string::npos);
    }
  }
}

TEST(BenchOptions, LayersTakeRanges) {
  auto all = parse_layers("all");
  ASSERT_TRUE(all.is_ok());
  EXPECT_TRUE(all->empty());
  auto v = parse_layers("0-3,5,7-7");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(*v, (std::vector<int64_t>{0, 1, 2, 3, 5, 7}));
  for (const char* bad : {"3-1", "a", "1,", "-2", "1-"}) EXPECT_FALSE(parse_layers(bad).is_ok()) << bad;
}

}  // namespace
}  // namespace sparrow::bench
