// The deepseek-ref numerics profile (spec §3.0.5-§3.0.8, §4): its primitives against hand values,
// and the model-level contracts it must keep (chunking invariance; closeness to fp32).
#include <gtest/gtest.h>

#include "model/test_model.h"

#include <cmath>

#include "core/compare.h"
#include "core/npy.h"
#include "core/quant_sim.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/taps.h"

namespace sparrow {
namespace {

using testing::fixture_ids;

const std::filesystem::path kFixtures = SPARROW_FIXTURES_DIR;

TEST(RefNumerics, Fp8ActQuantUsesPowerOfTwoScales) {
  // Block amax 100 -> s = 2^ceil(log2(100/448)) = 2^-2. x/s = 400 lies halfway between the e4m3
  // grid points 384 and 416 (step 32 there) and goes to the even mantissa, 384 -> 96; 1/s = 4 is on
  // the grid; 3.3/s = 13.2 rounds to 13 (step 1 below 16) -> 3.25.
  std::vector<float> x = {100, 1, 3.3f, -0.3f};
  fp8_pow2_quant_sim(x.data(), 4, 128);
  EXPECT_EQ(x[0], 96);
  EXPECT_EQ(x[1], 1);
  EXPECT_EQ(x[2], 3.25f);
  EXPECT_EQ(x[3], -0.3125f);  // -0.3/s = -1.2 -> -1.25 (step 0.125 in [1, 2)) -> -0.3125
  // Blocks are independent: the second block of 2 has its own scale (amax 0.5 -> s = 2^-9).
  std::vector<float> y = {448, 448, 0.5f, 0.3f};
  fp8_pow2_quant_sim(y.data(), 4, 2);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_NEAR(y[3], 0.3f, 0.3f / 16);
}

TEST(RefNumerics, HadamardIsOrthonormalSylvester) {
  std::vector<float> x = {1, 0, 0, 0};
  hadamard_transform(x.data(), 4);
  for (float v : x) EXPECT_FLOAT_EQ(v, 0.5f);
  std::vector<float> e1 = {0, 1, 0, 0};  // second row of H_4 = [1, -1, 1, -1] / 2
  hadamard_transform(e1.data(), 4);
  EXPECT_EQ(e1, (std::vector<float>{0.5f, -0.5f, 0.5f, -0.5f}));
  std::vector<float> v = {0.3f, -1.2f, 2.5f, 7.0f, 0.0f, 1.0f, -3.0f, 0.25f};
  std::vector<float> w = v;
  hadamard_transform(w.data(), 8);
  hadamard_transform(w.data(), 8);  // H/sqrt(n) is its own inverse
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(w[i], v[i], 1e-6);
}

TEST(RefNumerics, ProfileKeepsChunkingInvarianceAndStaysNearFp32) {
  auto backend = make_cpu_backend();
  auto ref = Model::load(kFixtures / "mixed_hc2", {.precision = Precision::kDeepseekRef}).value();
  auto fp32 = Model::load(kFixtures / "mixed_hc2").value();
  const auto ids = fixture_ids("mixed_hc2");
  const int64_t T = static_cast<int64_t>(ids.size()), V = ref->config().vocab_size;
  Session rs(*ref, *backend), fs(*fp32, *backend);
  const auto one_shot = rs.logits(ids, 0).value();
  for (int64_t chunk : {1, 7}) {
    const auto r = compare_f32(rs.logits(ids, chunk).value(), one_shot, {.atol = 0, .rtol = 0}, {T, V});
    EXPECT_TRUE(r.ok) << "chunk " << chunk << ": " << r.message;
  }
  // Same model, coarser arithmetic: clearly different logits, yet pointing the same way.
  const auto exact = fs.logits(ids, 0).value();
  const auto d = compare_f32(one_shot, exact, {.atol = INFINITY});
  std::printf("[deepseek-ref vs fp32] mixed_hc2: %s\n", d.summary().c_str());
  EXPECT_GT(d.rel_to_max, 1e-3);
  EXPECT_LT(d.cosine_distance, 0.1);
}

// A backend with every op but the reference numerics: the CPU backend behind a wrapper that says
// it has no quant_sim (as the CUDA backend said once). `bf16_weights_kernel`: it says it has them
// and AttentionParams::weights_bf16 on bf16 operands and a multiple of `heads_multiple` heads only,
// as the CUDA backend does (32 there).
class NoReferenceNumerics final : public Backend {
 public:
  explicit NoReferenceNumerics(bool bf16_weights_kernel = false, int64_t heads_multiple = 1)
      : bf16_weights_kernel_(bf16_weights_kernel), heads_multiple_(heads_multiple) {}
  const char* name() const override { return bf16_weights_kernel_ ? "bf16-weights-kernel" : "no-ref"; }
  bool supports_reference_numerics() const override { return bf16_weights_kernel_; }
  bool supports_attention_weights_bf16(bool bf16_operands, int64_t heads, int64_t) const override {
    return bf16_weights_kernel_ && bf16_operands && heads % heads_multiple_ == 0;
  }
  Tensor alloc(ElemType t, std::vector<int64_t> s) override { return cpu_->alloc(t, std::move(s)); }
  Tensor upload_f32(const std::vector<float>& v, std::vector<int64_t> s) override { return cpu_->upload_f32(v, std::move(s)); }
  Tensor upload_i32(const std::vector<int32_t>& v, std::vector<int64_t> s) override { return cpu_->upload_i32(v, std::move(s)); }
  std::vector<float> download_f32(const Tensor& t) override { return cpu_->download_f32(t); }
  std::vector<int32_t> download_i32(const Tensor& t) override { return cpu_->download_i32(t); }
  std::unique_ptr<SequenceState> create_sequence_state(const ModelConfig& c) override { return cpu_->create_sequence_state(c); }
  void embed(const EmbedParams& p, const BatchInfo& b) override { cpu_->embed(p, b); }
  void hc_pre(const HcPreParams& p) override { cpu_->hc_pre(p); }
  void hc_post(const HcPostParams& p) override { cpu_->hc_post(p); }
  void hc_head(const HcHeadParams& p) override { cpu_->hc_head(p); }
  void rms_norm(const RmsNormParams& p) override { cpu_->rms_norm(p); }
  void linear(const LinearParams& p) override { cpu_->linear(p); }
  void grouped_linear(const GroupedLinearParams& p) override { cpu_->grouped_linear(p); }
  void rope(const RopeParams& p, const BatchInfo& b) override { cpu_->rope(p, b); }
  void compressor(const CompressorParams& p) override { cpu_->compressor(p); }
  void indexer_topk(const IndexerTopkParams& p) override { cpu_->indexer_topk(p); }
  void attention(const AttentionParams& p) override { cpu_->attention(p); }
  void window_append(const WindowAppendParams& p) override { cpu_->window_append(p); }
  void router(const RouterParams& p) override { cpu_->router(p); }
  void moe(const MoeParams& p) override { cpu_->moe(p); }

