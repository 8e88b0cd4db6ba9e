// The synthetic V4-Flash (`sparrow synth`): real dimensions and schedule, the released layout,
// deterministic values, sane activations through the layers, and a 2-layer model at full size that
// loads (touching almost none of its mapping) and runs one forward on the CPU backend.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "core/compare.h"
#include "io/config_json.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/test_model.h"
#include "runtime/session.h"
#include "tools/progress.h"
#include "tools/synth.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// V4-Flash's structure (mHC with 4 streams, SWA/CSA/HCA schedule, hash then scored routing, FP8 and
// MXFP4) at sizes a test can run many tokens through.
ModelConfig mini_flash(int64_t layers) {
  ModelConfig c = v4_flash_config(layers, 8).value();
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rope_dim = 16;
  c.q_lora_rank = 64;
  c.o_lora_rank = 32;
  c.o_groups = 2;
  c.sliding_window = 16;
  c.index_heads = 4;
  c.index_head_dim = 32;
  c.index_topk = 8;
  c.moe_intermediate = 64;
  for (int64_t i = 0; i < layers; ++i)
    if (c.attention[i] == AttentionKind::kHca) c.compress_ratio[i] = 32;
  return c;
}

uint64_t layout_bytes(const ModelConfig& c) {
  uint64_t total = 0;
  for (const ReleasedTensor& t : released_layout(c, ReleaseVariant::kFlash).value()) {
    const uint64_t n = static_cast<uint64_t>(t.rows()) * t.cols();
    switch (t.storage) {
      case Storage::kF32: total += 4 * n; break;
      case Storage::kBF16: total += 2 * n; break;
      case Storage::kI64: total += 8 * n; break;
      case Storage::kFp8: total += n + ((t.rows() + 127) / 128) * ((t.cols() + 127) / 128); break;
      case Storage::kFp4: total += n / 2 + n / 32; break;
    }
  }
  return total;
}

TEST(SynthConfig, V4FlashScheduleDimsAndSize) {
  const ModelConfig c = v4_flash_config(43, 256).value();
  int swa = 0, csa = 0, hca = 0;
  for (int64_t i = 0; i < 43; ++i) {
    swa += c.attention[i] == AttentionKind::kSliding;
    csa += c.attention[i] == AttentionKind::kCsa;
    hca += c.attention[i] == AttentionKind::kHca;
    EXPECT_EQ(c.moe[i], i < 3 ? MoeKind::kHash : MoeKind::kScored) << i;
  }
  EXPECT_EQ(swa, 2);
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.compress_ratio[2], 4);
  EXPECT_EQ(c.compress_ratio[3], 128);
  // Spec §2.1: 156.0 GB for the main model as released.
  EXPECT_NEAR(layout_bytes(c) / 1e9, 156.0, 0.5);
  EXPECT_FALSE(v4_flash_config(0, 256).is_ok());
  EXPECT_FALSE(v4_flash_config(44, 256).is_ok());
  EXPECT_FALSE(v4_flash_config(4, 5).is_ok());
  EXPECT_FALSE(synth_preset_config("v4-pro", 4, 256).is_ok());
}

TEST(SynthConfig, ReleasedConfigJsonParsesBackToTheSameModel) {
  for (int64_t layers : {1, 2, 4, 43}) {
    const ModelConfig c = v4_flash_config(layers, 16).value();
    auto back = model_config_from_json(released_config_json(c, ReleaseVariant::kFlash), "synth");
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->num_layers, layers);
    EXPECT_EQ(back->attention, c.attention);
    EXPECT_EQ(back->compress_ratio, c.compress_ratio);
    EXPECT_EQ(back->moe, c.moe);
    EXPECT_TRUE(back->mtp_compress_ratios.empty());
    EXPECT_EQ(back->vocab_size, 129280);
    EXPECT_EQ(back->num_experts, 16);
    EXPECT_TRUE(back->rope_compress.yarn);
    EXPECT_EQ(back->rope_compress.yarn_factor, 16.0);
    EXPECT_EQ(back->expert_dtype, "fp4");
    EXPECT_TRUE(back->fp8_weights);
  }
}

