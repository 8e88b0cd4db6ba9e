#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace sparrow {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int64_t n : {1, 2, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, int64_t{1} << 30, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, NestedLoopsRunSeriallyInside) {
  std::atomic<int64_t> total{0};
  parallel_for(8, int64_t{1} << 30, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(100, int64_t{1} << 30, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 800);
}

TEST(ThreadPool, SmallWorkRunsOnCaller) {
  int calls = 0;  // not atomic: must run on this thread only
  parallel_for(10, 1, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace sparrow
