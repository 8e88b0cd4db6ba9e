// Next-token sampling from a logits row: greedy at temperature 0, else temperature, top-k, top-p
// with a per-request random stream, so a given seed always gives the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "sparrow/engine.h"  // SamplingParams

namespace sparrow {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  // REQUIRES: logits non-empty. Greedy: core/argmax.h's argmax_first (ties to the lower token id).
  int32_t sample(std::span<const float> logits);
  // Temperature 0: the choice is argmax_first, which a backend can make where the logits are
  // (Backend::argmax_rows) and which draws nothing from the random stream.
  bool greedy() const { return params_.temperature <= 0.0; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace sparrow
