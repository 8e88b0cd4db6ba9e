// Tap-by-tap comparison of two runs (`sparrow diff`): values with the shared comparator, selections
// (indexer top-k, expert choice) as sets. Finds the first divergence in execution order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/taps.h"

namespace sparrow {

struct DiffOptions {
  double value_tol = 1e-4;    // a value tap diverges when max|a-b|/max|a| exceeds this
  double min_overlap = 1.0;   // a selection tap diverges when some query keeps less than this
};

struct TapDiff {
  std::string name;
  int64_t layer = -1;
  bool selection = false;
  bool present_in_b = true;
  bool shape_mismatch = false;
  std::vector<int64_t> shape_a, shape_b;
  // values
  double rel_err = 0;          // max|a-b| / max|a|
  double max_abs_err = 0;
  double cosine_distance = 0;
  // selections: per query |A ∩ B| / |A| over valid (>= 0) entries
  double overlap_min = 1, overlap_mean = 1;
  bool diverged = false;
};

struct DiffReport {
  std::vector<TapDiff> taps;           // in A's execution order
  std::optional<size_t> first;         // index into taps of the first divergence
};

DiffReport diff_taps(const std::vector<TapRecord>& a, const std::vector<TapRecord>& b, const DiffOptions& opt);

// {"first_divergence": {"layer", "tap", "rel_err"} | null, "taps": [...]}
std::string diff_report_json(const DiffReport& r);
// A per-layer table and the first divergence, for people.
std::string diff_report_text(const DiffReport& r);

}  // namespace sparrow
