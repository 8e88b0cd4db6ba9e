// The one comparator every test and tool uses (style.md): shapes equal, NaN/Inf positions equal,
// each element within atol + rtol*|ref|, and a global cosine check. On failure the report names
// the worst element and its index.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sparrow {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
  // 1 - cos(got, ref) must not exceed this (fp64). Negative disables the check.
  double max_cosine_distance = -1.0;
  // max|got-ref| / max|ref| must not exceed this (the logit-parity metric). Negative: off.
  double max_rel_to_max = -1.0;
};

struct CompareResult {
  bool ok = true;
  int64_t count = 0;
  int64_t failures = 0;        // elements outside atol + rtol*|ref|
  int64_t worst_index = -1;    // element with the largest |got-ref| - (atol + rtol*|ref|)
  double worst_got = 0, worst_ref = 0;
  double max_abs_err = 0;
  double max_abs_ref = 0;
  double rel_to_max = 0;       // max_abs_err / max_abs_ref
  double cosine_distance = 0;
  std::string message;         // empty when ok
  std::string summary() const; // one line with all the numbers
};

CompareResult compare_f32(std::span<const float> got, std::span<const float> ref, const Tolerance& tol,
                          const std::vector<int64_t>& shape = {});

}  // namespace sparrow
