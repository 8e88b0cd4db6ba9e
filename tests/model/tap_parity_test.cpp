// Every tap transformers exposes as a module output (tools/oracle/dump_taps.py) matches Sparrow's
// tap of the same name: values within 1e-4 of the tap's largest magnitude, selections as sets,
// router weights matched to their experts (transformers does not sort its top-k).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/compare.h"
#include "core/npy.h"
#include "io/safetensors.h"
#include "runtime/taps.h"

namespace sparrow {
namespace {

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

std::vector<float> as_f32(const TensorView& t) {
  std::vector<float> v(t.numel());
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}
std::vector<int32_t> as_i32(const TensorView& t) {
  std::vector<int32_t> v(t.numel());
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}


class TapParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TapParity, EveryTransformersTapMatches) {
  const auto dir = kFixtures / GetParam();
  auto hf = SafetensorsFile::open(dir / "taps_hf.safetensors");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  std::vector<int32_t> ids;
  for (int64_t v : npy_to_i64(npy_read(dir / "ids.npy").value()).value()) ids.push_back(static_cast<int32_t>(v));
  auto backend = make_cpu_backend();
  auto model = Model::load(dir).value();
  auto mine = taps_run(*model, *backend, ids, "*").value();
  std::map<std::string, const TapRecord*> by_name;
  for (const TapRecord& r : mine) by_name[r.name] = &r;

  int compared = 0;
  double worst = 0;
  std::string worst_tap;
  for (const TensorView& t : (*hf)->tensors()) {
    ASSERT_TRUE(by_name.count(t.name)) << "Sparrow has no tap " << t.name;
    const TapRecord& r = *by_name[t.name];
    ASSERT_EQ(r.shape, t.shape) << t.name;
    ++compared;
    if (tap_is_selection(t.name)) {
      const auto theirs = as_i32(t);
      const int64_t k = t.shape[1];
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        std::set<int32_t> a(r.i32.begin() + row * k, r.i32.begin() + (row + 1) * k);
        std::set<int32_t> b(theirs.begin() + row * k, theirs.begin() + (row + 1) * k);
        EXPECT_EQ(a, b) << t.name << " row " << row;
      }
      continue;
    }
    std::vector<float> ref = as_f32(t), got = r.f32;
    if (t.name.ends_with(".router.weights")) {
      // Line both up by expert id so the order of the top-k does not matter.
      const std::string experts = t.name.substr(0, t.name.size() - std::strlen("weights")) + "experts";
      const auto theirs_e = as_i32(*(*hf)->find(experts));
      const auto& mine_e = by_name[experts]->i32;
      const int64_t k = t.shape[1];
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        std::vector<std::pair<int32_t, float>> a, b;
        for (int64_t i = 0; i < k; ++i) {
          a.push_back({mine_e[row * k + i], got[row * k + i]});
          b.push_back({theirs_e[row * k + i], ref[row * k + i]});
        }
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        for (int64_t i = 0; i < k; ++i) {
          got[row * k + i] = a[i].second;
          ref[row * k + i] = b[i].second;
        }
      }
    }
    const auto c = compare_f32(got, ref, {.atol = INFINITY, .max_rel_to_max = 1e-4}, t.shape);
    EXPECT_TRUE(c.ok) << t.name << ": " << c.message;
    if (c.rel_to_max > worst) {
      worst = c.rel_to_max;
      worst_tap = t.name;
    }
  }
  EXPECT_GT(compared, 20);
  std::printf("[tap parity] %-10s %d taps, worst max|d|/max|ref| %.2e (%s)\n", GetParam().c_str(), compared, worst,
              worst_tap.c_str());
}

INSTANTIATE_TEST_SUITE_P(Oracle, TapParity, ::testing::Values("swa_hash", "csa", "hca", "mixed_hc2", "mixed_bf16"));

}  // namespace
}  // namespace sparrow
