// CPU reference ops pinned against hand-computed values (issue: "unit tests pin each primitive").
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_state.h"
#include "model/rope.h"
#include "ops/backend.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

TensorView view(const std::vector<float>& v, std::vector<int64_t> shape) {
  TensorView t;
  t.name = "test";
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data = v.data();
  t.nbytes = v.size() * 4;
  return t;
}

WeightMatrix matrix(const std::vector<float>& v, int64_t out, int64_t in) {
  WeightMatrix w;
  w.out = out;
  w.in = in;
  w.data = view(v, {out, in});
  return w;
}

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

TEST_F(CpuOps, RmsNormWeighted) {
  Tensor x = be->upload_f32({1, 2, 3, 4}, {1, 4});
  const std::vector<float> w = {1, 1, 2, 0.5};
  be->rms_norm({.out = x, .in = x, .weight = view(w, {4}), .group = 4, .eps = 1e-6});
  // mean(x^2) = 7.5; y = w * x / sqrt(7.5 + 1e-6)
  const double r = 1.0 / std::sqrt(7.5 + 1e-6);
  const auto y = be->download_f32(x);
  EXPECT_NEAR(y[0], 1 * r, 1e-6);
  EXPECT_NEAR(y[1], 2 * r, 1e-6);
  EXPECT_NEAR(y[2], 6 * r, 1e-6);
  EXPECT_NEAR(y[3], 2 * r, 1e-6);
}

TEST_F(CpuOps, RmsNormUnweightedGroups) {
  // Two groups of 2 (per-head norm): [3,4] -> /sqrt(12.5), [0,2] -> /sqrt(2).
  Tensor x = be->upload_f32({3, 4, 0, 2}, {1, 4});
  be->rms_norm({.out = x, .in = x, .weight = {}, .group = 2, .eps = 0.0});
  const auto y = be->download_f32(x);
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 4 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[2], 0.0, 1e-7);
  EXPECT_NEAR(y[3], 2 / std::sqrt(2.0), 1e-6);
}

TEST_F(CpuOps, RopeRotatesTrailingPairsInterleaved) {
  // Head width 6, rope on the last 4 dims: pairs (2,3) at freq 1 and (4,5) at freq 0.5.
  RopeTable table{.inv_freq = {1.0, 0.5}};
  Tensor x = be->upload_f32({7, 8, 1, 0, 0, 1}, {1, 1, 6});
  BatchInfo b;
  b.token_ids = {0};
  b.positions = {2};
  b.seq_of_token = {0};
  be->rope({.x = x, .table = &table, .direction = RopeDirection::kForward}, b);
  auto y = be->download_f32(x);
  EXPECT_FLOAT_EQ(y[0], 7);  // nope dims untouched
  EXPECT_FLOAT_EQ(y[1], 8);
  EXPECT_NEAR(y[2], std::cos(2.0), 1e-7);  // (1,0) rotated by 2 rad
  EXPECT_NEAR(y[3], std::sin(2.0), 1e-7);
  EXPECT_NEAR(y[4], -std::sin(1.0), 1e-7);  // (0,1) rotated by 1 rad
  EXPECT_NEAR(y[5], std::cos(1.0), 1e-7);
  be->rope({.x = x, .table = &table, .direction = RopeDirection::kInverse}, b);
  y = be->download_f32(x);
  EXPECT_NEAR(y[2], 1, 1e-6);
  EXPECT_NEAR(y[3], 0, 1e-6);
  EXPECT_NEAR(y[4], 0, 1e-6);
  EXPECT_NEAR(y[5], 1, 1e-6);
}

// S = 2 streams, fn = 0 so the mixes are the biases alone: pre/post/comb come out of base.
struct HcCase {
  std::vector<float> fn = std::vector<float>(8 * 2 * 2, 0.0f);  // mix 8 x (S*D = 4)
  std::vector<float> base = {0.0f, 1.0f, -1.0f, 0.5f, 0.0f, static_cast<float>(std::log(3.0)), 0.0f, 0.0f};
  std::vector<float> scale = {1, 1, 1};
  HcWeights w{.fn = view(fn, {8, 4}), .base = view(base, {8}), .scale = view(scale, {3})};
};

