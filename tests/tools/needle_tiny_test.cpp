// The trained needle model in models/needle-tiny (tools/train_needle/train.py): Sparrow's CPU
// backend against what transformers computed for the same checkpoint at the end of training.
//  * golden_hf.json holds transformers' float32 logits rows at the three answer positions of
//    needle_prompts.py prompts (teacher-forced); Sparrow's multi-token forward must match them.
//  * training_summary.json holds transformers' Recall@1 per length over 64 prompts; Sparrow's
//    greedy `needle_recall` on the same prompts must count the same hits (one flip allowed for an
//    argmax that sits on a near-tie), and that must be at least 0.95.
// Whatever checkpoint is committed there, these tests hold it to its own recorded numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "model/model.h"
#include "runtime/session.h"
#include "tools/needle.h"

namespace sparrow {
namespace {

const std::filesystem::path kModel = std::filesystem::path(SPARROW_MODELS_DIR) / "needle-tiny";

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "cannot open " << p;
  return nlohmann::json::parse(in);
}

TEST(NeedleTiny, LogitsMatchTransformersGolden) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const auto golden = read_json(kModel / "golden_hf.json");
  const int64_t vocab = (*model)->config().vocab_size;
  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  ASSERT_GE(golden["cases"].size(), 1u);
  for (const auto& c : golden["cases"]) {
    const auto full = c["ids"].get<std::vector<int32_t>>();
    const auto pos = c["positions"].get<std::vector<int64_t>>();
    ASSERT_EQ(pos.size(), 3u);
    // The prompt must be needle_prompts.py's: the C++ twin rebuilds the same ids.
    auto format = needle_format_parse(c.value("format", std::string("vk")));
    ASSERT_TRUE(format.is_ok()) << format.status().to_string();
    auto p = needle_prompt_make(c["seed"].get<uint64_t>(), c["length"].get<int64_t>(), c["trial"].get<int64_t>(),
                                c["trials"].get<int64_t>(), *format);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    ASSERT_EQ(p->ids, full) << "length " << c["length"] << " trial " << c["trial"];
    const std::vector<int32_t> ids(full.begin(), full.begin() + pos.back() + 1);
    auto logits = session.logits(ids, 0);
    ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
    std::vector<float> got, want;
    for (size_t i = 0; i < pos.size(); ++i) {
      got.insert(got.end(), logits->begin() + pos[i] * vocab, logits->begin() + (pos[i] + 1) * vocab);
      for (double v : c["logits"][i]) want.push_back(static_cast<float>(v));
    }
    ASSERT_EQ(got.size(), want.size());
    // Golden values were written rounded to 7 decimals; logits here are O(10).
    const auto r = compare_f32(got, want, {.atol = 2e-5, .rtol = 1e-4, .max_cosine_distance = 1e-7, .max_rel_to_max = 1e-4},
                               {3, vocab});
    std::printf("[needle-tiny] L=%-5lld trial %lld  %s\n", static_cast<long long>(c["length"].get<int64_t>()),
                static_cast<long long>(c["trial"].get<int64_t>()), r.summary().c_str());
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(NeedleTiny, RecallAt256MatchesTransformers) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const auto summary = read_json(kModel / "training_summary.json");
  double want = -1;
  int64_t trials = 0;
  for (const auto& row : summary["recall"])
    if (row["length"] == 256) {
      want = row["recall"].get<double>();
      trials = row["trials"].get<int64_t>();
    }
  ASSERT_GT(trials, 0) << "training_summary.json has no Recall@1 at length 256";
  const uint64_t seed = summary["args"]["eval_seed"].get<uint64_t>();
  auto format = needle_format_of_model(kModel);
  ASSERT_TRUE(format.is_ok()) << format.status().to_string();
  auto backend = make_cpu_backend();
  auto rows = needle_recall(**model, *backend,
                            NeedleOptions{.lengths = {256}, .trials = trials, .seed = seed, .format = *format});
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  const int64_t want_hits = std::llround(want * static_cast<double>(trials));
  std::printf("[needle-tiny] L=256: Sparrow %lld/%lld hits, transformers %lld/%lld\n",
              static_cast<long long>(rows->at(0).hits), static_cast<long long>(trials),
              static_cast<long long>(want_hits), static_cast<long long>(trials));
  EXPECT_LE(std::llabs(rows->at(0).hits - want_hits), 1);
  // The committed model is the demo's: it must retrieve (issue 9's bar, Recall@1 >= 0.95 at every
  // trained length; the full table is models/needle-tiny/README.md). A guess of three digits is
  // right one time in a thousand, a key-blind copy of some needle's digits about one time in four.
  EXPECT_GE(rows->at(0).recall(), 0.95);
}

}  // namespace
}  // namespace sparrow
