// Logit parity with transformers 5.17's DeepseekV4ForCausalLM (multi-token forward) on tiny random
// checkpoints made by tools/oracle/make_fixtures.py; see tests/fixtures/README.md.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/compare.h"
#include "core/npy.h"
#include "model/model.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

struct Golden {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  int64_t vocab = 0;
};

Golden read_golden(const std::filesystem::path& dir) {
  Golden g;
  auto ids = npy_read(dir / "ids.npy");
  EXPECT_TRUE(ids.is_ok()) << ids.status().to_string();
  for (int64_t v : npy_to_i64(*ids).value()) g.ids.push_back(static_cast<int32_t>(v));
  auto logits = npy_read(dir / "logits.npy");
  EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
  g.logits = npy_to_f32(*logits).value();
  g.vocab = logits->shape.at(1);
  return g;
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, LogitsMatchTransformers) {
  const auto dir = kFixtures / GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir / "logits.npy")) << "fixture missing: " << dir;
  auto model = Model::load(dir);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Golden g = read_golden(dir);
  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  auto got = session.logits(g.ids, 0);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const int64_t T = static_cast<int64_t>(g.ids.size());
  const auto r = compare_f32(*got, g.logits, {.atol = 2e-5, .rtol = 1e-4, .max_cosine_distance = 1e-7, .max_rel_to_max = 1e-4}, {T, g.vocab});
  std::printf("[parity] %-12s T=%3lld  %s\n", GetParam().c_str(), static_cast<long long>(T), r.summary().c_str());
  EXPECT_TRUE(r.ok) << r.message;

  // The same tokens fed token by token and in odd chunks give the one-shot logits.
  for (int64_t chunk : {1, 5}) {
    auto chunked = session.logits(g.ids, chunk);
    ASSERT_TRUE(chunked.is_ok());
    const auto rc = compare_f32(*chunked, *got, {.atol = 1e-6, .rtol = 1e-5, .max_rel_to_max = 1e-5}, {T, g.vocab});
    EXPECT_TRUE(rc.ok) << "chunk " << chunk << ": " << rc.message;
  }
}

TEST_P(FixtureTest, RopeTablesMatchTransformers) {
  const auto dir = kFixtures / GetParam();
  auto model = Model::load(dir);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (const auto& [file, table] : {std::pair{"inv_freq_main.npy", &(*model)->rope_main()},
                                    std::pair{"inv_freq_compress.npy", &(*model)->rope_compress()}}) {
    auto a = npy_read(dir / file);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    const auto ref = npy_to_f32(*a).value();
    std::vector<float> got(table->inv_freq.begin(), table->inv_freq.end());
    const auto r = compare_f32(got, ref, {.atol = 0, .rtol = 1e-6});
    EXPECT_TRUE(r.ok) << file << ": " << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Oracle, FixtureTest,
                         ::testing::Values("swa_hash", "csa", "hca", "mixed_hc2", "mixed_bf16"));

}  // namespace
}  // namespace sparrow
