// Greedy choice over a row of logits, the rule every greedy path uses (Session::generate, the
// sampler at temperature 0, the needle tool, and Backend::argmax_rows on every backend): the index
// of the largest value, ties to the lowest index; a NaN counts as larger than any number (the first
// NaN wins, as torch.argmax does), so a row gone bad shows as such rather than as an arbitrary id.
#pragma once

#include <cmath>
#include <cstdint>

namespace sparrow {

// REQUIRES: n > 0.
inline int64_t argmax_first(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(x[best])) break;
    if (std::isnan(x[i]) || x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace sparrow