TEST_F(CpuOps, SinkhornOneIterationByHand) {
  HcCase hc;
  const double eps = 1e-6;
  Tensor X = be->upload_f32({1, 2, 10, 20}, {1, 2, 2});  // stream 0 = [1,2], stream 1 = [10,20]
  Tensor u = be->alloc(ElemType::kF32, {1, 2}), post = be->alloc(ElemType::kF32, {1, 2}),
         comb = be->alloc(ElemType::kF32, {1, 2, 2});
  be->hc_pre({.out_input = u, .out_post = post, .out_comb = comb, .streams = X, .weights = &hc.w,
              .sinkhorn_iters = 1, .hc_eps = eps, .norm_eps = 1e-6});
  const double s0 = 1 / (1 + std::exp(-0.0)) + eps, s1 = 1 / (1 + std::exp(-1.0)) + eps;
  const auto uu = be->download_f32(u);
  EXPECT_NEAR(uu[0], s0 * 1 + s1 * 10, 1e-5);
  EXPECT_NEAR(uu[1], s0 * 2 + s1 * 20, 1e-5);
  const auto pp = be->download_f32(post);
  EXPECT_NEAR(pp[0], 2 / (1 + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(pp[1], 2 / (1 + std::exp(-0.5)), 1e-6);
  // comb logits [[0, ln 3], [0, 0]] -> row softmax [[.25, .75], [.5, .5]] + eps, then columns / (sum + eps).
  const double a = 0.25 + eps, b = 0.75 + eps, c = 0.5 + eps, d = 0.5 + eps;
  const auto cc = be->download_f32(comb);
  EXPECT_NEAR(cc[0], a / (a + c + eps), 1e-7);
  EXPECT_NEAR(cc[1], b / (b + d + eps), 1e-7);
  EXPECT_NEAR(cc[2], c / (a + c + eps), 1e-7);
  EXPECT_NEAR(cc[3], d / (b + d + eps), 1e-7);
}

TEST_F(CpuOps, SinkhornConvergesToNonSymmetricDoublyStochastic) {
  // S = 3 (a 2x2 doubly stochastic matrix is always symmetric), D = 1, fn = 0: comb logits = base.
  const std::vector<float> fn(15 * 3, 0.0f), scale = {1, 1, 1};
  const std::vector<float> base = {0, 0, 0, 0, 0, 0,  // pre, post
                                   0, 2, -1, 1, 0, 3, -2, 1, 0};
  HcWeights w{.fn = view(fn, {15, 3}), .base = view(base, {15}), .scale = view(scale, {3})};
  Tensor X = be->upload_f32({1, 2, 3}, {1, 3, 1});
  Tensor u = be->alloc(ElemType::kF32, {1, 1}), post = be->alloc(ElemType::kF32, {1, 3}),
         comb = be->alloc(ElemType::kF32, {1, 3, 3});
  be->hc_pre({.out_input = u, .out_post = post, .out_comb = comb, .streams = X, .weights = &w,
              .sinkhorn_iters = 20, .hc_eps = 1e-6, .norm_eps = 1e-6});
  const auto m = be->download_f32(comb);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(m[3 * i] + m[3 * i + 1] + m[3 * i + 2], 1.0, 1e-3) << "row " << i;
    EXPECT_NEAR(m[i] + m[3 + i] + m[6 + i], 1.0, 1e-5) << "column " << i;  // normalised last
  }
  EXPECT_GT(std::fabs(m[1] - m[3]), 0.05) << "test needs a non-symmetric combine matrix";
}

TEST_F(CpuOps, HcPostAppliesCombTransposed) {
  // X'[k] = post_k y + sum_j comb[j][k] X[j]; comb = [[0.1, 0.9], [0.6, 0.4]] (row = source).
  Tensor X = be->upload_f32({1, 2, 10, 20}, {1, 2, 2});
  Tensor y = be->upload_f32({100, 200}, {1, 2});
  Tensor post = be->upload_f32({0.5, 2.0}, {1, 2});
  Tensor comb = be->upload_f32({0.1f, 0.9f, 0.6f, 0.4f}, {1, 2, 2});
  be->hc_post({.streams = X, .sublayer = y, .post = post, .comb = comb});
  const auto out = be->download_f32(X);
  EXPECT_NEAR(out[0], 0.5 * 100 + 0.1 * 1 + 0.6 * 10, 1e-4);
  EXPECT_NEAR(out[1], 0.5 * 200 + 0.1 * 2 + 0.6 * 20, 1e-4);
  EXPECT_NEAR(out[2], 2.0 * 100 + 0.9 * 1 + 0.4 * 10, 1e-4);
  EXPECT_NEAR(out[3], 2.0 * 200 + 0.9 * 2 + 0.4 * 20, 1e-4);
}

ModelConfig one_layer_config(AttentionKind kind, int64_t ratio, int64_t dim) {
  ModelConfig c;
  c.num_layers = 1;
  c.sliding_window = 4;
  c.head_dim = dim;
  c.index_head_dim = dim;
  c.attention = {kind};
  c.compress_ratio = {ratio};
  c.moe = {MoeKind::kScored};
  return c;
}

TEST_F(CpuOps, RouterSqrtSoftplusAtExtremeLogits) {
  // x = [1]; gate rows give logits 100, -100, 0, -100.5 (traps.md row 6).
  const std::vector<float> gate_w = {100, -100, 0, -100.5};
  WeightMatrix gate = matrix(gate_w, 4, 1);
  const std::vector<float> bias = {0, 0, 0, 0};
  Tensor x = be->upload_f32({1}, {1, 1});
  Tensor experts = be->alloc(ElemType::kI32, {1, 2}), weights = be->alloc(ElemType::kF32, {1, 2});
  BatchInfo b;
  b.token_ids = {3};
  b.positions = {0};
  b.seq_of_token = {0};
  be->router({.out_experts = experts, .out_weights = weights, .x = x, .gate = &gate, .bias = view(bias, {4}),
              .tid2eid = {}, .batch = &b, .kind = MoeKind::kScored, .k = 2, .routed_scale = 1.5,
              .placement = RoutedScalePlacement::kInRouterWeights});
  auto e = be->download_i32(experts);
  auto w = be->download_f32(weights);
  // sqrt(softplus(100)) = 10, sqrt(softplus(0)) = sqrt(ln 2).
  EXPECT_EQ(e[0], 0);
  EXPECT_EQ(e[1], 2);
  const double s2 = std::sqrt(std::log(2.0));
  EXPECT_NEAR(w[0], 1.5 * 10 / (10 + s2), 1e-6);
  EXPECT_NEAR(w[1], 1.5 * s2 / (10 + s2), 1e-6);

  // Hash routing to the two experts at -100 and -100.5: sqrt(softplus(x)) ~ e^(x/2), so the
  // normalised weights are 1/(1+e^-0.25) and e^-0.25/(1+e^-0.25), never 0/0.
  const std::vector<int64_t> table = {0, 0, 0, 0, 0, 0, 1, 3};  // token 3 -> experts {1, 3}
  TensorView tid2eid;
  tid2eid.dtype = DType::kI64;
  tid2eid.shape = {4, 2};
  tid2eid.data = table.data();
  be->router({.out_experts = experts, .out_weights = weights, .x = x, .gate = &gate, .bias = {}, .tid2eid = tid2eid,
              .batch = &b, .kind = MoeKind::kHash, .k = 2, .routed_scale = 1.5,
              .placement = RoutedScalePlacement::kInExpertCombine});
  e = be->download_i32(experts);
  w = be->download_f32(weights);
  EXPECT_EQ(e[0], 1);
  EXPECT_EQ(e[1], 3);
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-0.25)), 1e-6);  // not scaled: the combine applies 1.5
  EXPECT_NEAR(w[1], std::exp(-0.25) / (1 + std::exp(-0.25)), 1e-6);
  EXPECT_TRUE(std::isfinite(w[0]) && std::isfinite(w[1]));
}

