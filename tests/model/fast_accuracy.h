// The measurement behind tests/model/fast_accuracy_test.cpp (CPU) and
// tests/backends/cuda/cuda_fast_accuracy_test.cpp (the same on the CUDA backend): fast against fp32
// with the taps/diff machinery, the thresholds with their reasoning (docs/accuracy.md), and the
// planted faults every threshold must catch. REQUIRES SPARROW_FIXTURES_DIR and SPARROW_MODELS_DIR.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/compare.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/test_model.h"
#include "ops/backend.h"
#include "runtime/diff.h"
#include "runtime/taps.h"
#include "tools/needle.h"

namespace sparrow::fast_accuracy {

using testing::fixture_ids;

inline const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;
inline const std::filesystem::path kNeedleTiny = std::filesystem::path(SPARROW_MODELS_DIR) / "needle-tiny";

// ---- thresholds ------------------------------------------------------------------------------------
// Measured on 2026-11-30 (CPU; needle-tiny values on 2026-12-01 for the retrieving checkpoint of
// run 4); docs/accuracy.md has every number. Each threshold sits between the clean profile's worst
// value and what a planted fault gives, with the margin stated.
struct Thresholds {
  double logits_cos_dist;     // at most: 1 - cos over [T, V] logits, fp64
  double top1;                // at least: greedy top-1 agreement per position
  double layer_cos_dist;      // at most: worst layer's L<l>.hc_ffn.out cosine distance
  double expert_agreement;    // at least: mean expert-set overlap per scored MoE layer, free run
  double index_overlap_bf16;  // at least: mean indexer top-k overlap per CSA layer, contested
                              // queries, bf16 keys, fp32 selections imposed
};

// The five random tiny fixtures (hidden 64, so an FP8 block of 128 spans the whole row and nothing
// was trained to absorb the rounding).
// - logits: clean 0.9e-3..7.5e-3; the routed scale applied twice 1.36e-2..5.5e-2: 1.3x above the
//   worst clean fixture, 1.36x below the mildest fault.
// - top-1: clean 0.849..0.950, doubled scale 0.61..0.80.
// - layers: clean <= 7.6e-3; faults overlap it here, so a sanity bound only (a broken profile).
// - experts: clean >= 0.933 (K=2 of 8: one flip in 30 rows costs 0.017).
// - indexer (top 4 of <= 18 entries, small random margins): clean >= 0.933, corrupted keys 0.22..0.25.
inline constexpr Thresholds kFixtureThresholds{.logits_cos_dist = 1e-2, .top1 = 0.82, .layer_cos_dist = 2e-2,
                                               .expert_agreement = 0.90, .index_overlap_bf16 = 0.85};

// models/needle-tiny (trained, Recall@1 1.0). Its scored-MoE layers flip 1-4 % of expert choices
// under bf16 activations, and a flipped expert moves that token's output a lot.
// - logits: clean 9.5e-4..1.7e-3, doubled routed scale 1.1e-2: 2.3x headroom, 2.8x below the fault.
// - top-1: clean 0.934..0.956 (most positions are random haystack bytes whose logits are nearly
//   flat, so a tiny perturbation flips them), doubled scale 0.766.
// - layers: clean <= 9.3e-3 (layers 2-3; layers 0-1 <= 2.2e-4), doubled scale 5.5e-2: 2.2x above
//   clean, 2.8x below the fault.
// - experts: clean >= 0.963, doubled scale 0.794.
// - indexer (top 16 of <= 255): clean >= 0.941, corrupted keys 0.842.
inline constexpr Thresholds kNeedleThresholds{.logits_cos_dist = 4e-3, .top1 = 0.90, .layer_cos_dist = 2e-2,
                                              .expert_agreement = 0.93, .index_overlap_bf16 = 0.88};

// The synthetic V4-Flash (`sparrow synth`: real dimensions, FP8 attention, MXFP4 experts, random
// weights; 4 layers SWA, SWA, CSA, HCA with 32 experts; 256 random tokens): the one model here on
// which the fast profile's tensor-core paths all run (W4A8 experts, the FP8 and bf16 GEMMs). Only
// layer 3's MoE is scored; the CSA layer holds 64 entries, fewer than its top 512, so its
// selection is trivially whole (no indexer threshold applies). Measured on the H200 on 2026-12-01
// (CUDA, fast vs fp32):
// - logits: clean 3.2e-3, the routed scale applied twice 4.2e-2: 3.1x headroom, 4.2x below the fault.
// - top-1: clean 0.84 (random weights: nearly flat logits), doubled scale 0.49.
// - layers: clean <= 3.3e-3 (layer 3; layers 0-1 <= 9.5e-4), doubled scale 4.2e-2: 3.6x / 3.5x.
// - experts (layer 3, top 6 of 32): clean 0.952, doubled scale 0.837.
inline constexpr Thresholds kSynthThresholds{.logits_cos_dist = 1e-2, .top1 = 0.70, .layer_cos_dist = 1.2e-2,
                                             .expert_agreement = 0.90, .index_overlap_bf16 = 0.85};

struct LayerAccuracy {
  int64_t layer = 0;
  double out_cos_dist = 0;          // L<l>.hc_ffn.out
  double expert_agreement = 1;      // mean overlap of L<l>.moe.router.experts (free run)
  bool scored_moe = false;          // a hash layer's experts depend on the token id only
};

struct IndexOverlap {
  int64_t layer = 0;
  KeyPrecision keys = KeyPrecision::kBf16;
  int64_t contested = 0;
  double mean = 1, min = 1;
};

struct Accuracy {
  double logits_cos_dist = 0, logits_worst_row_cos_dist = 0, top1 = 1;
  std::vector<LayerAccuracy> layers;
  std::vector<IndexOverlap> index;
  double max_layer_cos_dist() const {
    double m = 0;
    for (const auto& l : layers) m = std::max(m, l.out_cos_dist);
    return m;
  }
  double min_expert_agreement() const {
    double m = 1;
    for (const auto& l : layers)
      if (l.scored_moe) m = std::min(m, l.expert_agreement);
    return m;
  }
  double min_index_overlap(KeyPrecision k) const {
    double m = 1;
    for (const auto& o : index)
      if (o.keys == k) m = std::min(m, o.mean);
    return m;
  }
};

inline const TapRecord* find_tap(const std::vector<TapRecord>& v, const std::string& name) {
  for (const TapRecord& r : v)
    if (r.name == name) return &r;
  return nullptr;
}

inline int32_t argmax_row(const std::vector<float>& x, int64_t row, int64_t V) {
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (x[row * V + v] > x[row * V + best]) best = static_cast<int32_t>(v);
  return best;
}

// fp32 on `reference_dir` vs fast on `fast_dir` (the same checkpoint, or a planted copy).
inline Accuracy measure(const std::filesystem::path& reference_dir, const std::filesystem::path& fast_dir,
                        const std::vector<int32_t>& ids, const std::vector<KeyPrecision>& key_precisions,
                        Backend& be) {
  Accuracy acc;
  Backend* backend = &be;
  auto fp32 = Model::load(reference_dir).value();
  auto fast = Model::load(fast_dir, {.index_topk = {}, .index_keys = {}, .precision = Precision::kFast}).value();
  EXPECT_EQ(fast->index_keys(), KeyPrecision::kBf16) << "fast's default index keys";
  const ModelConfig& c = fp32->config();
  const auto ra = taps_run(*fp32, *backend, ids, "*").value();
  const auto rb = taps_run(*fast, *backend, ids, "*").value();
  const DiffReport rep = diff_taps(ra, rb, {});

  // Logits: global cosine, worst row, greedy agreement.
  const TapRecord& la = *find_tap(ra, "logits");
  const TapRecord& lb = *find_tap(rb, "logits");
  const int64_t T = la.shape[0], V = la.shape[1];
  acc.logits_cos_dist = compare_f32(lb.f32, la.f32, {.atol = INFINITY}).cosine_distance;
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) {
    agree += argmax_row(la.f32, t, V) == argmax_row(lb.f32, t, V);
    const auto row = compare_f32(std::span(lb.f32).subspan(t * V, V), std::span(la.f32).subspan(t * V, V),
                                 {.atol = INFINITY});
    acc.logits_worst_row_cos_dist = std::max(acc.logits_worst_row_cos_dist, row.cosine_distance);
  }
  acc.top1 = static_cast<double>(agree) / static_cast<double>(T);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerAccuracy la_{.layer = l, .scored_moe = c.moe[l] != MoeKind::kHash};
    const std::string p = "L" + std::to_string(l) + ".";
    for (const TapDiff& d : rep.taps) {
      if (d.name == p + "hc_ffn.out") la_.out_cos_dist = d.cosine_distance;
      if (d.name == p + "moe.router.experts") la_.expert_agreement = d.overlap_mean;
    }
    acc.layers.push_back(la_);
  }

  // Indexer overlap per key precision, fp32's decisions imposed.
  ForcedDecisions forced;
  for (const TapRecord& r : ra)
    if (tap_is_selection(r.name)) forced[r.name] = r.i32;
  for (KeyPrecision keys : key_precisions) {
    auto variant = Model::load(fast_dir, {.index_topk = {}, .index_keys = keys, .precision = Precision::kFast}).value();
    const auto own = taps_run(*variant, *backend, ids, "*.indexer.topk_own", &forced).value();
    for (const TapRecord& r : own) {
      const int64_t l = tap_layer(r.name), k = r.shape[1];
      const std::vector<int32_t>& ref = forced.at("L" + std::to_string(l) + ".attn.indexer.topk");
      IndexOverlap o{.layer = l, .keys = keys};
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        if ((t + 1) / c.compress_ratio[l] <= k) continue;  // sees at most k entries: keeps them all
        std::set<int32_t> mine(r.i32.begin() + t * k, r.i32.begin() + (t + 1) * k);
        int64_t common = 0;
        for (int64_t i = 0; i < k; ++i) common += mine.count(ref[t * k + i]);
        const double ov = static_cast<double>(common) / static_cast<double>(k);
        sum += ov;
        o.min = std::min(o.min, ov);
        ++o.contested;
      }
      o.mean = o.contested ? sum / static_cast<double>(o.contested) : 1.0;
      acc.index.push_back(o);
    }
  }
  return acc;
}

