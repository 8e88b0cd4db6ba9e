// The engine: continuous batching, batch invariance (traps.md row 11), admission control,
// cancellation, sampling reproducibility, request validation.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "core/argmax.h"
#include "io/config_json.h"
#include "model/model.h"
#include "runtime/session.h"
#include "sparrow/engine.h"

namespace sparrow {
namespace {

const std::string kModel = std::string(SPARROW_FIXTURES_DIR) + "/mixed_hc2";

std::unique_ptr<Engine> make(EngineOptions o = {}) {
  o.model_dir = kModel;
  auto e = Engine::create(o);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return std::move(e).value();
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back((i * 31 + j * 7 + 3) % 128);
  return p;
}

TEST(Engine, GreedyOutputIsTheSameAloneAndAmong31Others) {
  auto engine = make({.max_batch = 32, .step_token_budget = 64});
  const auto target = greedy(prompt_of(0, 40), 24);
  const auto alone = engine->generate(target);
  ASSERT_TRUE(alone.is_ok()) << alone.status().to_string();
  ASSERT_EQ(alone->tokens.size(), 24u);
  // The same request, submitted among 31 others of different lengths, so its prompt is chunked
  // differently and its decode steps share batches with other requests' prefill.
  std::vector<std::future<Expected<GenerationResult>>> others;
  for (int i = 1; i <= 31; ++i)
    others.push_back(std::async(std::launch::async, [&, i] { return engine->generate(greedy(prompt_of(i, 5 + 3 * i), 8 + i % 9)); }));
  auto crowded = std::async(std::launch::async, [&] { return engine->generate(target); });
  const auto together = crowded.get();
  for (auto& f : others) EXPECT_TRUE(f.get().is_ok());
  ASSERT_TRUE(together.is_ok());
  EXPECT_EQ(together->tokens, alone->tokens);
  EXPECT_EQ(engine->stats().state_bytes, 0) << "every request's state must be freed";
}

// precision "auto" (the default) is the backend's profile: fp32 on the CPU, the same tokens as
// naming it; a name that is no profile is refused, naming the accepted ones.
TEST(Engine, PrecisionAutoIsTheBackendsDefault) {
  const auto request = greedy(prompt_of(5, 30), 12);
  const auto by_default = make()->generate(request);
  const auto named = make({.precision = "fp32"})->generate(request);
  ASSERT_TRUE(by_default.is_ok() && named.is_ok());
  EXPECT_EQ(by_default->tokens, named->tokens);
  auto bad = Engine::create({.model_dir = kModel, .precision = "fp16"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("is not auto, fp32, deepseek-ref or fast"), std::string::npos)
      << bad.status().message();
  // attn_weights: a bad name is refused naming the option and the accepted names.
  auto bad_weights = Engine::create({.model_dir = kModel, .attn_weights = "fp16"});
  ASSERT_FALSE(bad_weights.is_ok());
  EXPECT_EQ(bad_weights.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_weights.status().message().find("attn_weights: 'fp16' is not auto, fp32 or bf16"), std::string::npos)
      << bad_weights.status().message();
}

TEST(Engine, SeededSamplingIsReproducible) {
  auto engine = make();
  GenerationRequest r = greedy(prompt_of(3, 12), 20);
  r.sampling = {.temperature = 0.9, .top_p = 0.9, .top_k = 50, .seed = 42};
  const auto a = engine->generate(r), b = engine->generate(r);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
  r.sampling.seed = 43;
  const auto c = engine->generate(r);
  EXPECT_NE(c->tokens, a->tokens) << "a different seed should give different samples here";
}

// A step whose rows are partly greedy (ids from Backend::argmax_rows) and partly sampled (only those
// rows' logits downloaded, by gather_rows): each request gets the tokens it gets alone, and the
// greedy ones are the argmax of the logits Session::logits gives for the same ids.
TEST(Engine, GreedyAndSampledRowsShareAStep) {
  auto engine = make({.max_batch = 8, .step_token_budget = 64});
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = greedy(prompt_of(10 + i, 6 + 5 * i), 10);
    if (i % 2 == 1) r.sampling = {.temperature = 0.8, .top_p = 0.95, .top_k = 40, .seed = static_cast<uint64_t>(7 + i)};
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) {
    const auto g = engine->generate(r);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    alone.push_back(g->tokens);
  }
  std::vector<std::future<Expected<GenerationResult>>> together;
  for (const auto& r : requests)
    together.push_back(std::async(std::launch::async, [&engine, r] { return engine->generate(r); }));
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto g = together[i].get();
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_EQ(g->tokens, alone[i]) << "request " << i;
  }
  // The greedy requests' tokens against the host rule over full logits.
  const std::filesystem::path dir = kModel;
  auto model = Model::load(dir);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto cpu = make_cpu_backend();
  const Session session(**model, *cpu);
  const int64_t V = (*model)->config().vocab_size;
  for (size_t i = 0; i < requests.size(); i += 2) {
    std::vector<int32_t> ids = requests[i].prompt;
    ids.insert(ids.end(), alone[i].begin(), alone[i].end() - 1);
    const auto logits = session.logits(ids, 0);
    ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
    const int64_t P = static_cast<int64_t>(requests[i].prompt.size());
    for (size_t k = 0; k < alone[i].size(); ++k)
      EXPECT_EQ(alone[i][k], argmax_first(logits->data() + (P - 1 + static_cast<int64_t>(k)) * V, V))
          << "request " << i << ", token " << k;
  }
}

TEST(Engine, StopTokensEndGeneration) {
  auto engine = make();
  auto free_run = engine->generate(greedy(prompt_of(5, 10), 12));
  ASSERT_TRUE(free_run.is_ok());
  GenerationRequest r = greedy(prompt_of(5, 10), 12);
  r.stop_tokens = {free_run->tokens[3]};
  const auto stopped = engine->generate(r);
  ASSERT_TRUE(stopped.is_ok());
  EXPECT_EQ(stopped->reason, FinishReason::kStop);
  const auto first = std::find(free_run->tokens.begin(), free_run->tokens.end(), free_run->tokens[3]);
  EXPECT_EQ(stopped->tokens, std::vector<int32_t>(free_run->tokens.begin(), first + 1));
  EXPECT_EQ(free_run->reason, FinishReason::kLength);
}

TEST(Engine, InvalidRequestsNameTheField) {
  auto engine = make({.max_context = 64});
  auto expect = [&](GenerationRequest r, const std::string& field) {
    auto id = engine->enqueue(std::move(r), {});
    ASSERT_FALSE(id.is_ok());
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(field), std::string::npos) << id.status().message();
  };
  expect(greedy({}, 4), "prompt");
  expect(greedy({1, 500}, 4), "prompt");
  expect(greedy({1, 2}, 0), "max_tokens");
  expect(greedy(prompt_of(1, 60), 10), "max_tokens");
  expect(greedy(prompt_of(1, 70), 1), "prompt");
  GenerationRequest r = greedy({1}, 2);
  r.sampling.top_p = 0;
  expect(r, "top_p");
  r = greedy({1}, 2);
  r.sampling.temperature = -1;
  expect(r, "temperature");
}

