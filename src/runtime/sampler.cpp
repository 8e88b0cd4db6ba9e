#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/argmax.h"

namespace sparrow {

int32_t Sampler::sample(std::span<const float> logits) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (params_.temperature <= 0.0) return static_cast<int32_t>(argmax_first(logits.data(), V));
  // Candidates by descending logit, ties by lower id, so the order (and hence the draw) is fixed.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min(params_.top_k, V) : V;
  auto better = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(k);
  const double mx = logits[order[0]];
  std::vector<double> p(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += (p[i] = std::exp((logits[order[i]] - mx) / params_.temperature));
  // top-p: the shortest prefix whose mass reaches top_p (at least one token).
  int64_t keep = k;
  if (params_.top_p < 1.0) {
    double acc = 0;
    for (int64_t i = 0; i < k; ++i) {
      acc += p[i] / sum;
      if (acc >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (int64_t i = 0; i < keep; ++i) mass += p[i];
  const double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace sparrow
