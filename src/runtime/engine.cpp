// The engine: a scheduler thread running continuous batching over Model::forward.
//
// Invariants: `queue_` (guarded by mu_) holds admitted-for-later requests in arrival order;
// `running_` is touched by the engine thread only. A running request is either prefilling
// (fed < prompt size) or decoding (its next input is its last generated token). Each step feeds
// every decoding request one token and then prompt chunks, oldest request first, up to the step
// token budget. Because every CPU op computes a token's values from that token's inputs alone, a
// request's logits (and so its greedy tokens) do not depend on its batch neighbours.
#include "sparrow/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "core/quant_sim.h"
#include "model/model.h"
#include "runtime/backend_factory.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace sparrow {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

// The CPU backend's layout; the engine itself asks its backend (Backend::sequence_state_bytes).
int64_t sequence_state_bytes_estimate(const ModelConfig& c, int64_t context) {
  return sequence_state_bytes_reference(c, context);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Running {
  uint64_t id = 0;
  GenerationRequest request;
  EventCallback callback;
  std::unique_ptr<SequenceState> state;
  Sampler sampler;
  int64_t reserved_bytes = 0;
  int64_t fed = 0;                 // prompt tokens absorbed
  std::vector<int32_t> generated;
  std::vector<int32_t> next_input; // a decoding request's next token
  Clock::time_point arrived;
  bool cancelled = false;  // cancel() asked for it
  bool done = false;       // finished (stop, length or cancel): leaves `running` after the step

  Running(uint64_t i, GenerationRequest r, EventCallback cb)
      : id(i), request(std::move(r)), callback(std::move(cb)), sampler(request.sampling), arrived(Clock::now()) {}
  bool decoding() const { return fed == static_cast<int64_t>(request.prompt.size()); }
};

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;

  mutable std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<std::unique_ptr<Running>> queue;  // guarded by mu
  std::set<uint64_t> cancels;                  // guarded by mu
  std::vector<std::unique_ptr<Running>> running;  // engine thread only
  int64_t running_count = 0;                   // guarded by mu (mirror of running.size())
  int64_t reserved_bytes = 0;                  // guarded by mu
  bool accepting = true, stopping = false;     // guarded by mu
  bool cancel_all = false;                     // guarded by mu: shutdown without finishing
  uint64_t next_id = 1;                        // guarded by mu
  EngineStats counters;                        // guarded by mu (queued/running filled on read)
  std::thread thread;

  void loop();
  void step();
  void finish(Running& r, FinishReason reason, Status status = Status::ok());
};

void Engine::Impl::finish(Running& r, FinishReason reason, Status status) {
  GenerationEvent ev;
  ev.id = r.id;
  ev.finished = true;
  ev.reason = reason;
  ev.status = std::move(status);
  ev.prompt_tokens = static_cast<int64_t>(r.request.prompt.size());
  ev.completion_tokens = static_cast<int64_t>(r.generated.size());
  r.state.reset();  // the state is freed before anyone hears the request is over
  {
    std::lock_guard<std::mutex> lock(mu);
    reserved_bytes -= r.reserved_bytes;
    ++counters.requests_finished;
  }
  r.reserved_bytes = 0;
  if (r.callback) r.callback(ev);
}

void Engine::Impl::loop() {
  for (;;) {
    std::vector<std::unique_ptr<Running>> cancelled_queued;
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock, [&] { return stopping || cancel_all || !queue.empty() || !running.empty() || !cancels.empty(); });
      if (stopping && queue.empty() && running.empty()) break;
      if (cancel_all) {
        for (auto& r : queue) cancels.insert(r->id);
        for (auto& r : running) cancels.insert(r->id);
        cancel_all = false;
      }
      for (uint64_t id : cancels) {
        auto it = std::find_if(queue.begin(), queue.end(), [&](auto& r) { return r->id == id; });
        if (it != queue.end()) {
          cancelled_queued.push_back(std::move(*it));
          queue.erase(it);
        }
        for (auto& r : running)
          if (r->id == id) r->cancelled = true;
      }
      cancels.clear();
      // Admission: oldest first while a batch slot and the state budget allow.
      while (static_cast<int64_t>(running.size()) < options.max_batch && !queue.empty()) {
        Running& r = *queue.front();
        const int64_t ctx = static_cast<int64_t>(r.request.prompt.size()) + r.request.max_tokens;
        const int64_t bytes = backend->sequence_state_bytes(model->config(), ctx);
        if (reserved_bytes + bytes > options.state_budget_bytes) break;  // waits for memory
        reserved_bytes += bytes;
        r.reserved_bytes = bytes;
        running.push_back(std::move(queue.front()));
        queue.pop_front();
      }
      running_count = static_cast<int64_t>(running.size());
    }
    for (auto& r : cancelled_queued) finish(*r, FinishReason::kCancelled);
    for (auto& r : running)
      if (r->cancelled) {
        finish(*r, FinishReason::kCancelled);
        r->done = true;
      }
    std::erase_if(running, [](auto& r) { return r->done; });
    if (!running.empty()) step();
    std::lock_guard<std::mutex> lock(mu);
    running_count = static_cast<int64_t>(running.size());
    if (queue.empty() && running.empty()) idle.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu);
  running_count = 0;
  idle.notify_all();
}

