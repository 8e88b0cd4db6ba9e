// Prefill in one shot, chunked prefill of any size and token-by-token decode give the same logits
// (traps.md rows 2, 3, 16), at lengths that cross window and compression boundaries and with more
// compressed entries than index_topk. Also: a sequence's logits do not depend on which other
// sequences share its batch.
#include <gtest/gtest.h>

#include <random>

#include "core/argmax.h"
#include "core/compare.h"
#include "model/model.h"
#include "model/test_model.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

using testing::make_temp_dir;
using testing::tiny_config;
using testing::write_test_model;

using testing::random_ids;

// Parametrised by precision profile: fp32 (the reference) and fast (its bf16/FP8 CPU twin) must both
// be chunking-invariant.
class ChunkingTest : public ::testing::TestWithParam<Precision> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(make_temp_dir("chunking"));
    // Every attention kind; one hash layer. Window 8, CSA ratio 4 (topk 2), HCA ratio 8.
    write_test_model(*dir_,
                     tiny_config({AttentionKind::kCsa, AttentionKind::kHca, AttentionKind::kSliding,
                                  AttentionKind::kCsa},
                                 1),
                     1234);
    model_ = Model::load(*dir_).value().release();
    fast_ = Model::load(*dir_, {.index_topk = {}, .index_keys = {}, .precision = Precision::kFast}).value().release();
    backend_ = make_cpu_backend().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete fast_;
    delete backend_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::filesystem::path* dir_;
  static Model* model_;
  static Model* fast_;
  static Backend* backend_;
  const Model& model() const { return GetParam() == Precision::kFast ? *fast_ : *model_; }
};
std::filesystem::path* ChunkingTest::dir_ = nullptr;
Model* ChunkingTest::model_ = nullptr;
Model* ChunkingTest::fast_ = nullptr;
Backend* ChunkingTest::backend_ = nullptr;

TEST_P(ChunkingTest, AnyChunkingMatchesOneShotPrefill) {
  Session session(model(), *backend_);
  const int64_t V = model().config().vocab_size;
  std::vector<int64_t> lengths = {1, 2, 3, 4, 5, 6, 7, 8, 9, 35, 67, 127, 128, 129, 130};
  double worst = 0;
  for (int64_t len : lengths) {
    const auto ids = random_ids(len, V, 100 + len);
    const auto ref = session.logits(ids, 0);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    for (int64_t chunk : {1, 3, 4, 7, 16}) {
      if (chunk >= len) continue;
      const auto got = session.logits(ids, chunk);
      ASSERT_TRUE(got.is_ok());
      // fast rounds to bf16 and FP8 at every boundary: only bit-equality keeps it honest there.
      const Tolerance tol = GetParam() == Precision::kFast ? Tolerance{.atol = 0, .rtol = 0}
                                                           : Tolerance{.atol = 1e-6, .rtol = 1e-5, .max_rel_to_max = 1e-5};
      const auto r = compare_f32(*got, *ref, tol, {len, V});
      worst = std::max(worst, r.rel_to_max);
      EXPECT_TRUE(r.ok) << "length " << len << " chunk " << chunk << ": " << r.message;
    }
  }
  std::printf("[chunking] %s: worst max|d|/max|ref| over all lengths and chunkings: %.3e\n",
              precision_name(GetParam()), worst);
}