TEST_F(CpuOps, MoeAppliesRoutedScaleExactlyOnceInEitherPlacement) {
  // One expert with identity-like weights, D = F = 1: y = w2 * silu(min(w1 x, L)) * clamp(w3 x).
  const std::vector<float> one = {1.0f}, two = {2.0f}, gate_w = {1.0f, 1.0f};
  std::vector<ExpertWeights> routed(2, ExpertWeights{matrix(one, 1, 1), matrix(two, 1, 1), matrix(one, 1, 1)});
  Tensor x = be->upload_f32({3.0f}, {1, 1});  // w1 x = 3 -> clamp 2.5; w3 x = 3 -> 2.5
  Tensor experts = be->alloc(ElemType::kI32, {1, 1});
  experts.i32()[0] = 1;
  const double h = 2.5 / (1 + std::exp(-2.5)) * 2.5;
  for (auto placement : {RoutedScalePlacement::kInRouterWeights, RoutedScalePlacement::kInExpertCombine}) {
    // The router's output weight for each placement: scaled (1.5 * 1) or not (1).
    const float w = placement == RoutedScalePlacement::kInRouterWeights ? 1.5f : 1.0f;
    Tensor weights = be->upload_f32({w}, {1, 1});
    Tensor out = be->alloc(ElemType::kF32, {1, 1});
    be->moe({.out = out, .x = x, .experts = experts, .weights = weights, .routed = &routed, .shared = &routed[0],
             .swiglu_limit = 2.5, .routed_scale = 1.5, .placement = placement});
    EXPECT_NEAR(be->download_f32(out)[0], 1.5 * 2 * h + 2 * h, 1e-5);
  }
}

