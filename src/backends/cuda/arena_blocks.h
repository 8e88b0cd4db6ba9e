// Offsets in a region of device memory, for the CUDA graphs' step arena (step_graph.h): a block a
// step frees is handed out again within the same step, so a captured step holds the peak of its
// temporaries, as the stream-ordered pool does op by op, rather than their sum. Plain C++ (tested on
// the CPU: tests/backends/arena_blocks_test.cpp).
//
// Blocks are rounded up to 256 bytes and handed out first fit among the freed ranges (the lowest
// offset that fits), else from the top; a freed block merges with free neighbours, and the top
// comes down when the highest range is free again. The same sequence of calls gives the same
// offsets, so a step of the same shape gets the same addresses. Reuse within a captured step is
// safe for the same reason as the pool's: the step's work runs in the order it was recorded, and a
// block is freed only after the last op reading it was recorded.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <unordered_map>

#include "core/check.h"

namespace sparrow::cuda {

class ArenaBlocks {
 public:
  static constexpr size_t kNone = SIZE_MAX;
  static constexpr size_t kAlign = 256;

  // Everything free, `capacity` bytes. REQUIRES no block handed out.
  void reset(size_t capacity) {
    SPARROW_CHECK(taken_.empty());
    cap_ = capacity;
    top_ = high_ = 0;
    free_.clear();
  }
  // The offset of a block of at least `bytes`, or kNone when none fits.
  size_t take(size_t bytes) {
    const size_t b = rounded(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < b) continue;
      const size_t off = it->first, rest = it->second - b;
      free_.erase(it);
      if (rest > 0) free_[off + b] = rest;
      taken_[off] = b;
      return off;
    }
    if (b > cap_ - top_) return kNone;
    const size_t off = top_;
    top_ += b;
    high_ = std::max(high_, top_);
    taken_[off] = b;
    return off;
  }
  // Gives back the block at `offset`. REQUIRES it came from take and was not given back.
  void give(size_t offset) {
    auto t = taken_.find(offset);
    SPARROW_CHECK(t != taken_.end() && "an arena block given back twice or never taken");
    size_t off = offset, b = t->second;
    taken_.erase(t);
    if (auto next = free_.find(off + b); next != free_.end()) {
      b += next->second;
      free_.erase(next);
    }
    if (auto prev = free_.lower_bound(off); prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == off) {
        off = prev->first;
        b += prev->second;
        free_.erase(prev);
      }
    }
    if (off + b == top_) top_ = off;  // the highest range: the top comes down
    else free_[off] = b;
  }
  static size_t rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }
  size_t live() const { return taken_.size(); }
  size_t top() const { return top_; }
  size_t high_water() const { return high_; }  // the highest top since reset
  size_t capacity() const { return cap_; }
  size_t free_ranges() const { return free_.size(); }

 private:
  size_t cap_ = 0, top_ = 0, high_ = 0;
  std::map<size_t, size_t> free_;               // offset -> bytes, below top_
  std::unordered_map<size_t, size_t> taken_;    // offset -> bytes
};

}  // namespace sparrow::cuda