TEST_P(ChunkingTest, BatchedSequencesMatchAlone) {
  const Model& m = model();
  const int64_t V = m.config().vocab_size;
  // Three sequences at different lengths, each continued by a chunk, batched together.
  const std::vector<int64_t> prefix = {5, 30, 0};
  const std::vector<int64_t> extra = {9, 4, 13};
  std::vector<std::vector<float>> alone(3);
  std::vector<std::vector<int32_t>> ids(3);
  for (int s = 0; s < 3; ++s) {
    ids[s] = random_ids(prefix[s] + extra[s], V, 7 + s);
    Session session(m, *backend_);
    auto all = session.logits(ids[s], 0);
    ASSERT_TRUE(all.is_ok());
    alone[s].assign(all->begin() + prefix[s] * V, all->end());
  }
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<SequenceChunk> chunks;
  for (int s = 0; s < 3; ++s) {
    states.push_back(backend_->create_sequence_state(m.config()));
    if (prefix[s] > 0) {
      BatchInfo b = batch_build({{states[s].get(), std::span<const int32_t>(ids[s]).subspan(0, prefix[s])}});
      m.forward(*backend_, b);
      states[s]->advance(prefix[s]);
    }
    chunks.push_back({states[s].get(), std::span<const int32_t>(ids[s]).subspan(prefix[s])});
  }
  BatchInfo batch = batch_build(chunks);
  const std::vector<float> together = backend_->download_f32(m.forward(*backend_, batch));
  for (int s = 0; s < 3; ++s) {
    std::vector<float> mine(together.begin() + batch.seq_begin[s] * V, together.begin() + batch.seq_end[s] * V);
    // Bit-identical: the CPU backend computes every token's values independently of its batch.
    const auto r = compare_f32(mine, alone[s], {.atol = 0, .rtol = 0});
    EXPECT_TRUE(r.ok) << "sequence " << s << ": " << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, ChunkingTest, ::testing::Values(Precision::kFp32, Precision::kFast),
                         [](const ::testing::TestParamInfo<Precision>& i) {
                           return std::string(i.param == Precision::kFast ? "fast" : "fp32");
                         });

}  // namespace
}  // namespace sparrow

namespace sparrow {
namespace {

TEST_P(ChunkingTest, LogitsRowsSelectsRowsOfTheFullLogits) {
  const Model& m = model();
  const int64_t V = m.config().vocab_size;
  const auto ids = random_ids(21, V, 5);
  auto s1 = backend_->create_sequence_state(m.config());
  const auto full = backend_->download_f32(m.forward(*backend_, batch_build({{s1.get(), ids}})));
  auto s2 = backend_->create_sequence_state(m.config());
  const std::vector<int64_t> rows = {20, 3, 7};
  const auto some = backend_->download_f32(
      m.forward(*backend_, batch_build({{s2.get(), ids}}), {.logits_rows = &rows}));
  ASSERT_EQ(some.size(), rows.size() * V);
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(std::vector<float>(some.begin() + i * V, some.begin() + (i + 1) * V),
              std::vector<float>(full.begin() + rows[i] * V, full.begin() + (rows[i] + 1) * V));
}

// Greedy generation feeds each step's id to the next on the backend (BatchInfo::device_token_ids):
// every token must be the argmax (core/argmax.h) of the last row of the logits of the prompt and
// the tokens before it, fed as host ids in one shot; the model has a hash-routed layer, whose
// experts come from the ids. And the same ids fed as a device tensor give the host ids' logits.
TEST_P(ChunkingTest, GreedyGenerationFeedsItsIdsBack) {
  Session session(model(), *backend_);
  const int64_t V = model().config().vocab_size;
  const auto prompt = random_ids(9, V, 77);
  const auto out = session.generate(prompt, 12);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 12u);
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), out->begin(), out->end() - 1);
  const auto logits = session.logits(ids, 0);
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  for (size_t k = 0; k < out->size(); ++k)
    EXPECT_EQ((*out)[k], argmax_first(logits->data() + (prompt.size() - 1 + k) * V, V)) << "token " << k;
  // Device ids against host ids, prompt included (the hash layer reads them too).
  auto s1 = backend_->create_sequence_state(model().config());
  const auto host = backend_->download_f32(model().forward(*backend_, batch_build({{s1.get(), ids}})));
  auto s2 = backend_->create_sequence_state(model().config());
  const std::vector<int32_t> zeros(ids.size(), 0);
  BatchInfo b = batch_build({{s2.get(), zeros}});
  b.device_token_ids = backend_->upload_i32(ids, {static_cast<int64_t>(ids.size())});
  EXPECT_EQ(backend_->download_f32(model().forward(*backend_, b)), host);
}

}  // namespace
}  // namespace sparrow