TEST_F(CpuOps, CompressorEmitsPooledNormalisedEntriesAtWindowEnds) {
  // HCA, ratio 2, dim 4, rope on the last 2 dims with frequency 0 (rotation is identity here).
  ModelConfig c = one_layer_config(AttentionKind::kHca, 2, 4);
  auto state = be->create_sequence_state(c);
  const std::vector<int32_t> ids = {0, 0, 0};
  BatchInfo b = batch_build({{state.get(), ids}});
  RopeTable rope{.inv_freq = {0.0}};
  const std::vector<float> ape(2 * 4, 0.0f), norm_w(4, 1.0f);
  // Token 0: kv [1,2,3,4], gate ch1 = ln 3; token 1: kv [3,6,1,0], gate 0; token 2: pending.
  Tensor kv = be->upload_f32({1, 2, 3, 4, 3, 6, 1, 0, 9, 9, 9, 9}, {3, 4});
  Tensor gate = be->upload_f32({0, static_cast<float>(std::log(3.0)), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {3, 4});
  be->compressor({.kv = kv, .gate = gate, .ape = view(ape, {2, 4}), .norm_weight = view(norm_w, {4}), .batch = &b,
                  .rope = &rope, .layer = 0, .slot = CompressorSlot::kMain, .ratio = 2, .dim = 4, .overlap = false,
                  .norm_eps = 0.0});
  auto& s = static_cast<cpu::CpuSequenceState*>(state.get())->layer(0).main;
  ASSERT_EQ(s.count, 1);    // tokens 0,1 form entry 0
  ASSERT_EQ(s.pending, 1);  // token 2 waits for its window
  // Pooled [2, 0.75*2+0.25*6, 2, 2] = [2, 3, 2, 2]; rms = sqrt(21/4).
  const double r = std::sqrt(21.0 / 4);
  EXPECT_NEAR(s.entries[0], 2 / r, 1e-6);
  EXPECT_NEAR(s.entries[1], 3 / r, 1e-6);
  EXPECT_NEAR(s.entries[2], 2 / r, 1e-6);
  EXPECT_NEAR(s.entries[3], 2 / r, 1e-6);
}

TEST_F(CpuOps, OverlappingCompressorPoolsPreviousFirstHalfWithCurrentSecondHalf) {
  // CSA, ratio 2, dim 2 (rows are 4 wide: first half A, second half B), no rotation.
  ModelConfig c = one_layer_config(AttentionKind::kCsa, 2, 2);
  auto state = be->create_sequence_state(c);
  const std::vector<int32_t> ids = {0, 0, 0, 0};
  BatchInfo b = batch_build({{state.get(), ids}});
  RopeTable rope{.inv_freq = {0.0}};
  const std::vector<float> ape(2 * 4, 0.0f), norm_w(2, 1.0f);
  // kv rows: A halves a_t, B halves b_t. Equal gates: entry 0 = mean(b0, b1);
  // entry 1 = mean(a0, a1, b2, b3).
  Tensor kv = be->upload_f32({1, 1, 2, 4,    //
                              3, 3, 4, 8,    //
                              5, 0, 10, 1,   //
                              7, 0, 12, 3},  //
                             {4, 4});
  Tensor gate = be->alloc(ElemType::kF32, {4, 4});
  be->compressor({.kv = kv, .gate = gate, .ape = view(ape, {2, 4}), .norm_weight = view(norm_w, {2}), .batch = &b,
                  .rope = &rope, .layer = 0, .slot = CompressorSlot::kMain, .ratio = 2, .dim = 2, .overlap = true,
                  .norm_eps = 0.0});
  auto& s = static_cast<cpu::CpuSequenceState*>(state.get())->layer(0).main;
  ASSERT_EQ(s.count, 2);
  auto normed = [](double x, double y) {
    const double r = std::sqrt((x * x + y * y) / 2);
    return std::pair{x / r, y / r};
  };
  auto [e00, e01] = normed(3, 6);                                    // mean of (2,4), (4,8)
  auto [e10, e11] = normed((1 + 3 + 10 + 12) / 4.0, (1 + 3 + 1 + 3) / 4.0);  // a0, a1, b2, b3
  EXPECT_NEAR(s.entries[0], e00, 1e-6);
  EXPECT_NEAR(s.entries[1], e01, 1e-6);
  EXPECT_NEAR(s.entries[2], e10, 1e-6);
  EXPECT_NEAR(s.entries[3], e11, 1e-6);
}

TEST_F(CpuOps, IndexerTopkWithFewerVisibleEntriesThanK) {
  // 3 entries exist, ratio 4: the query at position 9 sees floor(10/4) = 2 of them; k = 4.
  ModelConfig c = one_layer_config(AttentionKind::kCsa, 4, 2);
  auto state = be->create_sequence_state(c);
  auto& keys = static_cast<cpu::CpuSequenceState*>(state.get())->layer(0).indexer;
  keys.entries = {1, 0, 0, 1, 5, 5};  // entry 2 would win but is not visible yet
  keys.count = 3;
  BatchInfo b;
  b.token_ids = {0, 0};
  b.positions = {9, 9};
  b.seq_of_token = {0, 0};
  b.seqs = {state.get()};
  // One head, weight 1. Query 0 = (0, 2): scores entry0 0, entry1 2 -> [1, 0, -1, -1].
  // Query 1 = (-1, -1): both ReLU to 0, a tie: the lower index first -> [0, 1, -1, -1].
  Tensor q = be->upload_f32({0, 2, -1, -1}, {2, 1, 2});
  Tensor w = be->upload_f32({1, 1}, {2, 1});
  Tensor out = be->alloc(ElemType::kI32, {2, 4});
  be->indexer_topk({.out_indices = out, .q = q, .head_weights = w, .batch = &b, .layer = 0, .ratio = 4, .k = 4});
  const auto idx = be->download_i32(out);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 0, -1, -1, 0, 1, -1, -1}));
}

