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
  // REQUIRES: logits non-empty. Greedy ties go to the lower token id.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace sparrow
