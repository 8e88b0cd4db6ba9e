#include "runtime/stream_generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace sparrow {

void logits_apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history, double penalty) {
  if (penalty == 1.0) return;
  std::vector<bool> seen(logits.size(), false);
  for (int32_t id : history) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || seen[id]) continue;
    seen[id] = true;
    float& l = logits[id];
    l = l > 0 ? static_cast<float>(l / penalty) : static_cast<float>(l * penalty);
  }
}

void logits_apply_min_p(std::span<float> logits, double min_p, double temperature) {
  if (min_p <= 0.0 || temperature <= 0.0 || logits.empty()) return;
  const float mx = *std::max_element(logits.begin(), logits.end());
  // p_i / p_max = exp((l_i - l_max) / T) >= min_p  <=>  l_i >= l_max + T ln(min_p).
  const double cut = mx + temperature * std::log(min_p);
  for (float& l : logits)
    if (l < cut) l = -std::numeric_limits<float>::infinity();
}

Status stream_generate_options_check(const StreamGenerateOptions& o) {
  const SamplingParams& s = o.sampling;
  if (!(s.temperature >= 0)) return Status::invalid_argument("temperature must be >= 0, got " + std::to_string(s.temperature));
  if (!(s.top_p > 0 && s.top_p <= 1)) return Status::invalid_argument("top-p must be in (0, 1], got " + std::to_string(s.top_p));
  if (s.top_k < 0) return Status::invalid_argument("top-k must be >= 0, got " + std::to_string(s.top_k));
  if (!(o.min_p >= 0 && o.min_p <= 1)) return Status::invalid_argument("min-p must be in [0, 1], got " + std::to_string(o.min_p));
  if (!(o.repetition_penalty > 0))
    return Status::invalid_argument("repetition penalty must be > 0, got " + std::to_string(o.repetition_penalty));
  if (o.max_new_tokens < 0) return Status::invalid_argument("the number of tokens to generate must be >= 0");
  return Status::ok();
}

Expected<GenerationResult> stream_generate(const Model& model, Backend& backend, std::span<const int32_t> prompt,
                                           const StreamGenerateOptions& options,
                                           const std::function<bool(int32_t)>& on_token) {
  SPARROW_RETURN_IF_ERROR(stream_generate_options_check(options));
  const int64_t V = model.config().vocab_size;
  SPARROW_RETURN_IF_ERROR(token_ids_check(prompt, V));
  if (prompt.empty()) return Status::invalid_argument("generation needs at least one prompt token");

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.reason = FinishReason::kLength;
  Sampler sampler(options.sampling);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  auto state = backend.create_sequence_state(model.config());
  std::vector<int32_t> next(prompt.begin(), prompt.end());
  // Greedy without a penalty (min-p does nothing at temperature 0) is the backend's argmax of the
  // row: one id comes back instead of V logits.
  const bool device_greedy = sampler.greedy() && options.repetition_penalty == 1.0;
  while (static_cast<int64_t>(result.tokens.size()) < options.max_new_tokens) {
    BatchInfo batch = batch_build({{state.get(), next}});
    const std::vector<int64_t> last_row = {batch.num_tokens() - 1};  // the head on that row alone
    Tensor logits = model.forward(backend, batch, {.logits_rows = &last_row});
    state->advance(static_cast<int64_t>(next.size()));
    int32_t id;
    if (device_greedy) {
      SPARROW_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, download_token_ids(backend, backend.argmax_rows(logits), V));
      id = ids.at(0);
    } else {
      std::vector<float> row = backend.download_f32(logits);
      logits_apply_repetition_penalty(row, history, options.repetition_penalty);
      logits_apply_min_p(row, options.min_p, options.sampling.temperature);
      id = sampler.sample(row);
    }
    result.tokens.push_back(id);
    history.push_back(id);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), id) != options.stop_tokens.end()) {
      result.reason = FinishReason::kStop;
      break;
    }
    if (on_token && !on_token(id)) {
      result.reason = FinishReason::kCancelled;
      break;
    }
    next.assign(1, id);
  }
  return result;
}

}  // namespace sparrow
