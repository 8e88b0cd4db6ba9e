// Single-sequence generation with every token handed to a callback as soon as it is sampled
// (what `sparrow run` streams to the terminal), over Model::forward like Session.
//
// Sampling = the engine's Sampler (runtime/sampler.h: temperature, top-k, top-p, seeded draw;
// greedy with ties to the lower id at temperature 0) after two logit filters applied first:
//   1. repetition penalty (the CTRL / Hugging Face rule): every id already in the prompt or the
//      output has its logit divided by the penalty when positive, multiplied when negative;
//   2. min-p: ids whose probability at this temperature is below min_p times the largest are cut
//      (a cut relative to the most likely token, so it may come before top-k/top-p).
// For a given seed, inputs and build, the tokens are the same on every run.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/engine.h"
#include "sparrow/status.h"

namespace sparrow {

struct StreamGenerateOptions {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;            // temperature, top_p, top_k, seed
  double min_p = 0.0;                 // [0, 1]; 0: off
  double repetition_penalty = 1.0;    // > 0; 1: off
  std::vector<int32_t> stop_tokens;   // generation ends when one is sampled (it is not streamed)
};

// Multiplies or divides the logits of ids in `history` by `penalty` (each id once).
void logits_apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history, double penalty);
// Sets to -inf every logit below max + temperature * ln(min_p) (min_p's cut in logit space).
void logits_apply_min_p(std::span<float> logits, double min_p, double temperature);

Status stream_generate_options_check(const StreamGenerateOptions& o);

// Prefills `prompt`, then samples up to max_new_tokens ids. on_token(id) runs for each sampled id
// that is not a stop token; returning false ends generation (reason kCancelled). The result's
// tokens include a final stop token when one ended generation.
Expected<GenerationResult> stream_generate(const Model& model, Backend& backend, std::span<const int32_t> prompt,
                                           const StreamGenerateOptions& options,
                                           const std::function<bool(int32_t)>& on_token);

}  // namespace sparrow
