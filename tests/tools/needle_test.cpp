// `sparrow needle`'s library (src/tools/needle.h): the C++ twin of
// tools/train_needle/needle_prompts.py against that script's own output (tests/fixtures/needle/),
// the prompt layout, and the recall loop on a random byte-vocabulary model (batching and chunking
// must not change a trial's greedy tokens, which must equal Session::generate's).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/test_model.h"
#include "runtime/session.h"
#include "tools/needle.h"

namespace sparrow {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(SPARROW_FIXTURES_DIR) / "needle" / "prompts_seed7.jsonl";

// `python3 tools/train_needle/needle_prompts.py --lengths 64,256,1000 --trials 3 --seed 7`.
void expect_python_golden(const std::filesystem::path& golden, NeedleFormat format) {
  std::ifstream f(golden);
  ASSERT_TRUE(f) << golden;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t L = j.at("length"), t = j.at("trial");
    auto p = needle_prompt_make(7, L, t, 3, format);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    SCOPED_TRACE("length " + std::to_string(L) + " trial " + std::to_string(t));
    EXPECT_EQ(p->ids, j.at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(p->prompt_len, j.at("prompt_len").get<int64_t>());
    EXPECT_EQ(p->answer, j.at("answer").get<std::string>());
    EXPECT_EQ(std::string(1, p->key), j.at("key").get<std::string>());
    EXPECT_EQ(p->needle_pos, j.at("needle_pos").get<int64_t>());
    EXPECT_EQ(p->depth, j.at("depth").get<double>());  // the same double arithmetic, exactly
    // needle_prompt_json carries the same fields (what --dump-prompts writes).
    const nlohmann::json mine = nlohmann::json::parse(needle_prompt_json(*p));
    for (const char* k : {"length", "trial", "prompt_len", "answer", "key", "needle_pos", "depth", "ids"})
      EXPECT_EQ(mine.at(k), j.at(k)) << k;
    ++n;
  }
  EXPECT_EQ(n, 9);
}

TEST(NeedlePrompts, MatchPythonGolden) { expect_python_golden(kGolden, NeedleFormat::kValueKey); }

// `needle_prompts.py ... --format kvk`: the key on both sides of the value.
TEST(NeedlePrompts, MatchPythonGoldenKeyValueKey) {
  expect_python_golden(kGolden.parent_path() / "prompts_seed7_kvk.jsonl", NeedleFormat::kKeyValueKey);
}

TEST(NeedlePrompts, FormatNames) {
  for (NeedleFormat f : {NeedleFormat::kValueKey, NeedleFormat::kKeyValueKey})
    EXPECT_EQ(needle_format_parse(needle_format_name(f)).value(), f);
  EXPECT_FALSE(needle_format_parse("kv").is_ok());
}

// `sparrow needle --needle-format auto` reads the layout from the model's training summary.
TEST(NeedlePrompts, FormatOfAModelDirectory) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "needle_format_of_model";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) { std::ofstream(dir / "training_summary.json") << text; };
  auto got = needle_format_of_model(dir);  // no summary: the first layout
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, NeedleFormat::kValueKey);
  write(R"({"args": {"lr": 0.002}})");  // a summary from before the option
  got = needle_format_of_model(dir);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, NeedleFormat::kValueKey);
  write(R"({"args": {"needle_format": "kvk"}})");
  got = needle_format_of_model(dir);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, NeedleFormat::kKeyValueKey);
  write(R"({"args": {"needle_format": "kv"}})");
  got = needle_format_of_model(dir);
  ASSERT_FALSE(got.is_ok());
  EXPECT_NE(got.status().message().find("training_summary.json"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("'kv'"), std::string::npos) << got.status().message();
  write("{\"args\": ");  // truncated
  got = needle_format_of_model(dir);
  ASSERT_FALSE(got.is_ok());
  EXPECT_NE(got.status().message().find("not a JSON object"), std::string::npos) << got.status().message();
  // The committed model's summary names its layout.
  got = needle_format_of_model(std::filesystem::path(SPARROW_MODELS_DIR) / "needle-tiny");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, NeedleFormat::kKeyValueKey);
  std::filesystem::remove_all(dir);
}

TEST(NeedlePrompts, LayoutAtOddLengths) {
  for (uint64_t seed : {0ull, 1234ull, ~0ull})
    for (int64_t L : {64, 65, 97, 1000, 4099})
      for (int64_t trials : {1, 5})
        for (int64_t t = 0; t < trials; ++t) {
          SCOPED_TRACE(std::to_string(seed) + " " + std::to_string(L) + " " + std::to_string(t));
          auto p = needle_prompt_make(seed, L, t, trials);
          ASSERT_TRUE(p.is_ok());
          const std::vector<int32_t>& ids = p->ids;
          ASSERT_EQ(static_cast<int64_t>(ids.size()), L);
          EXPECT_EQ(p->prompt_len, L - 4);
          EXPECT_EQ(ids[0], kNeedleBos);
          EXPECT_EQ(ids[L - 6], '?');
          EXPECT_EQ(ids[L - 5], p->key);
          EXPECT_EQ(ids[L - 1], '\n');
          EXPECT_EQ(std::string(ids.end() - 4, ids.end() - 1), p->answer);
          // The asked needle is where needle_pos says, and its key occurs exactly once before the question.
          const int64_t s = p->needle_pos;
          EXPECT_EQ(ids[s], '[');
          EXPECT_EQ(std::string(ids.begin() + s + 1, ids.begin() + s + 4), p->answer);
          EXPECT_EQ(ids[s + 4], p->key);
          EXPECT_EQ(ids[s + 5], ']');
          EXPECT_EQ(std::count(ids.begin(), ids.begin() + (L - 6), p->key), 1);
          EXPECT_EQ(std::count(ids.begin(), ids.begin() + (L - 6), '['), 4);
        }
}

