// The CUDA graphs' arena allocator (src/backends/cuda/arena_blocks.h), plain C++: blocks reused
// within a step, first fit, merged when freed, the top coming down, the same offsets for the same
// calls, and never two live blocks overlapping (checked against a byte map over random calls).
#include "backends/cuda/arena_blocks.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace sparrow::cuda {
namespace {

TEST(ArenaBlocks, FreedBlocksAreReusedFirstFitAndMerged) {
  ArenaBlocks a;
  a.reset(10 * 256);
  const size_t x = a.take(100), y = a.take(300), z = a.take(256);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 256u);  // 100 rounded to 256
  EXPECT_EQ(z, 768u);  // 300 rounded to 512
  EXPECT_EQ(a.top(), 1024u);
  a.give(x);
  EXPECT_EQ(a.take(200), 0u) << "the freed first block fits";
  a.give(0);
  a.give(y);  // merges with [0, 256): one free range [0, 768)
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.take(700), 0u) << "the merged range takes a block the parts could not";
  a.give(0);
  a.give(z);  // the highest block: the top comes down past the merged range
  EXPECT_EQ(a.top(), 0u);
  EXPECT_EQ(a.free_ranges(), 0u);
  EXPECT_EQ(a.live(), 0u);
  EXPECT_EQ(a.high_water(), 1024u);
}

TEST(ArenaBlocks, FullAndExactFit) {
  ArenaBlocks a;
  a.reset(4 * 256);
  EXPECT_EQ(a.take(4 * 256), 0u);
  EXPECT_EQ(a.take(1), ArenaBlocks::kNone);
  a.give(0);
  EXPECT_EQ(a.take(3 * 256), 0u);
  EXPECT_EQ(a.take(256), 768u);
  EXPECT_EQ(a.take(1), ArenaBlocks::kNone);
  EXPECT_EQ(a.live(), 2u);
}

// Random takes and gives against a byte map: live blocks never overlap and stay inside the region;
// replaying the same calls after a reset gives the same offsets; with everything given back the
// top is 0 again.
TEST(ArenaBlocks, RandomCallsNeverOverlapAndRepeat) {
  const size_t cap = 1 << 20;
  auto run = [&](uint64_t seed, std::vector<size_t>* offsets) {
    ArenaBlocks a;
    a.reset(cap);
    std::mt19937_64 rng(seed);
    std::map<size_t, size_t> live;  // offset -> rounded bytes
    std::vector<int> owner(cap / ArenaBlocks::kAlign, -1);
    for (int i = 0; i < 4000; ++i) {
      if (live.empty() || rng() % 3 != 0) {
        const size_t bytes = 1 + rng() % 20000;
        const size_t off = a.take(bytes);
        offsets->push_back(off);
        if (off == ArenaBlocks::kNone) continue;
        const size_t b = ArenaBlocks::rounded(bytes);
        ASSERT_LE(off + b, cap);
        ASSERT_EQ(off % ArenaBlocks::kAlign, 0u);
        for (size_t u = off / ArenaBlocks::kAlign; u < (off + b) / ArenaBlocks::kAlign; ++u) {
          ASSERT_EQ(owner[u], -1) << "block at " << off << " overlaps a live one";
          owner[u] = i;
        }
        live[off] = b;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        for (size_t u = it->first / ArenaBlocks::kAlign; u < (it->first + it->second) / ArenaBlocks::kAlign; ++u)
          owner[u] = -1;
        a.give(it->first);
        live.erase(it);
      }
      ASSERT_EQ(a.live(), live.size());
      ASSERT_LE(a.top(), a.high_water());
    }
    for (auto& [off, b] : live) a.give(off);
    EXPECT_EQ(a.top(), 0u);
    EXPECT_EQ(a.free_ranges(), 0u);
  };
  std::vector<size_t> first, second;
  run(7, &first);
  run(7, &second);
  EXPECT_EQ(first, second) << "the same calls gave other offsets";
}

}  // namespace
}  // namespace sparrow::cuda