TEST(Synth, ValuesDependOnlyOnSeedNameAndRow) {
  const fs::path dir = make_temp_dir("synth_det");
  const ModelConfig big = mini_flash(4), small = mini_flash(2);
  ModelConfig fewer = small;
  fewer.num_experts = 6;
  ASSERT_TRUE(checkpoint_synthesize(dir / "a", big, 7).is_ok());
  ASSERT_TRUE(checkpoint_synthesize(dir / "b", small, 7, {.max_shard_bytes = 200'000}).is_ok());  // sharded
  ASSERT_TRUE(checkpoint_synthesize(dir / "c", fewer, 7).is_ok());
  ASSERT_TRUE(checkpoint_synthesize(dir / "d", small, 8).is_ok());
  auto a = SafetensorsCheckpoint::open(dir / "a"), b = SafetensorsCheckpoint::open(dir / "b"),
       c = SafetensorsCheckpoint::open(dir / "c"), d = SafetensorsCheckpoint::open(dir / "d");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
  EXPECT_GT((*b)->num_files(), 1u);
  auto same = [](const TensorView* x, const TensorView* y) {
    return x && y && x->nbytes == y->nbytes && std::memcmp(x->data, y->data, x->nbytes) == 0;
  };
  for (const std::string& name : (*b)->names()) {
    // The 2-layer model is the 4-layer one's prefix (globals included: same names, same values).
    EXPECT_TRUE(same((*a)->find(name), (*b)->find(name))) << name;
    // With fewer experts, everything but the router's tensors (sized or valued by E) is the same.
    const TensorView* t = (*c)->find(name);
    const bool router = name.find("tid2eid") != std::string::npos || name.find("gate.weight") != std::string::npos ||
                        name.find("gate.bias") != std::string::npos;
    if (t != nullptr && !router) {
      EXPECT_TRUE(same(t, (*b)->find(name))) << name;
    }
  }
  EXPECT_FALSE(same((*b)->find("layers.1.attn.wq_a.weight"), (*d)->find("layers.1.attn.wq_a.weight")));
  // Expert ids are distinct per token and inside [0, E).
  const TensorView& ids = *(*c)->find("layers.0.ffn.gate.tid2eid");
  std::vector<int64_t> v(ids.numel());  // copied: tensors are packed, so the data may be unaligned
  std::memcpy(v.data(), ids.data, ids.nbytes);
  for (int64_t t = 0; t < ids.dim(0); ++t)
    for (int64_t k = 0; k < ids.dim(1); ++k) {
      ASSERT_TRUE(v[t * 6 + k] >= 0 && v[t * 6 + k] < 6);
      for (int64_t j = 0; j < k; ++j) ASSERT_NE(v[t * 6 + j], v[t * 6 + k]);
    }
  fs::remove_all(dir);
}

// The mHC scales are exactly 1 by default and spread around 1 with --hc-scale-std; nothing else
// changes; a spread outside [0, 1] is refused by name.
TEST(Synth, HcScaleSpreadIsOptInAndChangesOnlyTheScales) {
  const fs::path dir = make_temp_dir("synth_hc_scale");
  const ModelConfig c = mini_flash(2);
  ASSERT_TRUE(checkpoint_synthesize(dir / "one", c, 7).is_ok());
  ASSERT_TRUE(checkpoint_synthesize(dir / "spread", c, 7, {}, 0.1).is_ok());
  const Status bad = checkpoint_synthesize(dir / "bad", c, 7, {}, -0.5);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("--hc-scale-std"), std::string::npos) << bad.message();
  auto one = SafetensorsCheckpoint::open(dir / "one"), spread = SafetensorsCheckpoint::open(dir / "spread");
  ASSERT_TRUE(one.is_ok() && spread.is_ok());
  const auto floats = [](const TensorView* t) {
    std::vector<float> v(t->numel());
    std::memcpy(v.data(), t->data, t->nbytes);
    return v;
  };
  int scales = 0, off_one = 0;
  for (const std::string& name : (*one)->names()) {
    const TensorView *a = (*one)->find(name), *b = (*spread)->find(name);
    ASSERT_NE(b, nullptr) << name;
    const bool scale = name.size() > 6 && name.compare(name.size() - 6, 6, "_scale") == 0 &&
                       name.find("hc_") != std::string::npos;
    if (!scale) {
      EXPECT_TRUE(a->nbytes == b->nbytes && std::memcmp(a->data, b->data, a->nbytes) == 0) << name;
      continue;
    }
    ++scales;
    for (float v : floats(a)) EXPECT_EQ(v, 1.0f) << name;
    for (float v : floats(b)) {
      EXPECT_GT(v, 0.5f) << name;
      EXPECT_LT(v, 1.5f) << name;
      off_one += v != 1.0f;
    }
  }
  EXPECT_EQ(scales, 2 * 2 + 1);  // attn and ffn sites of 2 layers, and the head
  EXPECT_GT(off_one, 10);
  fs::remove_all(dir);
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

// Every stream's RMS after each layer, with the embedding's as the reference: the initialisation
// must keep them within a modest band over many layers (real V4-Flash depth is 43).
TEST(Synth, ActivationsNeitherExplodeNorVanishThroughTheLayers) {
  const fs::path dir = make_temp_dir("synth_numerics");
  const int64_t L = 12;
  ASSERT_TRUE(checkpoint_synthesize(dir, mini_flash(L), 3).is_ok());
  auto model = Model::load(dir);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto backend = make_cpu_backend();
  std::map<std::string, double> seen;
  const TapFn tap = [&](const std::string& name, const Tensor& t) {
    if (t.type() == ElemType::kF32) seen[name] = rms(backend->download_f32(t));
  };
  Session session(**model, *backend, {.tap = &tap});
  std::vector<int32_t> ids(96);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  auto logits = session.logits(ids, 0);
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  const double embed = seen.at("embed");
  std::printf("[synth] embed rms %.3f", embed);
  for (int64_t l = 0; l < L; ++l) {
    const double s = seen.at("L" + std::to_string(l) + ".hc_ffn.out");
    const double attn = seen.at("L" + std::to_string(l) + ".attn.out");
    const double moe = seen.at("L" + std::to_string(l) + ".moe.out");
    std::printf(" | L%lld streams %.2f attn %.2f moe %.2f", static_cast<long long>(l), s, attn, moe);
    EXPECT_GT(s, 0.5 * embed) << "layer " << l;
    EXPECT_LT(s, 8.0 * embed) << "layer " << l;
    EXPECT_GT(attn, 0.05) << "layer " << l;  // sub-layers contribute, neither vanishing nor dominating
    EXPECT_LT(attn, 8.0) << "layer " << l;
    EXPECT_GT(moe, 0.05) << "layer " << l;
    EXPECT_LT(moe, 8.0) << "layer " << l;
  }
  const double lrms = rms(*logits);
  std::printf(" | logits rms %.3f\n", lrms);
  EXPECT_GT(lrms, 0.2);
  EXPECT_LT(lrms, 5.0);
  fs::remove_all(dir);
}

// The acceptance test of the issue: a 2-layer V4-Flash at real size (16 routed experts, to fit a
// 24 GiB / 2-core CI machine: 2.8 GB on disk) is written, loaded and run forward on the CPU.
TEST(SynthFlash, TwoLayersAtRealSizeLoadAndRunForwardOnCpu) {
  const fs::path dir = make_temp_dir("synth_flash2");
  const ModelConfig c = v4_flash_config(2, 16).value();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(checkpoint_synthesize(dir, c, 0).is_ok());
  const double write_s = seconds_since(t0);

  // Loading must not read the weights: the RSS it adds is bounded by what it has to read (index,
  // shard headers, the two hash layers' tid2eid) plus the weight table, with 20% slack.
  uint64_t must_read = fs::file_size(dir / "model.safetensors.index.json");
  {
    auto ckpt = SafetensorsCheckpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok());
    for (const auto& f : (*ckpt)->files()) {
      uint64_t header_len = 0;
      std::ifstream(f->path(), std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
      must_read += 8 + header_len;
    }
    for (int64_t l = 0; l < 2; ++l)
      must_read += (*ckpt)->find("layers." + std::to_string(l) + ".ffn.gate.tid2eid")->nbytes;
  }
  const int64_t rss0 = process_rss_bytes();
  t0 = std::chrono::steady_clock::now();
  auto model = Model::load(dir);
  const double load_s = seconds_since(t0);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int64_t load_rss = process_rss_bytes() - rss0;
  const uint64_t slack = uint64_t{8} << 20;  // the weight table's structs and the RoPE tables
  EXPECT_LE(static_cast<double>(load_rss), 1.2 * static_cast<double>(must_read + slack))
      << "loading touched weight pages: RSS grew by " << load_rss << " bytes";

  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  const std::vector<int32_t> ids = {0, 5, 9, 17, 100, 2000, 50000, 129279};
  t0 = std::chrono::steady_clock::now();
  auto logits = session.logits(ids, 0);
  const double forward_s = seconds_since(t0);
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  ASSERT_EQ(logits->size(), ids.size() * 129280);
  for (float x : *logits) ASSERT_TRUE(std::isfinite(x));
  const double lrms = rms(*logits);
  EXPECT_GT(lrms, 0.2);
  EXPECT_LT(lrms, 5.0);
  std::printf("[synth-flash] 2 layers, 16 experts, %.2f GB: write %.1f s, load %.3f s (+%.1f MiB RSS, bound %.1f MiB), "
              "forward of %zu tokens %.1f s, logits rms %.3f\n",
              fs::file_size(dir / "model-00001-of-00001.safetensors") / 1e9, write_s, load_s, load_rss / 1048576.0,
              1.2 * (must_read + slack) / 1048576.0, ids.size(), forward_s, lrms);
  model.value().reset();  // unmaps before the files go
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sparrow