TEST_F(CpuOps, AttentionSinkOnlyAddsToTheDenominator) {
  // One head, Dh = 2, one window key k = (1, 0) at position 0, query (0, 0): logit 0.
  // p = e^0 / (e^0 + e^sink); output = p * k.
  ModelConfig c = one_layer_config(AttentionKind::kSliding, 0, 2);
  auto state = be->create_sequence_state(c);
  const std::vector<int32_t> ids = {0};
  BatchInfo b = batch_build({{state.get(), ids}});
  const std::vector<float> sink = {std::log(3.0f)};
  Tensor q = be->upload_f32({0, 0}, {1, 1, 2});
  Tensor kv = be->upload_f32({1, 0}, {1, 2});
  Tensor out = be->alloc(ElemType::kF32, {1, 1, 2});
  be->attention({.out = out, .q = q, .kv = kv, .selected = {}, .sinks = view(sink, {1}), .batch = &b, .layer = 0,
                 .kind = AttentionKind::kSliding, .ratio = 0, .window = 4, .scale = 1.0});
  const auto o = be->download_f32(out);
  EXPECT_NEAR(o[0], 0.25, 1e-6);
  EXPECT_NEAR(o[1], 0.0, 1e-7);
}

// The RoPE attention cases' inputs: three tokens of one sequence at positions 0-2, two heads of 6
// dims, RoPE on the last 4.
struct RopeAttentionCase {
  static constexpr int64_t H = 2, Dh = 6, T = 3;
  RopeTable table{.inv_freq = {1.0, 0.5}};
  std::vector<float> q = {0.3f, -1.2f, 2.5f, 0.7f, -0.4f, 1.9f, 3.1f, 0.2f, -2.2f, 0.9f, 1.4f, -0.6f,
                          -0.8f, 1.1f, 0.5f, -1.7f, 2.0f, 0.1f, 0.6f, -0.9f, 1.3f, 2.4f, -1.5f, 0.8f,
                          1.0f, 0.0f, -0.3f, 0.4f, 1.6f, -2.1f, -1.1f, 0.7f, 0.2f, -0.5f, 0.9f, 1.8f};
  std::vector<float> kv = {0.5f, 1.0f, -0.5f, 0.25f, 2.0f, -1.0f, 1.5f, -0.75f, 0.1f, 0.3f, -0.2f, 0.6f,
                           -1.0f, 0.4f, 0.8f, -0.6f, 0.2f, 1.2f};
  std::vector<float> sink = {0.5f, -0.25f};
};