 private:
  bool bf16_weights_kernel_;
  int64_t heads_multiple_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

TEST(RefNumerics, BackendsWithoutThemAreRefusedClearly) {
  NoReferenceNumerics plain;
  auto cpu = make_cpu_backend();
  const auto ids = fixture_ids("csa");
  auto fp32 = Model::load(kFixtures / "csa").value();
  EXPECT_TRUE(fp32->check_backend(plain).is_ok());
  EXPECT_TRUE(Session(*fp32, plain).logits(ids, 0).is_ok());
  {
    auto model = Model::load(kFixtures / "csa", ModelOverrides{.index_topk = {}, .index_keys = KeyPrecision::kF32, .precision = Precision::kDeepseekRef}).value();
    EXPECT_TRUE(model->check_backend(*cpu).is_ok());
    const auto r = Session(*model, plain).logits(ids, 0);  // refused before any op runs
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("no-ref backend"), std::string::npos) << r.status().message();
  }
  // --index-keys needs only CompressorParams::key_precision, which every backend implements.
  auto keys = Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = KeyPrecision::kFp8}).value();
  EXPECT_TRUE(keys->check_backend(plain).is_ok());
  EXPECT_TRUE(Session(*keys, plain).logits(ids, 0).is_ok());
  // bf16 attention weights (`--attn-weights bf16`):
  // refused on a backend without them, naming the choice and the backend, before any op runs; on
  // the CPU they change the logits (and not by much: the CpuOps.AttentionWithBf16Weights* bound).
  {
    ModelOverrides ov;
    ov.attn_weights_bf16 = true;
    auto model = Model::load(kFixtures / "csa", ov).value();
    EXPECT_TRUE(model->attn_weights_bf16());
    const auto r = Session(*model, plain).logits(ids, 0);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("bf16 attention weights (precision fp32 with --attn-weights bf16)"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("no-ref backend"), std::string::npos) << r.status().message();
    auto rounded = Session(*model, *cpu).logits(ids, 0);
    auto plain_logits = Session(*fp32, *cpu).logits(ids, 0);
    ASSERT_TRUE(rounded.is_ok() && plain_logits.is_ok());
    ASSERT_EQ(rounded->size(), plain_logits->size());
    EXPECT_NE(*rounded, *plain_logits) << "--attn-weights bf16 left the logits unchanged";
  }
  // A backend whose attention rounds the weights only on bf16 operands and some heads: fp32 with
  // bf16 weights refused naming the precision; fast (bf16 operands) accepted; heads it does not take
  // (the fixture's 4 against a multiple of 8) refused, naming them, where the choice came from (the
  // flag or fast's default) and the way out, and accepted with exact weights.
  {
    NoReferenceNumerics kernel(true);
    ModelOverrides ov;
    ov.attn_weights_bf16 = true;
    const Status on_fp32 = Model::load(kFixtures / "csa", ov).value()->check_backend(kernel);
    EXPECT_EQ(on_fp32.code(), StatusCode::kUnsupported);
    EXPECT_NE(on_fp32.message().find("precision fp32"), std::string::npos) << on_fp32.message();
    EXPECT_NE(on_fp32.message().find("bf16-weights-kernel backend"), std::string::npos) << on_fp32.message();
    ov.precision = Precision::kFast;
    EXPECT_TRUE(Model::load(kFixtures / "csa", ov).value()->check_backend(kernel).is_ok());
    NoReferenceNumerics eights(true, 8);
    const Status heads = Model::load(kFixtures / "csa", ov).value()->check_backend(eights);
    EXPECT_EQ(heads.code(), StatusCode::kUnsupported);
    EXPECT_NE(heads.message().find("precision fast with --attn-weights bf16"), std::string::npos) << heads.message();
    EXPECT_NE(heads.message().find("4 heads of 32"), std::string::npos) << heads.message();
    EXPECT_NE(heads.message().find("--attn-weights fp32"), std::string::npos) << heads.message();
    ov.attn_weights_bf16 = std::nullopt;  // (fast's default: bf16)
    const Status by_default = Model::load(kFixtures / "csa", ov).value()->check_backend(eights);
    EXPECT_EQ(by_default.code(), StatusCode::kUnsupported);
    EXPECT_NE(by_default.message().find("precision fast's default"), std::string::npos) << by_default.message();
    ov.attn_weights_bf16 = false;
    EXPECT_TRUE(Model::load(kFixtures / "csa", ov).value()->check_backend(eights).is_ok());
  }
  EXPECT_EQ(precision_from_name("deepseek-ref"), Precision::kDeepseekRef);
  EXPECT_EQ(precision_from_name("fast"), Precision::kFast);
  EXPECT_STREQ(precision_name(Precision::kFast), "fast");
  EXPECT_FALSE(precision_from_name("fp8").has_value());
  // "auto" (the CLI's and the engine's default): the GPU runs its production numerics, the CPU the
  // reference.
  EXPECT_EQ(default_precision("cuda"), Precision::kFast);
  EXPECT_EQ(default_precision("cpu"), Precision::kFp32);
}