void Engine::Impl::step() {
  const int64_t V = model->config().vocab_size;
  std::vector<SequenceChunk> chunks;
  std::vector<Running*> members;
  int64_t budget = options.step_token_budget;
  for (auto& r : running) {
    if (!r->state) r->state = backend->create_sequence_state(model->config());
    if (r->decoding()) {
      chunks.push_back({r->state.get(), r->next_input});
      members.push_back(r.get());
      --budget;
    }
  }
  for (auto& r : running) {
    if (r->decoding() || budget <= 0) continue;
    const int64_t left = static_cast<int64_t>(r->request.prompt.size()) - r->fed;
    const int64_t n = std::min(left, budget);
    chunks.push_back({r->state.get(), std::span<const int32_t>(r->request.prompt).subspan(r->fed, n)});
    members.push_back(r.get());
    budget -= n;
  }
  if (chunks.empty()) return;
  BatchInfo batch = batch_build(chunks);
  // Only each sequence's last token can need a sample: the head runs on those rows alone.
  std::vector<int64_t> last_rows;
  for (size_t s = 0; s < members.size(); ++s) last_rows.push_back(batch.seq_end[s] - 1);
  const Tensor logits = model->forward(*backend, batch, {.logits_rows = &last_rows});
  int64_t prompt_tokens = 0, new_tokens = 0;
  std::vector<bool> emits(members.size(), false);
  bool any_greedy = false;
  std::vector<int64_t> sampled_rows;  // rows whose member draws from its logits this step
  for (size_t s = 0; s < members.size(); ++s) {
    Running& r = *members[s];
    const int64_t n = batch.seq_end[s] - batch.seq_begin[s];
    r.state->advance(n);
    if (!r.decoding()) {
      r.fed += n;
      prompt_tokens += n;
      if (!r.decoding()) continue;  // more prompt to feed; no token yet
    }
    emits[s] = true;
    if (r.sampler.greedy()) any_greedy = true;
    else sampled_rows.push_back(static_cast<int64_t>(s));
  }
  // Greedy rows take their id from the backend's argmax (T ids come back); only the sampled rows'
  // logits are downloaded.
  std::vector<int32_t> greedy_ids;
  if (any_greedy) {
    Expected<std::vector<int32_t>> ids = download_token_ids(*backend, backend->argmax_rows(logits), V);
    if (!ids.is_ok()) {  // a backend bug: the step's requests end with it rather than feed a bad id on
      for (size_t s = 0; s < members.size(); ++s)
        if (emits[s]) {
          finish(*members[s], FinishReason::kError, ids.status());
          members[s]->done = true;
        }
      std::erase_if(running, [](auto& r) { return r->done; });
      return;
    }
    greedy_ids = std::move(ids).value();
  }
  std::vector<float> sampled;
  if (!sampled_rows.empty())
    sampled = backend->download_f32(static_cast<int64_t>(sampled_rows.size()) == logits.dim(0)
                                        ? logits
                                        : backend->gather_rows(logits, sampled_rows));
  size_t next_sampled = 0;
  for (size_t s = 0; s < members.size(); ++s) {
    if (!emits[s]) continue;
    Running& r = *members[s];
    int32_t token;
    if (r.sampler.greedy()) {
      token = greedy_ids.at(s);
    } else {
      const float* row = sampled.data() + static_cast<int64_t>(next_sampled++) * V;
      token = r.sampler.sample(std::span<const float>(row, V));
    }
    r.generated.push_back(token);
    r.next_input.assign(1, token);
    ++new_tokens;
    GenerationEvent ev;
    ev.id = r.id;
    ev.tokens = {token};
    ev.prompt_tokens = static_cast<int64_t>(r.request.prompt.size());
    ev.completion_tokens = static_cast<int64_t>(r.generated.size());
    if (r.generated.size() == 1) ev.time_to_first_token_s = std::chrono::duration<double>(Clock::now() - r.arrived).count();
    const bool stop = std::find(r.request.stop_tokens.begin(), r.request.stop_tokens.end(), token) !=
                      r.request.stop_tokens.end();
    const bool length = static_cast<int64_t>(r.generated.size()) >= r.request.max_tokens;
    if (r.callback) r.callback(ev);
    if (stop || length) {
      finish(r, stop ? FinishReason::kStop : FinishReason::kLength);
      r.done = true;
    }
  }
  std::erase_if(running, [](auto& r) { return r->done; });
  std::lock_guard<std::mutex> lock(mu);
  counters.tokens_in += prompt_tokens;
  counters.tokens_out += new_tokens;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Expected<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  if (options.max_batch < 1) return Status::invalid_argument("max_batch must be >= 1");
  if (options.step_token_budget < 1) return Status::invalid_argument("step_token_budget must be >= 1");
  if (options.max_context < 2) return Status::invalid_argument("max_context must be >= 2");
  if (options.max_queue < 0) return Status::invalid_argument("max_queue must be >= 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  SPARROW_ASSIGN_OR_RETURN(impl->backend, backend_create(options.backend));
  ModelOverrides overrides;
  if (options.precision == "auto") overrides.precision = default_precision(options.backend);
  else if (auto p = precision_from_name(options.precision)) overrides.precision = *p;
  else return Status::invalid_argument("precision '" + options.precision + "' is not auto, fp32, deepseek-ref or fast");
  if (options.index_keys != "auto") {
    auto k = key_precision_from_name(options.index_keys);
    if (!k) return Status::invalid_argument("index_keys '" + options.index_keys + "' is not auto, fp32, bf16, fp8 or fp4");
    overrides.index_keys = *k;
  }
  if (options.index_topk < 0) return Status::invalid_argument("index_topk must be >= 0 (0: config.json's)");
  if (options.index_topk > 0) overrides.index_topk = options.index_topk;
  auto weights = attn_weights_from_name(options.attn_weights);
  if (!weights.is_ok()) return weights.status().with_context("attn_weights");
  overrides.attn_weights_bf16 = *weights;
  SPARROW_ASSIGN_OR_RETURN(impl->model, Model::load(options.model_dir, overrides));
  SPARROW_RETURN_IF_ERROR(impl->model->check_backend(*impl->backend));
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->loop(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::~Engine() {
  shutdown(/*finish=*/false);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->thread.join();
}

Expected<uint64_t> Engine::enqueue(GenerationRequest request, EventCallback on_event) {
  const ModelConfig& c = impl_->model->config();
  if (request.prompt.empty()) return Status::invalid_argument("prompt: at least one token is required");
  SPARROW_RETURN_IF_ERROR(token_ids_check(request.prompt, c.vocab_size).with_context("prompt"));
  if (request.max_tokens < 1)
    return Status::invalid_argument("max_tokens: must be >= 1, got " + std::to_string(request.max_tokens));
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt >= impl_->options.max_context)
    return Status::invalid_argument("prompt: " + std::to_string(prompt) + " tokens do not fit the context of " +
                                    std::to_string(impl_->options.max_context));
  if (request.max_tokens > impl_->options.max_context - prompt)
    return Status::invalid_argument("max_tokens: " + std::to_string(request.max_tokens) + " plus the prompt's " +
                                    std::to_string(prompt) + " tokens exceed the context of " +
                                    std::to_string(impl_->options.max_context));
  const SamplingParams& sp = request.sampling;
  if (!(sp.temperature >= 0.0) || sp.temperature > 100.0)
    return Status::invalid_argument("temperature: must be in [0, 100], got " + std::to_string(sp.temperature));
  if (!(sp.top_p > 0.0 && sp.top_p <= 1.0))
    return Status::invalid_argument("top_p: must be in (0, 1], got " + std::to_string(sp.top_p));
  if (sp.top_k < 0) return Status::invalid_argument("top_k: must be >= 0, got " + std::to_string(sp.top_k));
  for (int32_t t : request.stop_tokens)
    if (t < 0 || t >= c.vocab_size) return Status::invalid_argument("stop token " + std::to_string(t) + " is outside the vocabulary");
  const int64_t bytes = impl_->backend->sequence_state_bytes(c, prompt + request.max_tokens);
  if (bytes > impl_->options.state_budget_bytes)
    return Status::invalid_argument("max_tokens: the request needs " + std::to_string(bytes) +
                                    " bytes of decode state, more than the engine's whole budget");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->accepting) return Status::unavailable("the engine is shutting down");
  if (static_cast<int64_t>(impl_->queue.size()) >= impl_->options.max_queue)
    return Status::unavailable("the request queue is full (" + std::to_string(impl_->options.max_queue) + ")");
  const uint64_t id = impl_->next_id++;
  impl_->queue.push_back(std::make_unique<Running>(id, std::move(request), std::move(on_event)));
  impl_->wake.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cancels.insert(id);
  impl_->wake.notify_all();
}

Expected<GenerationResult> Engine::generate(GenerationRequest request) {
  auto done = std::make_shared<std::promise<GenerationResult>>();
  auto result = std::make_shared<GenerationResult>();
  result->prompt_tokens = static_cast<int64_t>(request.prompt.size());
  auto id = enqueue(std::move(request), [done, result](const GenerationEvent& ev) {
    result->tokens.insert(result->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) {
      result->reason = ev.reason;
      done->set_value(*result);
    }
  });
  if (!id.is_ok()) return id.status();
  return done->get_future().get();
}

void Engine::shutdown(bool finish) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->accepting = false;
  if (!finish) impl_->cancel_all = true;
  impl_->wake.notify_all();
  impl_->idle.wait(lock, [&] { return impl_->queue.empty() && impl_->running_count == 0; });
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->counters;
  s.queued = static_cast<int64_t>(impl_->queue.size());
  s.running = impl_->running_count;
  s.state_bytes = impl_->reserved_bytes;
  return s;
}

const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::vocab_size() const { return impl_->model->config().vocab_size; }
int64_t Engine::eos_token_id() const { return impl_->model->config().eos_token_id; }

}  // namespace sparrow