// AttentionParams::q_rope: q given before its per-head norm and RoPE gives the attention of q after
// rms_norm and rope (the model's order), bit for bit, with and without bf16 roundings
// (RopeAttentionCase).
TEST_F(CpuOps, AttentionNormsAndRotatesQWhenGivenItsRope) {
  const RopeAttentionCase rc;
  const int64_t H = rc.H, Dh = rc.Dh, T = rc.T;
  ModelConfig c = one_layer_config(AttentionKind::kSliding, 0, Dh);
  for (bool round : {false, true}) {
    std::vector<float> outs[2];
    for (int folded = 0; folded < 2; ++folded) {
      auto state = be->create_sequence_state(c);
      const std::vector<int32_t> ids = {0, 1, 2};
      BatchInfo b = batch_build({{state.get(), ids}});
      Tensor q = be->upload_f32(rc.q, {T, H, Dh});
      if (!folded) {
        be->rms_norm({.out = q, .in = q, .weight = {}, .group = Dh, .eps = 1e-6, .round_bf16 = round});
        be->rope({.x = q, .table = &rc.table, .direction = RopeDirection::kForward, .round_bf16 = round}, b);
      }
      Tensor out = be->alloc(ElemType::kF32, {T, H, Dh});
      be->attention({.out = out, .q = q, .kv = be->upload_f32(rc.kv, {T, Dh}), .selected = {}, .sinks = view(rc.sink, {H}),
                     .batch = &b, .layer = 0, .kind = AttentionKind::kSliding, .ratio = 0, .window = 4, .scale = 0.4,
                     .round_bf16 = round, .q_rope = folded ? &rc.table : nullptr, .q_norm_eps = 1e-6});
      outs[folded] = be->download_f32(out);
    }
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t i = 0; i < outs[0].size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(outs[0][i]), std::bit_cast<uint32_t>(outs[1][i])) << "value " << i << (round ? ", rounded" : "");
  }
}

// AttentionParams::o_rope: the attention's output rotated back (inverse RoPE at each token's
// position, the last 4 dims) is the attention followed by rope (the model's order), bit for bit,
// with and without bf16 roundings, and differs from the output left as it is (the rotation ran;
// RopeAttentionCase).
TEST_F(CpuOps, AttentionRotatesItsOutputBackWhenGivenItsRope) {
  const RopeAttentionCase rc;
  const int64_t H = rc.H, Dh = rc.Dh, T = rc.T;
  ModelConfig c = one_layer_config(AttentionKind::kSliding, 0, Dh);
  for (bool round : {false, true}) {
    std::vector<float> outs[3];  // the ops, the folded call, the output not rotated
    for (int way = 0; way < 3; ++way) {
      auto state = be->create_sequence_state(c);
      const std::vector<int32_t> ids = {0, 1, 2};
      BatchInfo b = batch_build({{state.get(), ids}});
      Tensor out = be->alloc(ElemType::kF32, {T, H, Dh});
      be->attention({.out = out, .q = be->upload_f32(rc.q, {T, H, Dh}), .kv = be->upload_f32(rc.kv, {T, Dh}), .selected = {},
                     .sinks = view(rc.sink, {H}), .batch = &b, .layer = 0, .kind = AttentionKind::kSliding, .ratio = 0,
                     .window = 4, .scale = 0.4, .round_bf16 = round, .o_rope = way == 1 ? &rc.table : nullptr});
      if (way == 0) be->rope({.x = out, .table = &rc.table, .direction = RopeDirection::kInverse, .round_bf16 = round}, b);
      outs[way] = be->download_f32(out);
    }
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t i = 0; i < outs[0].size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(outs[0][i]), std::bit_cast<uint32_t>(outs[1][i])) << "value " << i << (round ? ", rounded" : "");
    EXPECT_NE(outs[1], outs[2]) << "the output was not rotated" << (round ? ", rounded" : "");
  }
}

