// Load-time validation of the weight table: every tensor's shape and dtype is checked against what
// config.json implies, and the error names the offender (traps.md row 4).
#include <gtest/gtest.h>

#include "model/model.h"
#include "model/test_model.h"

namespace sparrow {
namespace {

using testing::make_temp_dir;
using testing::tiny_config;
using testing::write_test_model;

ModelConfig small() { return tiny_config({AttentionKind::kCsa, AttentionKind::kHca}, 1); }

TensorToWrite* find(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  ADD_FAILURE() << "test model has no tensor " << name;
  return nullptr;
}

Status load_with(const std::function<void(std::vector<TensorToWrite>&)>& mutate) {
  const auto dir = make_temp_dir("weights");
  write_test_model(dir, small(), 5, mutate);
  auto m = Model::load(dir);
  std::filesystem::remove_all(dir);
  return m.is_ok() ? Status::ok() : m.status();
}

TEST(Weights, ValidModelLoads) {
  const Status st = load_with({});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(Weights, WrongShapeNamesTensorAndBothShapes) {
  const Status st = load_with([](auto& ts) { find(ts, "layers.1.attn.wq_b.weight")->shape = {16, 24}; });
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layers.1.attn.wq_b.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[16, 24]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[32, 12]"), std::string::npos) << st.message();
}

TEST(Weights, IntegerSinkIsRefusedNotReinterpreted) {
  const Status st = load_with([](auto& ts) { find(ts, "layers.0.attn.attn_sink")->dtype = DType::kI32; });
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layers.0.attn.attn_sink"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("I32"), std::string::npos) << st.message();
}

TEST(Weights, Tid2eidMustBeIntegerAndInRange) {
  Status st = load_with([](auto& ts) {
    auto* t = find(ts, "layers.0.ffn.gate.tid2eid");
    t->dtype = DType::kF32;
    t->bytes.resize(t->bytes.size() / 2);
  });
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("tid2eid"), std::string::npos) << st.message();
  st = load_with([](auto& ts) {
    auto* t = find(ts, "layers.0.ffn.gate.tid2eid");
    const int64_t bad = 99;
    std::memcpy(t->bytes.data() + 8 * 5, &bad, 8);
  });
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("= 99"), std::string::npos) << st.message();
}

TEST(Weights, MissingTensorIsNamed) {
  const Status st = load_with([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "layers.1.attn.compressor.ape"; }),
             ts.end());
  });
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("layers.1.attn.compressor.ape"), std::string::npos) << st.message();
}

TEST(Weights, PackedFp4OnlyForExperts) {
  const Status st = load_with([](auto& ts) {
    auto* t = find(ts, "layers.0.attn.wkv.weight");
    t->dtype = DType::kI8;
    t->shape = {16, 16};  // what a packed-FP4 [16, 32] would hold
    t->bytes.resize(16 * 16);
  });
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layers.0.attn.wkv.weight"), std::string::npos) << st.message();
}

TEST(Weights, TransformersNamesAreAccepted) {
  // Rename to the form save_pretrained writes: model. prefix, embed_tokens, hc_head.*, attn.norm.
  const Status st = load_with([](auto& ts) {
    for (auto& t : ts) {
      if (t.name == "embed.weight") t.name = "model.embed_tokens.weight";
      else if (t.name == "hc_head_fn") t.name = "model.hc_head.hc_fn";
      else if (t.name == "hc_head_base") t.name = "model.hc_head.hc_base";
      else if (t.name == "hc_head_scale") t.name = "model.hc_head.hc_scale";
      else if (t.name == "head.weight") continue;
      else if (t.name.ends_with("attn.kv_norm.weight")) t.name = "model." + t.name.substr(0, t.name.size() - 14) + "norm.weight";
      else t.name = "model." + t.name;
    }
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

}  // namespace
}  // namespace sparrow