TEST(FastNumerics, RefusedWhereNotImplementedNamingWhatIsMissing) {
  // A backend without the reference numerics (CPU and CUDA both have them) refuses `fast` before
  // any op runs, and says which pieces it lacks.
  NoReferenceNumerics plain;
  auto model = Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = {}, .precision = Precision::kFast}).value();
  const auto r = Session(*model, plain).logits(fixture_ids("csa"), 0);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  for (const char* missing : {"fast", "no-ref backend", "round_bf16", "act_quant_fp8", "quant_sim", "ref_numerics"})
    EXPECT_NE(r.status().message().find(missing), std::string::npos) << missing << ": " << r.status().message();
  EXPECT_TRUE(model->check_backend(*make_cpu_backend()).is_ok());
}

TEST(FastNumerics, IndexKeysDefaultToBf16AndStayOverridable) {
  auto fast = Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = {}, .precision = Precision::kFast}).value();
  EXPECT_EQ(fast->index_keys(), KeyPrecision::kBf16);
  auto fp4 = Model::load(kFixtures / "csa", {.index_topk = 2, .index_keys = KeyPrecision::kFp4, .precision = Precision::kFast}).value();
  EXPECT_EQ(fp4->index_keys(), KeyPrecision::kFp4);
  EXPECT_EQ(fp4->config().index_topk, 2);
  EXPECT_EQ(Model::load(kFixtures / "csa").value()->index_keys(), KeyPrecision::kF32);
  EXPECT_EQ(Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = {}, .precision = Precision::kDeepseekRef})
                .value()->index_keys(),
            KeyPrecision::kF32);
}