TEST(Engine, FullQueueRefusesAndCancelFreesState) {
  // One slot and a queue of two: the third waiting request is refused with kUnavailable.
  auto engine = make({.max_batch = 1, .step_token_budget = 4, .max_queue = 2});
  std::promise<void> first_token;
  std::atomic<bool> seen{false};
  std::promise<FinishReason> long_end;
  auto long_id = engine->enqueue(greedy(prompt_of(1, 30), 500), [&](const GenerationEvent& ev) {
    if (!ev.tokens.empty() && !seen.exchange(true)) first_token.set_value();
    if (ev.finished) long_end.set_value(ev.reason);
  });
  ASSERT_TRUE(long_id.is_ok());
  first_token.get_future().wait();  // running now, holding the only slot
  ASSERT_TRUE(engine->enqueue(greedy({1}, 2), {}).is_ok());
  ASSERT_TRUE(engine->enqueue(greedy({2}, 2), {}).is_ok());
  auto refused = engine->enqueue(greedy({3}, 2), {});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  engine->cancel(*long_id);
  EXPECT_EQ(long_end.get_future().get(), FinishReason::kCancelled);
  engine->shutdown(/*finish=*/true);
  EXPECT_EQ(engine->stats().state_bytes, 0);
  EXPECT_EQ(engine->stats().running, 0);
  EXPECT_FALSE(engine->enqueue(greedy({1}, 2), {}).is_ok()) << "no admission after shutdown";
}

TEST(Engine, StateBudgetMakesRequestsWaitInsteadOfFailing) {
  // A budget that fits one request's state at a time: all still complete, one after another.
  const ModelConfig config = model_config_load(kModel).value();
  const int64_t one = sequence_state_bytes_estimate(config, 20 + 6);
  auto engine = make({.state_budget_bytes = one + one / 2});
  std::atomic<int64_t> max_running{0};
  std::vector<std::promise<void>> done(4);
  for (int i = 0; i < 4; ++i) {
    auto id = engine->enqueue(greedy(prompt_of(i, 20), 6), [&, i](const GenerationEvent& ev) {
      int64_t seen = max_running.load();
      const int64_t now = engine->stats().running;
      while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
      }
      if (ev.finished) {
        EXPECT_EQ(ev.completion_tokens, 6);
        done[i].set_value();
      }
    });
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  }
  for (auto& d : done) d.get_future().wait();
  EXPECT_EQ(max_running.load(), 1) << "the budget admits one request at a time";
}

}  // namespace
}  // namespace sparrow
