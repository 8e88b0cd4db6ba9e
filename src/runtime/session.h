// Runs token sequences through a Model on a Backend: batch assembly, one-shot or chunked prefill,
// token-by-token decode and greedy generation. The runtime owns the per-sequence states.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

// One sequence's share of a batch: the state it continues and its next tokens.
struct SequenceChunk {
  SequenceState* state;
  std::span<const int32_t> ids;
};

// Builds a BatchInfo whose positions continue each state. REQUIRES: distinct states.
BatchInfo batch_build(const std::vector<SequenceChunk>& chunks);

// Bytes of decode state one sequence of `context` tokens needs (the CPU backend's layout); the
// engine reserves this much per request against its state budget.
int64_t sequence_state_bytes_estimate(const ModelConfig& c, int64_t context);

// Checks every id is inside the vocabulary; the error names the first bad id and its position.
Status token_ids_check(std::span<const int32_t> ids, int64_t vocab_size);

class Session {
 public:
  Session(const Model& model, Backend& backend, ForwardOptions options = {})
      : model_(model), backend_(backend), options_(options) {}

  // Logits [T, V] (row-major) of every position of `ids`, fed `chunk` tokens per forward
  // (chunk <= 0: all at once; chunk = 1: token-by-token decode), starting from an empty state.
  Expected<std::vector<float>> logits(std::span<const int32_t> ids, int64_t chunk) const;

  // Greedy continuation: prefill `prompt`, then `n` decode steps; returns the n new ids.
  // The argmax is Backend::argmax_rows (ties to the lower token id; core/argmax.h), and each id
  // feeds the next step on the backend (BatchInfo::device_token_ids): the ids come back at the end.
  // With `step_seconds`, the host's wall time of each step is appended there (the prompt's first,
  // waited for; then one per decode step, queued: in a steady state the backend's step time; the
  // last one includes the wait for the queued work).
  Expected<std::vector<int32_t>> generate(std::span<const int32_t> prompt, int64_t n,
                                          std::vector<double>* step_seconds = nullptr) const;

 private:
  const Model& model_;
  Backend& backend_;
  ForwardOptions options_;
};

}  // namespace sparrow
