// The engine API: the only thing a server (or any embedding program) needs to see.
//
// An Engine owns a model, a backend and a scheduler thread running continuous batching: new
// requests' prompts are fed in chunks under a per-step token budget, mixed with one decode token of
// every running request. Per-request decode state comes from a pool with a memory budget; a request
// that does not fit waits, and enqueue refuses with kUnavailable once the queue is full.
// A request's tokens at temperature 0 do not depend on which other requests share its batches.
//
// Thread-safety: every method may be called from any thread. Event callbacks run on the engine's
// thread, in order per request; they must return quickly and must not call back into the engine
// except cancel(). No exception crosses this API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparrow/status.h"

namespace sparrow {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy (ties to the lower token id)
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;         // the same seed and inputs give the same tokens
};

struct GenerationRequest {
  std::vector<int32_t> prompt;       // token ids, at least one
  int64_t max_tokens = 16;           // new tokens at most
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // generation ends after emitting one of these
};

enum class FinishReason : uint8_t {
  kStop,       // a stop token was generated
  kLength,     // max_tokens reached
  kCancelled,  // cancel() or engine shutdown
  kError,
};

struct GenerationEvent {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // tokens new since the previous event of this request
  bool finished = false;
  FinishReason reason = FinishReason::kStop;  // valid when finished
  Status status;                              // non-OK with kError
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;              // so far
  double time_to_first_token_s = 0;           // set on the event carrying the first token
};

using EventCallback = std::function<void(const GenerationEvent&)>;

struct GenerationResult {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kStop;
  int64_t prompt_tokens = 0;
};

struct EngineOptions {
  std::string model_dir;
  std::string backend = "cpu";
  int64_t max_batch = 32;          // requests decoding together
  int64_t step_token_budget = 256; // tokens per forward (prefill chunks + decode tokens)
  int64_t max_context = 4096;      // prompt + max_tokens of one request
  int64_t max_queue = 256;         // waiting requests before enqueue refuses
  int64_t state_budget_bytes = int64_t{1} << 30;  // per-request decode state, all requests together
  // Numerics, as the CLI's --precision / --index-keys / --index-topk / --attn-weights: "auto" (fast
  // on cuda, fp32 on cpu), "fp32", "deepseek-ref" or "fast"; "auto" (the profile's), "fp32", "bf16",
  // "fp8" or "fp4"; 0 keeps config.json's; "auto" (the profile's), "fp32" or "bf16".
  std::string precision = "auto";
  std::string index_keys = "auto";
  int64_t index_topk = 0;
  std::string attn_weights = "auto";
};

struct EngineStats {
  int64_t queued = 0;
  int64_t running = 0;
  int64_t tokens_in = 0;    // prompt tokens processed
  int64_t tokens_out = 0;   // tokens generated
  int64_t state_bytes = 0;  // decode state reserved now
  int64_t requests_finished = 0;
};

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(const EngineOptions& options);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // cancels what is still queued or running, then stops the thread

  // Validates and queues a request. Errors: kInvalidArgument naming the bad field (empty prompt,
  // an id outside the vocabulary, max_tokens < 1, prompt + max_tokens over max_context),
  // kUnavailable when the queue is full or the engine is shutting down.
  Expected<uint64_t> enqueue(GenerationRequest request, EventCallback on_event);
  // Ends a queued or running request now (its state is freed before the next step); its callback
  // gets a final kCancelled event. Unknown or finished ids are ignored.
  void cancel(uint64_t id);
  // enqueue + wait: the whole result.
  Expected<GenerationResult> generate(GenerationRequest request);
  // Stops admitting requests; with `finish` running and queued ones complete, else they are
  // cancelled. Returns once nothing is in flight.
  void shutdown(bool finish);

  EngineStats stats() const;
  const EngineOptions& options() const;  // as given to create()
  int64_t vocab_size() const;
  int64_t eos_token_id() const;  // -1 if the model has none

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

}  // namespace sparrow
