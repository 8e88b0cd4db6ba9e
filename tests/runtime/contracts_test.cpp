// Routing and selection contracts (issue 8 §5): hash routing depends on the token id alone, and
// every decision (indexer top-k, expert choice) is the same whatever the chunking.
#include <gtest/gtest.h>

#include <map>

#include "core/npy.h"
#include "model/test_model.h"
#include "runtime/session.h"
#include "runtime/taps.h"

namespace sparrow {
namespace {

using testing::fixture_ids;

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

const TapRecord& find(const std::vector<TapRecord>& v, const std::string& name) {
  for (const TapRecord& r : v)
    if (r.name == name) return r;
  throw std::runtime_error("no tap " + name);
}

TEST(Contracts, HashRoutingIgnoresHiddenStateDrift) {
  // Two random models that share nothing but their tid2eid tables route every token of a hash
  // layer to the same experts, while their scored layers choose differently.
  const auto config = testing::tiny_config({AttentionKind::kSliding, AttentionKind::kCsa}, 1);
  const auto a_dir = testing::make_temp_dir("hash_a"), b_dir = testing::make_temp_dir("hash_b");
  testing::write_test_model(a_dir, config, 1);
  std::vector<uint8_t> tid2eid;
  {
    auto file = SafetensorsFile::open(a_dir / "model.safetensors").value();
    const TensorView* t = file->find("layers.0.ffn.gate.tid2eid");
    tid2eid.assign(static_cast<const uint8_t*>(t->data), static_cast<const uint8_t*>(t->data) + t->nbytes);
  }
  testing::write_test_model(b_dir, config, 2, [&](std::vector<TensorToWrite>& ts) {
    for (auto& t : ts)
      if (t.name == "layers.0.ffn.gate.tid2eid") t.bytes = tid2eid;
  });
  auto backend = make_cpu_backend();
  auto a = Model::load(a_dir).value();
  auto b = Model::load(b_dir).value();
  std::vector<int32_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back((i * 37 + 5) % 64);
  auto ta = taps_run(*a, *backend, ids, "*").value();
  auto tb = taps_run(*b, *backend, ids, "*").value();
  EXPECT_EQ(find(ta, "L0.moe.router.experts").i32, find(tb, "L0.moe.router.experts").i32);
  EXPECT_NE(find(ta, "L0.moe.in").f32, find(tb, "L0.moe.in").f32) << "the hidden states should differ";
  EXPECT_NE(find(ta, "L1.moe.router.experts").i32, find(tb, "L1.moe.router.experts").i32);
  std::filesystem::remove_all(a_dir);
  std::filesystem::remove_all(b_dir);
}

TEST(Contracts, DecisionsAreStableUnderChunking) {
  for (const char* fixture : {"csa", "mixed_hc2"}) {
    auto backend = make_cpu_backend();
    auto model = Model::load(kFixtures / fixture).value();
    const auto ids = fixture_ids(fixture);
    auto one_shot = taps_run(*model, *backend, ids, "*.indexer.topk,*.router.experts").value();
    for (int64_t chunk : {1, 3, 8}) {
      // Concatenate each chunk's selection rows, in order, per tap.
      std::map<std::string, std::vector<int32_t>> chunked;
      TapRecorder recorder(*backend, "*.indexer.topk,*.router.experts");
      auto state = backend->create_sequence_state(model->config());
      for (size_t begin = 0; begin < ids.size(); begin += chunk) {
        const size_t n = std::min<size_t>(chunk, ids.size() - begin);
        BatchInfo batch = batch_build({{state.get(), std::span<const int32_t>(ids).subspan(begin, n)}});
        recorder.records().clear();
        model->forward(*backend, batch, {.tap = recorder.fn()});
        state->advance(static_cast<int64_t>(n));
        for (const TapRecord& r : recorder.records()) {
          auto& dst = chunked[r.name];
          dst.insert(dst.end(), r.i32.begin(), r.i32.end());
        }
      }
      for (const TapRecord& r : one_shot)
        EXPECT_EQ(chunked[r.name], r.i32) << fixture << " chunk " << chunk << " tap " << r.name;
    }
  }
}

}  // namespace
}  // namespace sparrow
