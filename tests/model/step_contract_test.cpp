// The step contract between the model and a backend (ops/backend.h, begin_step / step_segment /
// end_step), which the CUDA backend's graphs rely on (docs/cuda.md, "CUDA graphs"): a forward is
// one step over its tokens, cut after every layer, capturable unless a tap reads tensors back
// within it, and no op is called outside it. Checked on the CPU backend through a wrapper that
// records the calls and forwards every op; the wrapper's logits must be the CPU's own.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/test_model.h"
#include "runtime/session.h"
#include "runtime/taps.h"

namespace sparrow {
namespace {

// Forwards every op to `inner`; logs "begin T capturable", "segment", "end" and, between a
// begin and its end, "op" once for each run of ops (so the log shows where ops ran).
class StepRecorder final : public Backend {
 public:
  explicit StepRecorder(Backend& inner) : inner_(inner) {}
  std::vector<std::string> log;
  int depth = 0;
  int ops_outside = 0;  // ops called with no step open (allocations and transfers are allowed)

  const char* name() const override { return inner_.name(); }
  Tensor alloc(ElemType type, std::vector<int64_t> shape) override { return inner_.alloc(type, std::move(shape)); }
  Tensor upload_f32(const std::vector<float>& v, std::vector<int64_t> shape) override {
    return inner_.upload_f32(v, std::move(shape));
  }
  Tensor upload_i32(const std::vector<int32_t>& v, std::vector<int64_t> shape) override {
    return inner_.upload_i32(v, std::move(shape));
  }
  std::vector<float> download_f32(const Tensor& t) override { return inner_.download_f32(t); }
  std::vector<int32_t> download_i32(const Tensor& t) override { return inner_.download_i32(t); }
  std::unique_ptr<SequenceState> create_sequence_state(const ModelConfig& c) override {
    return inner_.create_sequence_state(c);
  }
  void embed(const EmbedParams& p, const BatchInfo& b) override { op(), inner_.embed(p, b); }
  void hc_pre(const HcPreParams& p) override { op(), inner_.hc_pre(p); }
  void hc_post(const HcPostParams& p) override { op(), inner_.hc_post(p); }
  void hc_head(const HcHeadParams& p) override { op(), inner_.hc_head(p); }
  void rms_norm(const RmsNormParams& p) override { op(), inner_.rms_norm(p); }
  void linear(const LinearParams& p) override { op(), inner_.linear(p); }
  // Each linears() call's weights, and whether its params share one input and one set of flags
  // (what lets a backend run them as one GEMM).
  std::vector<std::vector<const WeightMatrix*>> linears_calls;
  std::vector<bool> linears_alike;
  void linears(std::span<const LinearParams> ps) override {
    op();
    std::vector<const WeightMatrix*> ws;
    bool alike = true;
    for (const LinearParams& p : ps) {
      ws.push_back(p.weight);
      alike = alike && p.in.f32() == ps[0].in.f32() && p.in.numel() == ps[0].in.numel() &&
              p.act_quant_fp8 == ps[0].act_quant_fp8 && p.round_bf16 == ps[0].round_bf16 &&
              p.input_bf16 == ps[0].input_bf16;
    }
    linears_calls.push_back(std::move(ws));
    linears_alike.push_back(alike);
    inner_.linears(ps);
  }
  void grouped_linear(const GroupedLinearParams& p) override { op(), inner_.grouped_linear(p); }
  void linear_fp8_block(const LinearFp8BlockParams& p) override { op(), inner_.linear_fp8_block(p); }
  void rope(const RopeParams& p, const BatchInfo& b) override { op(), inner_.rope(p, b); }
  void compressor(const CompressorParams& p) override { op(), inner_.compressor(p); }
  void indexer_topk(const IndexerTopkParams& p) override { op(), inner_.indexer_topk(p); }
  void attention(const AttentionParams& p) override { op(), inner_.attention(p); }
  void window_append(const WindowAppendParams& p) override { op(), inner_.window_append(p); }
  void router(const RouterParams& p) override { op(), inner_.router(p); }
  void moe(const MoeParams& p) override { op(), inner_.moe(p); }
  Tensor gather_rows(const Tensor& in, const std::vector<int64_t>& rows) override {
    op();
    return inner_.gather_rows(in, rows);
  }
  void quant_sim(const QuantSimParams& p) override { op(), inner_.quant_sim(p); }
  bool supports_reference_numerics() const override { return inner_.supports_reference_numerics(); }
  bool supports_attention_weights_bf16(bool bf16_operands, int64_t heads, int64_t head_dim) const override {
    return inner_.supports_attention_weights_bf16(bf16_operands, heads, head_dim);
  }

  void begin_step(int64_t tokens, bool capturable) override {
    log.push_back("begin " + std::to_string(tokens) + (capturable ? " capturable" : " eager"));
    ++depth;
    inner_.begin_step(tokens, capturable);
  }
  void step_segment() override {
    log.push_back("segment");
    inner_.step_segment();
  }
  void end_step() override {
    log.push_back("end");
    --depth;
    inner_.end_step();
  }

