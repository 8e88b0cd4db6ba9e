// sparrow diff names the right layer and block when a fault is planted in a copy of a fixture
// (issue 8 acceptance): a scaled weight, a doubled routed scale, corrupted index keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/npy.h"
#include "io/safetensors.h"
#include "model/test_model.h"
#include "runtime/diff.h"
#include "runtime/taps.h"

namespace sparrow {
namespace {

using testing::fixture_ids;

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

std::filesystem::path copy_with_scaled_tensor(const std::string& fixture, const std::string& tensor, float factor) {
  return testing::copy_checkpoint_with_fault(kFixtures / fixture, tensor, factor);
}

DiffReport diff_dirs(const std::filesystem::path& a, const std::filesystem::path& b, const std::vector<int32_t>& ids,
                     bool force = false) {
  auto backend = make_cpu_backend();
  auto ma = Model::load(a).value();
  auto mb = Model::load(b).value();
  auto ra = taps_run(*ma, *backend, ids, "*").value();
  ForcedDecisions forced;
  for (const TapRecord& r : ra)
    if (tap_is_selection(r.name)) forced[r.name] = r.i32;
  auto rb = taps_run(*mb, *backend, ids, "*", force ? &forced : nullptr).value();
  return diff_taps(ra, rb, {});
}

TEST(Diff, IdenticalRunsHaveNoDivergence) {
  const auto ids = fixture_ids("mixed_hc2");
  const DiffReport r = diff_dirs(kFixtures / "mixed_hc2", kFixtures / "mixed_hc2", ids);
  EXPECT_FALSE(r.first.has_value());
  EXPECT_GT(r.taps.size(), 40u);
  const auto j = nlohmann::json::parse(diff_report_json(r));
  EXPECT_TRUE(j["first_divergence"].is_null());
}

TEST(Diff, ScaledWeightIsFoundAtItsLayerAndBlock) {
  // wo_b: a scaled wq_b or wkv would not show, the norms right after them cancel a uniform scale.
  const auto ids = fixture_ids("mixed_hc2");
  const auto dir = copy_with_scaled_tensor("mixed_hc2", "model.layers.2.attn.wo_b.weight", 1.01f);
  const DiffReport r = diff_dirs(kFixtures / "mixed_hc2", dir, ids);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.taps[*r.first].layer, 2);
  EXPECT_EQ(r.taps[*r.first].name, "L2.attn.out");
  const auto j = nlohmann::json::parse(diff_report_json(r));
  EXPECT_EQ(j["first_divergence"]["layer"], 2);
  EXPECT_EQ(j["first_divergence"]["tap"], "L2.attn.out");
  std::filesystem::remove_all(dir);
}

TEST(Diff, DoubledRoutedScaleIsCaughtAtTheFirstMoeTap) {
  // A second application of routed_scaling_factor, planted through the config.
  const auto ids = fixture_ids("mixed_hc2");
  const auto dir = testing::make_temp_dir("diff_scale");
  std::filesystem::copy_file(kFixtures / "mixed_hc2" / "model.safetensors", dir / "model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixtures / "mixed_hc2" / "config.json"));
  cfg["routed_scaling_factor"] = cfg["routed_scaling_factor"].get<double>() * 1.5;
  std::ofstream(dir / "config.json") << cfg.dump();
  const DiffReport r = diff_dirs(kFixtures / "mixed_hc2", dir, ids);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.taps[*r.first].name, "L0.moe.router.weights");  // layer 0 is a hash layer
  std::filesystem::remove_all(dir);
}

TEST(Diff, CorruptedIndexKeysAreFoundAtTheIndexer) {
  const auto ids = fixture_ids("csa");
  const auto dir = copy_with_scaled_tensor("csa", "model.layers.1.attn.indexer.compressor.wkv.weight", -1.0f);
  const DiffReport r = diff_dirs(kFixtures / "csa", dir, ids);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.taps[*r.first].name, "L1.attn.indexer.scores");
  std::filesystem::remove_all(dir);
}

TEST(Diff, ForcedDecisionsSeparateSelectionFromArithmetic) {
  // Different index_topk changes the selection; forcing A's picks on B makes every value match.
  const auto ids = fixture_ids("csa");
  auto backend = make_cpu_backend();
  auto ma = Model::load(kFixtures / "csa").value();
  auto mb = Model::load(kFixtures / "csa", {.index_topk = 2}).value();
  auto ra = taps_run(*ma, *backend, ids, "*").value();
  auto rb = taps_run(*mb, *backend, ids, "*").value();
  DiffReport free = diff_taps(ra, rb, {});
  ASSERT_TRUE(free.first.has_value());
  EXPECT_EQ(free.taps[*free.first].name, "L1.attn.indexer.topk");
  ForcedDecisions forced;
  for (const TapRecord& r : ra)
    if (tap_is_selection(r.name)) forced[r.name] = r.i32;
  auto rf = taps_run(*mb, *backend, ids, "*", &forced).value();
  EXPECT_FALSE(diff_taps(ra, rf, {}).first.has_value());
}

TEST(Taps, PatternsAndLayers) {
  EXPECT_TRUE(tap_pattern_match("L3.*,logits", "L3.attn.q"));
  EXPECT_TRUE(tap_pattern_match("L3.*,logits", "logits"));
  EXPECT_FALSE(tap_pattern_match("L3.*,logits", "L30.attn.q"));
  EXPECT_EQ(tap_layer("L12.attn.q"), 12);
  EXPECT_EQ(tap_layer("logits"), -1);
  EXPECT_TRUE(tap_is_selection("L1.attn.indexer.topk"));
  EXPECT_FALSE(tap_is_selection("L1.attn.indexer.scores"));
}

}  // namespace
}  // namespace sparrow