// AttentionParams::weights_bf16 (the `--attn-weights bf16` experiment): each weight p is rounded to
// bf16 (relative error at most 2^-8, half a unit of its 8-bit significand) where it weights its key,
// while the denominator keeps it unrounded, so every output differs from the fp32 weights' by at
// most 2^-8 of the largest |key| in
// its dim (the weights over the denominator sum to at most 1), and some differ. 100 tokens of one
// sequence in one call (up to 100 candidates: several chunks of 32 and the running max's rescaling),
// two heads of 8 dims, a sink. With q = 0 every logit is 0 and every weight 1, exact in bf16: the
// outputs then agree to within the sums' order.
TEST_F(CpuOps, AttentionWithBf16WeightsStaysWithinTheirRounding) {
  const int64_t H = 2, Dh = 8, T = 100;
  ModelConfig c = one_layer_config(AttentionKind::kSliding, 0, Dh);
  c.sliding_window = 128;
  auto state = be->create_sequence_state(c);
  const std::vector<int32_t> ids(T, 0);
  BatchInfo b = batch_build({{state.get(), ids}});
  std::vector<float> q(T * H * Dh), kv(T * Dh);
  uint32_t seed = 12345;
  const auto next = [&seed] {  // uniform in [-2, 2), a fixed sequence
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 4.0f - 2.0f;
  };
  for (float& v : q) v = next();
  for (float& v : kv) v = next();
  const std::vector<float> sink = {0.5f, -1.0f};
  const auto run = [&](const std::vector<float>& qv, bool bf16) {
    Tensor out = be->alloc(ElemType::kF32, {T, H, Dh});
    be->attention({.out = out, .q = be->upload_f32(qv, {T, H, Dh}), .kv = be->upload_f32(kv, {T, Dh}), .selected = {},
                   .sinks = view(sink, {H}), .batch = &b, .layer = 0, .kind = AttentionKind::kSliding, .ratio = 0,
                   .window = 128, .scale = 1.5, .weights_bf16 = bf16});
    return be->download_f32(out);
  };
  const std::vector<float> exact = run(q, false), rounded = run(q, true);
  std::vector<float> key_max(Dh, 0.0f);
  for (int64_t j = 0; j < T; ++j)
    for (int64_t d = 0; d < Dh; ++d) key_max[d] = std::max(key_max[d], std::fabs(kv[j * Dh + d]));
  int differ = 0;
  for (int64_t i = 0; i < T * H * Dh; ++i) {
    const double bound = std::ldexp(1.0, -8) * key_max[i % Dh] * (1 + 1e-5) + 1e-7;
    EXPECT_LE(std::fabs(rounded[i] - exact[i]), bound) << "value " << i;
    differ += rounded[i] != exact[i];
  }
  EXPECT_GT(differ, T * H * Dh / 4) << "the weights were not rounded";
  const std::vector<float> zeros(T * H * Dh, 0.0f);
  const std::vector<float> flat = run(zeros, false), flat_rounded = run(zeros, true);
  for (int64_t i = 0; i < T * H * Dh; ++i) EXPECT_NEAR(flat_rounded[i], flat[i], 1e-6) << "value " << i;
}