inline void print(const std::string& what, const Accuracy& a) {
  std::printf("[fast vs fp32] %-22s logits cos-dist %.3e (worst row %.3e) top-1 %.4f\n", what.c_str(),
              a.logits_cos_dist, a.logits_worst_row_cos_dist, a.top1);
  for (const auto& l : a.layers)
    std::printf("[fast vs fp32] %-22s L%lld out cos-dist %.3e experts %.4f%s\n", what.c_str(),
                static_cast<long long>(l.layer), l.out_cos_dist, l.expert_agreement, l.scored_moe ? "" : " (hash)");
  for (const auto& o : a.index)
    std::printf("[fast vs fp32] %-22s L%lld index keys %-4s contested %4lld overlap mean %.4f min %.4f\n",
                what.c_str(), static_cast<long long>(o.layer), key_precision_name(o.keys),
                static_cast<long long>(o.contested), o.mean, o.min);
}

// A copy of a checkpoint directory (config.json + model.safetensors) with every element of
// `tensor` (F32 or BF16) multiplied by `factor`, or with config.json edited by `edit_config`.
// The routed scale applied twice on the fast path only: its config says factor^2.
inline std::filesystem::path plant_double_routed_scale(const std::filesystem::path& src) {
  return testing::copy_checkpoint_with_fault(src, "", 1.0f, [](nlohmann::json& c) {
    const double f = c["routed_scaling_factor"].get<double>();
    c["routed_scaling_factor"] = f * f;
  });
}