// The attention's softmax weights: by default the profile's (precision_default_attn_weights_bf16:
// exact under fp32, rounded to bf16 under fast and deepseek-ref, as DeepSeek's kernel does), either
// way by `--attn-weights`. The default's logits are the named choice's bits, and differ from the
// other choice's.
TEST(FastNumerics, AttentionWeightsFollowTheProfileAndStayOverridable) {
  const auto load = [](Precision p, std::optional<bool> bf16) {
    ModelOverrides ov;
    ov.precision = p;
    ov.attn_weights_bf16 = bf16;
    return Model::load(kFixtures / "csa", ov).value();
  };
  EXPECT_TRUE(precision_default_attn_weights_bf16(Precision::kFast));
  EXPECT_TRUE(precision_default_attn_weights_bf16(Precision::kDeepseekRef));
  EXPECT_FALSE(precision_default_attn_weights_bf16(Precision::kFp32));
  EXPECT_TRUE(load(Precision::kFast, std::nullopt)->attn_weights_bf16());
  EXPECT_TRUE(load(Precision::kDeepseekRef, std::nullopt)->attn_weights_bf16());
  EXPECT_FALSE(load(Precision::kFp32, std::nullopt)->attn_weights_bf16());
  EXPECT_FALSE(load(Precision::kFast, false)->attn_weights_bf16());
  EXPECT_TRUE(load(Precision::kFp32, true)->attn_weights_bf16());
  auto backend = make_cpu_backend();
  const auto ids = fixture_ids("csa");
  const auto by_default = Session(*load(Precision::kFast, std::nullopt), *backend).logits(ids, 0).value();
  const auto rounded = Session(*load(Precision::kFast, true), *backend).logits(ids, 0).value();
  const auto exact = Session(*load(Precision::kFast, false), *backend).logits(ids, 0).value();
  EXPECT_EQ(by_default, rounded);
  EXPECT_NE(rounded, exact);
  EXPECT_EQ(attn_weights_from_name("auto").value(), std::nullopt);
  EXPECT_EQ(attn_weights_from_name("fp32").value(), std::optional<bool>(false));
  EXPECT_EQ(attn_weights_from_name("bf16").value(), std::optional<bool>(true));
  const auto bad = attn_weights_from_name("fp16");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'fp16' is not auto, fp32 or bf16"), std::string::npos) << bad.status().message();
}

TEST(FastNumerics, DiffersFromBothFp32AndDeepseekRef) {
  // fast shares deepseek-ref's roundings but not its indexer (no Hadamard/FP4, fp32 scores): on a
  // CSA fixture the logits differ from both, and the index queries equal deepseek-ref's before its
  // Hadamard (so the difference is the indexer's, not a dropped rounding elsewhere).
  auto backend = make_cpu_backend();
  const auto ids = fixture_ids("csa");
  auto fast = Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = {}, .precision = Precision::kFast}).value();
  auto ref = Model::load(kFixtures / "csa", {.index_topk = {}, .index_keys = {}, .precision = Precision::kDeepseekRef}).value();
  auto fp32 = Model::load(kFixtures / "csa").value();
  const auto lf = Session(*fast, *backend).logits(ids, 0).value();
  const auto lr = Session(*ref, *backend).logits(ids, 0).value();
  const auto l32 = Session(*fp32, *backend).logits(ids, 0).value();
  EXPECT_NE(lf, lr);
  EXPECT_NE(lf, l32);
  const auto tf = taps_run(*fast, *backend, ids, "L1.attn.kv,L1.attn.qr").value();
  const auto tr = taps_run(*ref, *backend, ids, "L1.attn.kv,L1.attn.qr").value();
  ASSERT_EQ(tf.size(), 2u);
  // Layer 1's inputs come through layer 0 (no indexer there): identical in both profiles.
  for (size_t i = 0; i < tf.size(); ++i) EXPECT_EQ(tf[i].f32, tr[i].f32) << tf[i].name;
}
}  // namespace
}  // namespace sparrow