// With bf16 weights a CSA selection's masked slots (-1) keep their places in the chunks of 32, as in
// DeepSeek's kernel and the CUDA ones: 16 masked slots ahead of 40 entries move the chunk edges, so
// the weights are rounded under other running maxima (the logits grow along the entries) and some
// output differs from the unmasked selection's; a whole chunk of masked slots between two chunks
// changes nothing (the same bits). Exact weights give the unmasked bits either way. One token (its
// window is itself), one head of 8 dims.
TEST_F(CpuOps, AttentionWithBf16WeightsKeepsMaskedSlotsInTheirChunks) {
  const int64_t Dh = 8, n = 40;
  ModelConfig c = one_layer_config(AttentionKind::kCsa, 4, Dh);
  c.sliding_window = 1;
  auto state = be->create_sequence_state(c);
  auto& main = static_cast<cpu::CpuSequenceState*>(state.get())->layer(0).main;
  main.entries.resize(n * Dh);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < Dh; ++d)
      main.entries[i * Dh + d] = d == 0 ? 0.11f * static_cast<float>(i) : std::sin(0.7f * static_cast<float>(i * Dh + d));
  main.count = n;
  const std::vector<int32_t> ids = {0};
  BatchInfo b = batch_build({{state.get(), ids}});
  std::vector<float> q(Dh, 0.0f), kv(Dh, 0.25f);
  q[0] = 1.0f;
  const std::vector<float> sink = {-1.0f};
  const auto run = [&](const std::vector<int32_t>& sel, bool bf16) {
    Tensor out = be->alloc(ElemType::kF32, {1, 1, Dh});
    be->attention({.out = out, .q = be->upload_f32(q, {1, 1, Dh}), .kv = be->upload_f32(kv, {1, Dh}),
                   .selected = be->upload_i32(sel, {1, static_cast<int64_t>(sel.size())}), .sinks = view(sink, {1}),
                   .batch = &b, .layer = 0, .kind = AttentionKind::kCsa, .ratio = 4, .window = 1, .scale = 1.0,
                   .weights_bf16 = bf16});
    return be->download_f32(out);
  };
  std::vector<int32_t> plain(n), ahead(16, -1), between;
  for (int64_t i = 0; i < n; ++i) plain[i] = static_cast<int32_t>(i);
  ahead.insert(ahead.end(), plain.begin(), plain.end());
  // (Chunk 0: the window's token and entries 0-30; then 32 masked slots; then entries 31-39.)
  between.assign(plain.begin(), plain.begin() + 31);
  between.insert(between.end(), 32, -1);
  between.insert(between.end(), plain.begin() + 31, plain.end());
  const std::vector<float> want = run(plain, true);
  EXPECT_NE(run(ahead, true), want) << "masked slots dropped from the chunks";
  EXPECT_EQ(run(between, true), want) << "a chunk of masked slots changed the result";
  const std::vector<float> exact = run(plain, false);
  EXPECT_EQ(run(ahead, false), exact);
  EXPECT_EQ(run(between, false), exact);
  EXPECT_NE(want, exact) << "the weights were not rounded";
}

// The greedy rule (core/argmax.h) on rows written by hand, through the host helper and the op.
TEST_F(CpuOps, ArgmaxRowsTakesTheFirstMaxAndTheFirstNan) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {
      {1, 3, 2, 3, 3},            // a tie: the lowest index
      {-inf, -inf, -inf, -inf, -inf},  // all -inf: the first
      {0, 5, nan, 7, nan},        // the first NaN beats every number
      {nan, 1, 2, 3, 4},          // a NaN first
      {-0.0f, 0.0f, -1, -2, -3},  // -0 and 0 are equal: the lower index
      {-5, -4, inf, -inf, inf},   // +inf, twice
  };
  const std::vector<int32_t> want = {1, 0, 2, 0, 0, 2};
  std::vector<float> flat;
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(argmax_first(rows[r].data(), 5), want[r]) << "row " << r;
    flat.insert(flat.end(), rows[r].begin(), rows[r].end());
  }
  const std::vector<int32_t> got = be->download_i32(be->argmax_rows(be->upload_f32(flat, {6, 5})));
  EXPECT_EQ(got, want);
  const std::vector<float> one = {42};
  EXPECT_EQ(be->download_i32(be->argmax_rows(be->upload_f32(one, {1, 1}))), std::vector<int32_t>{0});
}

// The greedy loops' check on a backend's ids: in range they come back as they are; an id at or past
// the vocabulary, or negative, is an internal error that names it.
TEST_F(CpuOps, DownloadTokenIdsRefusesIdsOutsideTheVocabulary) {
  const std::vector<int32_t> good = {0, 7, 9};
  const Expected<std::vector<int32_t>> ok = download_token_ids(*be, be->upload_i32(good, {3}), 10);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok.value(), good);
  for (int32_t bad : {10, -1}) {
    const Expected<std::vector<int32_t>> r = download_token_ids(*be, be->upload_i32({3, bad}, {2}), 10);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
    EXPECT_NE(r.status().message().find("token id " + std::to_string(bad) + " (vocabulary 10)"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace sparrow
