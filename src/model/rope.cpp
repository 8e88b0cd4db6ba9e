#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace sparrow {

namespace {

// The pair index at which a frequency completes `rotations` turns over the original context
// (the YaRN correction dimension).
double yarn_correction_dim(double rotations, int64_t dim, double theta, double original_max) {
  return static_cast<double>(dim) * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

}  // namespace

RopeTable rope_table_make(const RopeConfig& cfg, int64_t rope_dim) {
  RopeTable table;
  const int64_t half = rope_dim / 2;
  table.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i)
    table.inv_freq[i] = 1.0 / std::pow(cfg.theta, static_cast<double>(2 * i) / static_cast<double>(rope_dim));
  if (!cfg.yarn) return table;
  // Pairs below `lo` keep their frequency, pairs above `hi` are divided by the factor, and a linear
  // ramp blends in between (floor/ceil as transformers' truncating YaRN does).
  const double original = static_cast<double>(cfg.yarn_original_max_position);
  double lo = std::floor(yarn_correction_dim(cfg.yarn_beta_fast, rope_dim, cfg.theta, original));
  double hi = std::ceil(yarn_correction_dim(cfg.yarn_beta_slow, rope_dim, cfg.theta, original));
  lo = std::max(lo, 0.0);
  hi = std::min(hi, static_cast<double>(rope_dim - 1));
  if (hi == lo) hi += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    const double f = table.inv_freq[i];
    table.inv_freq[i] = f * (1.0 - ramp) + (f / cfg.yarn_factor) * ramp;
  }
  return table;
}

}  // namespace sparrow