// Corrupted index keys: the indexer compressor's wkv negated (the key every entry stores flips sign).
inline std::filesystem::path plant_corrupt_index_keys(const std::filesystem::path& src, const std::string& layer) {
  return testing::copy_checkpoint_with_fault(src, "model.layers." + layer + ".attn.indexer.compressor.wkv.weight", -1.0f);
}

// Four prompts in the layout needle-tiny was trained on.
inline std::vector<std::vector<int32_t>> needle_prompts() {
  std::vector<std::vector<int32_t>> out;
  const NeedleFormat format = needle_format_of_model(kNeedleTiny).value();
  for (int64_t len : {256, 1024})
    for (int64_t trial : {0, 1}) {
      auto p = needle_prompt_make(7, len, trial, 2, format).value();
      out.emplace_back(p.prompt().begin(), p.prompt().end());
    }
  return out;
}

inline const std::vector<KeyPrecision> kAllKeys = {KeyPrecision::kBf16, KeyPrecision::kFp8, KeyPrecision::kFp4};

// The clean profile's checks: every threshold of `t`.
inline void expect_within(const Accuracy& a, const Thresholds& t, const std::string& what) {
  EXPECT_LE(a.logits_cos_dist, t.logits_cos_dist) << what;
  EXPECT_GE(a.top1, t.top1) << what;
  EXPECT_LE(a.max_layer_cos_dist(), t.layer_cos_dist) << what;
  EXPECT_GE(a.min_expert_agreement(), t.expert_agreement) << what;
  EXPECT_GE(a.min_index_overlap(KeyPrecision::kBf16), t.index_overlap_bf16) << what;
}

// The routed scale applied twice must fail both logit thresholds; on needle-tiny (whole_model) the
// layer and expert thresholds too (on the fixtures those overlap the clean values).
inline void expect_doubled_scale_caught(const Accuracy& a, const Thresholds& t, bool whole_model,
                                        const std::string& what) {
  EXPECT_GT(a.logits_cos_dist, t.logits_cos_dist) << what;
  EXPECT_LT(a.top1, t.top1) << what;
  if (!whole_model) return;
  EXPECT_GT(a.max_layer_cos_dist(), t.layer_cos_dist) << what;
  EXPECT_LT(a.min_expert_agreement(), t.expert_agreement) << what;
}

// Corrupted index keys must fail the bf16 indexer threshold.
inline void expect_corrupt_keys_caught(const Accuracy& a, const Thresholds& t, const std::string& what) {
  EXPECT_LT(a.min_index_overlap(KeyPrecision::kBf16), t.index_overlap_bf16) << what;
}

}  // namespace sparrow::fast_accuracy