TEST(NeedlePrompts, RejectsBadArguments) {
  EXPECT_FALSE(needle_prompt_make(1, 63, 0, 1).is_ok());
  EXPECT_FALSE(needle_prompt_make(1, 64, 1, 1).is_ok());
  EXPECT_FALSE(needle_prompt_make(1, 64, 0, 0).is_ok());
  EXPECT_TRUE(needle_prompt_make(1, 64, 0, 1).is_ok());
}

// A random model with the byte vocabulary: SWA, CSA and HCA layers, hash and scored MoE.
std::unique_ptr<Model> byte_model(const std::string& tag, int64_t vocab = 260) {
  ModelConfig c = testing::tiny_config({AttentionKind::kSliding, AttentionKind::kCsa, AttentionKind::kHca}, 1);
  c.vocab_size = vocab;
  const auto dir = testing::make_temp_dir(tag);
  testing::write_test_model(dir, c, 11);
  auto m = Model::load(dir);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

TEST(NeedleRecall, BatchingAndChunkingKeepEachTrialsTokens) {
  auto model = byte_model("needle_batch");
  auto backend = make_cpu_backend();
  NeedleOptions o{.lengths = {64, 101}, .trials = 3, .seed = 5, .batch_tokens = 1 << 20};
  auto batched = needle_recall(*model, *backend, o);
  ASSERT_TRUE(batched.is_ok()) << batched.status().to_string();
  ASSERT_EQ(batched->size(), 2u);
  for (int64_t chunk : {1, 7, 97}) {  // one trial per forward, prefilled `chunk` tokens at a time
    o.batch_tokens = chunk;
    auto single = needle_recall(*model, *backend, o);
    ASSERT_TRUE(single.is_ok());
    for (size_t l = 0; l < batched->size(); ++l)
      for (int64_t t = 0; t < 3; ++t)
        EXPECT_EQ((*single)[l].per_trial[t].predicted, (*batched)[l].per_trial[t].predicted)
            << "chunk " << chunk << " length " << (*batched)[l].length << " trial " << t;
  }
  Session session(*model, *backend);
  for (const NeedleLengthResult& r : *batched) {
    EXPECT_EQ(r.trials, 3);
    EXPECT_LE(r.hits, r.trials);
    EXPECT_LE(r.digits_right, 3 * r.trials);
    ASSERT_EQ(r.per_trial.size(), 3u);
    for (const NeedleTrial& t : r.per_trial) {
      auto p = needle_prompt_make(5, r.length, t.trial, 3).value();
      EXPECT_EQ(t.answer, p.answer);
      EXPECT_EQ(t.predicted, session.generate(p.prompt(), 3).value());
    }
  }
  EXPECT_NE(needle_table_text(*batched).find("recall@1"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(needle_table_json(*batched));
  ASSERT_EQ(j.at("results").size(), 2u);
  EXPECT_EQ(j["results"][1]["length"], 101);
  EXPECT_EQ(j["results"][1]["trials"], 3);
  EXPECT_TRUE(j["results"][1]["recall"].is_number());
}

// Hits and digit counts are the per-trial comparisons summed (a random model rarely hits, so this
// checks the bookkeeping, not a recall value).
TEST(NeedleRecall, HitMeansAllThreeDigits) {
  auto model = byte_model("needle_hits");
  auto backend = make_cpu_backend();
  auto rows = needle_recall(*model, *backend, {.lengths = {80}, .trials = 4, .seed = 1, .batch_tokens = 4096});
  ASSERT_TRUE(rows.is_ok());
  int64_t hits = 0, digits = 0;
  for (const NeedleTrial& t : (*rows)[0].per_trial) {
    int64_t right = 0;
    for (int d = 0; d < 3; ++d) right += t.predicted[d] == t.answer[d];
    EXPECT_EQ(t.digits_right, right);
    EXPECT_EQ(t.hit, right == 3);
    hits += t.hit;
    digits += right;
  }
  EXPECT_EQ((*rows)[0].hits, hits);
  EXPECT_EQ((*rows)[0].digits_right, digits);
}

TEST(NeedleRecall, RefusesOptionsTheModelCannotRun) {
  auto small = byte_model("needle_small_vocab", 128);
  auto backend = make_cpu_backend();
  auto r = needle_recall(*small, *backend, {.lengths = {64}, .trials = 1});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("vocabulary has 128 ids"), std::string::npos) << r.status().to_string();

  auto model = byte_model("needle_limits");
  const std::vector<NeedleOptions> bad = {
      {.lengths = {63}, .trials = 1}, {.lengths = {4097}, .trials = 1}, {.lengths = {64}, .trials = 0},
      {.lengths = {}, .trials = 1}, {.lengths = {64}, .trials = 1, .batch_tokens = 0}};
  for (const NeedleOptions& o : bad)
    EXPECT_FALSE(needle_recall(*model, *backend, o).is_ok());
}

}  // namespace
}  // namespace sparrow