 private:
  void op() {
    if (depth == 0) ++ops_outside;
    if (log.empty() || log.back() != "op") log.push_back("op");
  }
  Backend& inner_;
};

// The log one forward of T tokens over `layers` layers should leave.
std::vector<std::string> one_step(int64_t T, int64_t layers, bool capturable) {
  std::vector<std::string> want = {"begin " + std::to_string(T) + (capturable ? " capturable" : " eager")};
  for (int64_t l = 0; l < layers; ++l) {
    want.push_back("op");
    want.push_back("segment");
  }
  want.push_back("op");  // the head
  want.push_back("end");
  return want;
}

class ModelStep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(testing::make_temp_dir("step_contract"));
    testing::write_test_model(*dir_,
                              testing::tiny_config({AttentionKind::kCsa, AttentionKind::kSliding, AttentionKind::kHca}, 1),
                              99);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* ModelStep::dir_ = nullptr;

TEST_F(ModelStep, AForwardIsOneStepCutAfterEveryLayer) {
  auto model = Model::load(*dir_);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int64_t layers = (*model)->config().num_layers;
  auto cpu = make_cpu_backend();
  StepRecorder rec(*cpu);
  const std::vector<int32_t> ids = testing::random_ids(7, (*model)->config().vocab_size, 3);
  // Chunks of 3: steps of 3, 3 and 1 tokens; every op inside a step.
  auto got = Session(**model, rec).logits(ids, 3);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  std::vector<std::string> want;
  for (int64_t T : {3, 3, 1}) {
    const auto step = one_step(T, layers, /*capturable=*/true);
    want.insert(want.end(), step.begin(), step.end());
  }
  EXPECT_EQ(rec.log, want);
  EXPECT_EQ(rec.ops_outside, 0) << "ops ran outside a step";
  EXPECT_EQ(rec.depth, 0);
  // The wrapper changes nothing.
  auto plain = Session(**model, *cpu).logits(ids, 3);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(*got, *plain);
}

// The projections that read one input reach the backend as one linears() call, which the CUDA
// backend runs as one GEMM over the stacked weights (docs/cuda.md, "Stacked linears"): wq_a and wkv
// in every layer, a compressor's wkv and wgate in CSA and HCA layers, the indexer's compressor's in
// CSA layers; or, for wq_b and the indexer's wq_b in CSA layers (both read qr; too wide to stack),
// as separate linears quantising qr once. Each call's params share their input and flags. A model that stopped grouping them
// would lose those GEMMs silently (the results stay right), so it is checked here, under fp32 and
// fast, with the logits unchanged by the wrapper.
TEST_F(ModelStep, ProjectionsOfOneInputAreOneLinearsCall) {
  for (const Precision precision : {Precision::kFp32, Precision::kFast}) {
    SCOPED_TRACE(precision_name(precision));
    auto model = Model::load(*dir_, {.precision = precision});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const ModelConfig& c = (*model)->config();
    const ModelWeights& w = (*model)->weights();
    auto cpu = make_cpu_backend();
    StepRecorder rec(*cpu);
    const std::vector<int32_t> ids = testing::random_ids(6, c.vocab_size, 5);
    auto got = Session(**model, rec).logits(ids, 0);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    std::vector<std::vector<const WeightMatrix*>> want;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& L = w.layers[l];
      want.push_back({&L.wq_a, &L.wkv});
      if (c.attention[l] == AttentionKind::kCsa) want.push_back({&L.wq_b, &L.index_wq_b});
      if (c.attention[l] != AttentionKind::kSliding) want.push_back({&L.compressor.wkv, &L.compressor.wgate});
      if (c.attention[l] == AttentionKind::kCsa) want.push_back({&L.index_compressor.wkv, &L.index_compressor.wgate});
    }
    EXPECT_EQ(rec.linears_calls, want);
    EXPECT_EQ(rec.linears_alike, std::vector<bool>(want.size(), true));
    auto plain = Session(**model, *cpu).logits(ids, 0);
    ASSERT_TRUE(plain.is_ok());
    EXPECT_EQ(*got, *plain);
  }
}

TEST_F(ModelStep, ATappedForwardIsNotCapturable) {
  auto model = Model::load(*dir_);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto cpu = make_cpu_backend();
  StepRecorder rec(*cpu);
  const std::vector<int32_t> ids = testing::random_ids(5, (*model)->config().vocab_size, 4);
  auto taps = taps_run(**model, rec, ids, "*.moe.router.experts");
  ASSERT_TRUE(taps.is_ok()) << taps.status().to_string();
  ASSERT_FALSE(taps->empty());
  ASSERT_FALSE(rec.log.empty());
  EXPECT_EQ(rec.log.front(), "begin 5 eager");
  EXPECT_EQ(rec.log.back(), "end");
  EXPECT_EQ(rec.depth, 0);
  EXPECT_EQ(rec.ops_outside, 0);
}

}  // namespace
}  // namespace sparrow
