// Released checkpoint formats end to end (spec §2.2): the CPU reader dequantises FP8 128x128 tiles
// (partial edge tiles, e8m0 or F32 scales) and packed MXFP4 exactly; the quantiser writes the
// released layout; and logits on a quantised checkpoint equal logits on a float checkpoint that
// holds exactly the dequantised values. That float checkpoint is made by a decoder written here from
// the spec's definitions, independent of weight_reader.cpp and the encoders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backends/cpu/weight_reader.h"
#include "core/compare.h"
#include "core/npy.h"
#include "io/config_json.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/test_model.h"
#include "runtime/session.h"
#include "tools/quantize.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;

const fs::path kFixtures = SPARROW_FIXTURES_DIR;

// ---- the independent decoder ---------------------------------------------------------------------

// OCP e4m3fn from its definition: normal 2^(E-7) (1 + M/8), subnormal 2^-6 M/8.
float e4m3_value(uint8_t c) {
  const int E = (c >> 3) & 15, M = c & 7;
  const double mag = E == 0 ? std::ldexp(M / 8.0, -6) : std::ldexp(1.0 + M / 8.0, E - 7);
  return static_cast<float>((c & 0x80) ? -mag : mag);
}
float e2m1_value(uint8_t nibble) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (nibble & 8) ? -mags[nibble & 7] : mags[nibble & 7];
}
float scale_value(const TensorView& s, int64_t i) {
  if (s.dtype == DType::kF8E8M0) return std::ldexp(1.0f, static_cast<const uint8_t*>(s.data)[i] - 127);
  float f;
  std::memcpy(&f, static_cast<const uint8_t*>(s.data) + 4 * i, 4);
  return f;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Writes `out` = the checkpoint `in` with every FP8/FP4/BF16 tensor decoded to F32 (scale tensors
// dropped) and config.json without quantization_config / expert_dtype.
void dequantize_independently(const fs::path& in, const fs::path& out) {
  auto ckpt = SafetensorsCheckpoint::open(in);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  std::vector<TensorToWrite> ts;
  for (const std::string& name : (*ckpt)->names()) {
    const TensorView& t = *(*ckpt)->find(name);
    if (name.ends_with(".scale")) continue;
    const auto* b = static_cast<const uint8_t*>(t.data);
    const std::string base = name.substr(0, name.size() - std::strlen(".weight"));
    if (t.dtype == DType::kF8E4M3) {
      const TensorView& s = *(*ckpt)->find(base + ".scale");
      const int64_t R = t.dim(0), C = t.dim(1), sc = s.dim(1);
      std::vector<float> v(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) v[r * C + c] = e4m3_value(b[r * C + c]) * scale_value(s, r / 128 * sc + c / 128);
      ts.push_back({name, DType::kF32, {R, C}, f32_bytes(v)});
    } else if (t.dtype == DType::kI8) {
      const TensorView& s = *(*ckpt)->find(base + ".scale");
      const int64_t R = t.dim(0), C = 2 * t.dim(1);
      std::vector<float> v(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t byte = b[r * (C / 2) + c / 2];
          v[r * C + c] = e2m1_value(c % 2 == 0 ? byte & 15 : byte >> 4) * scale_value(s, r * (C / 32) + c / 32);
        }
      ts.push_back({name, DType::kF32, {R, C}, f32_bytes(v)});
    } else if (t.dtype == DType::kBF16) {
      std::vector<float> v(t.numel());
      for (int64_t i = 0; i < t.numel(); ++i) {
        const uint32_t bits = static_cast<uint32_t>(b[2 * i] | b[2 * i + 1] << 8) << 16;
        std::memcpy(&v[i], &bits, 4);
      }
      ts.push_back({name, DType::kF32, t.shape, f32_bytes(v)});
    } else {
      ts.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(b, b + t.nbytes)});
    }
  }
  fs::create_directories(out);
  ASSERT_TRUE(safetensors_write(out / "model.safetensors", ts).is_ok());
  std::ifstream cin(in / "config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(cin);
  config.erase("quantization_config");
  config.erase("expert_dtype");
  std::ofstream(out / "config.json") << config.dump(2);
}

// ---- helpers -------------------------------------------------------------------------------------

std::vector<int32_t> fixture_ids(const std::string& fixture) {
  auto a = npy_read(kFixtures / fixture / "ids.npy");
  std::vector<int32_t> ids;
  for (int64_t v : npy_to_i64(*a).value()) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

std::vector<float> logits_of(const fs::path& dir, const std::vector<int32_t>& ids) {
  auto model = Model::load(dir);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  if (!model.is_ok()) return {};
  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  auto logits = session.logits(ids, 0);
  EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
  return logits.is_ok() ? *logits : std::vector<float>{};
}

const TensorView* tensor(const SafetensorsCheckpoint& c, const std::string& name) {
  const TensorView* t = c.find(name);
  EXPECT_NE(t, nullptr) << "no tensor " << name;
  return t;
}

// ---- weight_row on hand-made bytes --------------------------------------------------------------

TEST(QuantDequant, Fp8PartialEdgeTilesWithE8m0AndF32Scales) {
  // [130, 200]: tiles [2, 2], the last row of tiles 2 rows high and the last column 72 wide.
  const int64_t R = 130, C = 200;
  std::mt19937 rng(1);
  std::vector<uint8_t> codes(R * C);
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7F) == 0x7F);  // no NaN codes
  }
  // 120 = 2^-7 (a numeric cast of this scale to uint8 would give 0), 127 = 1, 1 and 254 extremes.
  const std::vector<uint8_t> e8m0 = {120, 127, 1, 140};
  const std::vector<float> f32 = {0.37f, -1.5f, 3e-5f, 1024.0f};
  for (DType sdt : {DType::kF8E8M0, DType::kF32}) {
    WeightMatrix w;
    w.format = WeightFormat::kFp8Block;
    w.out = R;
    w.in = C;
    w.data = {.name = "w", .dtype = DType::kF8E4M3, .shape = {R, C}, .data = codes.data(), .nbytes = codes.size()};
    const void* sdata = sdt == DType::kF8E8M0 ? static_cast<const void*>(e8m0.data()) : f32.data();
    w.scale = {.name = "w.scale", .dtype = sdt, .shape = {2, 2}, .data = sdata, .nbytes = 4 * dtype_size(sdt)};
    w.block_out = w.block_in = 128;
    std::vector<float> got(R * C), want(R * C);
    for (int64_t r = 0; r < R; ++r) {
      cpu::weight_row(w, r, got.data() + r * C);
      for (int64_t c = 0; c < C; ++c) {
        const int64_t tile = (r / 128) * 2 + c / 128;
        const float s = sdt == DType::kF8E8M0 ? std::ldexp(1.0f, e8m0[tile] - 127) : f32[tile];
        want[r * C + c] = e4m3_value(codes[r * C + c]) * s;
      }
    }
    const auto cmp = compare_f32(got, want, {.atol = 0, .rtol = 0}, {R, C});
    EXPECT_TRUE(cmp.ok) << dtype_name(sdt) << ": " << cmp.message;
  }
}

TEST(QuantDequant, Mxfp4LowNibbleIsTheEvenInputAndScalesAre1x32) {
  const int64_t R = 3, C = 96;
  std::mt19937 rng(2);
  std::vector<uint8_t> packed(R * C / 2), scales(R * C / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(110 + rng() % 30);
  scales[0] = 120;  // 2^-7
  WeightMatrix w;
  w.format = WeightFormat::kFp4Packed;
  w.out = R;
  w.in = C;
  w.data = {.name = "e", .dtype = DType::kI8, .shape = {R, C / 2}, .data = packed.data(), .nbytes = packed.size()};
  w.scale = {.name = "e.scale", .dtype = DType::kF8E8M0, .shape = {R, C / 32}, .data = scales.data(),
             .nbytes = scales.size()};
  w.block_out = 1;
  w.block_in = 32;
  std::vector<float> got(R * C), want(R * C);
  for (int64_t r = 0; r < R; ++r) {
    cpu::weight_row(w, r, got.data() + r * C);
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t byte = packed[r * C / 2 + c / 2];
      want[r * C + c] = e2m1_value(c % 2 ? byte >> 4 : byte & 15) * std::ldexp(1.0f, scales[r * 3 + c / 32] - 127);
    }
  }
  const auto cmp = compare_f32(got, want, {.atol = 0, .rtol = 0}, {R, C});
  EXPECT_TRUE(cmp.ok) << cmp.message;
  // A known byte: 0x2F = high nibble 2 (1.0) for input 1, low nibble 15 (-6) for input 0.
  packed[0] = 0x2F;
  cpu::weight_row(w, 0, got.data());
  EXPECT_EQ(got[0], -6.0f / 128);
  EXPECT_EQ(got[1], 1.0f / 128);
}

// ---- the quantiser on the oracle fixtures --------------------------------------------------------

struct Case {
  std::string fixture;
  ReleaseVariant variant;
};
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.fixture + (info.param.variant == ReleaseVariant::kFlash ? "_flash" : "_flash_base");
}

class QuantizeFixture : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { dir_ = make_temp_dir("quantize"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(QuantizeFixture, LogitsEqualTheDequantisedFloatModel) {
  const Case& c = GetParam();
  const fs::path q = dir_ / "q", f = dir_ / "f";
  const Status st = checkpoint_quantize(kFixtures / c.fixture, q, {.variant = c.variant});
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  dequantize_independently(q, f);
  const auto ids = fixture_ids(c.fixture);
  const auto got = logits_of(q, ids), ref = logits_of(f, ids);
  const int64_t T = static_cast<int64_t>(ids.size());
  const auto cmp = compare_f32(got, ref, {.atol = 1e-6, .rtol = 1e-5, .max_rel_to_max = 1e-5}, {T, 128});
  EXPECT_TRUE(cmp.ok) << cmp.message;
  // Against transformers' float logits the difference is the quantisation error itself; it is
  // reported, and bounded loosely so that a wrong layout (say, a transposed tile) cannot pass.
  auto golden = npy_read(kFixtures / c.fixture / "logits.npy");
  const auto q_err = compare_f32(got, npy_to_f32(*golden).value(), {.atol = 1e9, .max_cosine_distance = 0.05});
  std::printf("[quantize] %-10s %-10s vs dequantised: %s\n[quantize] %-21s vs float golden: %s\n", c.fixture.c_str(),
              c.variant == ReleaseVariant::kFlash ? "flash" : "flash-base", cmp.summary().c_str(), "",
              q_err.summary().c_str());
  EXPECT_TRUE(q_err.ok) << q_err.message;
}

TEST_P(QuantizeFixture, WritesExactlyTheReleasedLayout) {
  const Case& c = GetParam();
  const bool flash = c.variant == ReleaseVariant::kFlash;
  const fs::path q = dir_ / "q";
  ASSERT_TRUE(checkpoint_quantize(kFixtures / c.fixture, q, {.variant = c.variant}).is_ok());
  ASSERT_TRUE(fs::exists(q / "model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(q / "model-00001-of-00001.safetensors"));
  auto config = model_config_load(q);
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  auto source = model_config_load(kFixtures / c.fixture);
  EXPECT_EQ(config->attention, source->attention);
  EXPECT_EQ(config->moe, source->moe);
  EXPECT_TRUE(config->fp8_weights);
  EXPECT_EQ(config->expert_dtype, flash ? "fp4" : "fp8");
  std::ifstream cin(q / "config.json");
  const auto raw = nlohmann::json::parse(cin);
  EXPECT_TRUE(raw.contains("compress_ratios") && raw.contains("num_hash_layers"));
  EXPECT_FALSE(raw.contains("layer_types") || raw.contains("rope_parameters"));
  EXPECT_EQ(raw["quantization_config"]["fmt"], "e4m3");
  EXPECT_EQ(raw["quantization_config"]["weight_block_size"], nlohmann::json::array({128, 128}));
  if (flash) {
    EXPECT_EQ(raw["quantization_config"]["scale_fmt"], "ue8m0");
  }

  auto ckpt = SafetensorsCheckpoint::open(q);
  ASSERT_TRUE(ckpt.is_ok());
  const auto& k = **ckpt;
  for (const std::string& name : k.names()) {
    EXPECT_FALSE(name.starts_with("model.")) << name;
    // Every tensor aligned to its element size, as the safetensors library writes them.
    const TensorView& t = *k.find(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name << " is not aligned";
  }
  const DType scale_dt = flash ? DType::kF8E8M0 : DType::kF32;
  const int64_t D = config->hidden_size, F = config->moe_intermediate, V = config->vocab_size;
  auto expect = [&](const std::string& name, DType dt, std::vector<int64_t> shape) {
    const TensorView* t = tensor(k, name);
    if (t == nullptr) return;
    EXPECT_EQ(t->dtype, dt) << name;
    EXPECT_EQ(t->shape, shape) << name;
  };
  expect("embed.weight", DType::kBF16, {V, D});
  expect("head.weight", DType::kBF16, {V, D});
  expect("norm.weight", DType::kBF16, {D});
  expect("hc_head_fn", DType::kF32, {config->hc_mult, config->hc_mult * D});
  const int64_t cdiv_d = (D + 127) / 128;
  for (int64_t l = 0; l < config->num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    expect(p + "attn.wq_a.weight", DType::kF8E4M3, {config->q_lora_rank, D});
    expect(p + "attn.wq_a.scale", scale_dt, {(config->q_lora_rank + 127) / 128, cdiv_d});
    expect(p + "attn.wo_b.weight", DType::kF8E4M3, {D, config->o_groups * config->o_lora_rank});
    expect(p + "attn.kv_norm.weight", DType::kBF16, {config->head_dim});
    expect(p + "attn.attn_sink", DType::kF32, {config->num_heads});
    expect(p + "hc_attn_fn", DType::kF32, {config->mix_dim(), config->hc_mult * D});
    expect(p + "ffn.gate.weight", DType::kBF16, {config->num_experts, D});
    expect(p + "ffn.shared_experts.w2.weight", DType::kF8E4M3, {D, F});
    expect(p + "ffn.shared_experts.w2.scale", scale_dt, {cdiv_d, (F + 127) / 128});
    if (flash) {
      expect(p + "ffn.experts.0.w1.weight", DType::kI8, {F, D / 2});
      expect(p + "ffn.experts.0.w1.scale", DType::kF8E8M0, {F, D / 32});
      expect(p + "ffn.experts.0.w2.weight", DType::kI8, {D, F / 2});
    } else {
      expect(p + "ffn.experts.0.w1.weight", DType::kF8E4M3, {F, D});
      expect(p + "ffn.experts.0.w1.scale", DType::kF32, {(F + 127) / 128, cdiv_d});
    }
    if (config->moe[l] == MoeKind::kHash) {
      expect(p + "ffn.gate.tid2eid", DType::kI64, {V, config->experts_per_token});
    } else {
      expect(p + "ffn.gate.bias", DType::kF32, {config->num_experts});
    }
    if (config->attention[l] == AttentionKind::kCsa) {
      expect(p + "attn.compressor.wkv.weight", DType::kBF16, {2 * config->head_dim, D});
      expect(p + "attn.compressor.ape", DType::kF32, {config->compress_ratio[l], 2 * config->head_dim});
      expect(p + "attn.indexer.wq_b.weight", DType::kF8E4M3,
             {config->index_heads * config->index_head_dim, config->q_lora_rank});
      expect(p + "attn.indexer.weights_proj.weight", DType::kBF16, {config->index_heads, D});
      expect(p + "attn.indexer.compressor.wgate.weight", DType::kBF16, {2 * config->index_head_dim, D});
    }
  }
  // Scales are powers of two: e8m0 bytes are exponents by construction; F32 scales must be 2^k.
  if (!flash) {
    const TensorView& s = *tensor(k, "layers.0.attn.wq_b.scale");
    for (int64_t i = 0; i < s.numel(); ++i) {
      float v;
      std::memcpy(&v, static_cast<const uint8_t*>(s.data) + 4 * i, 4);
      int e;
      EXPECT_EQ(std::frexp(v, &e), 0.5f) << "scale " << v << " is not a power of two";
    }
  }
}

TEST_P(QuantizeFixture, QuantisingAQuantisedCheckpointKeepsItsValues) {
  const Case& c = GetParam();
  const fs::path q = dir_ / "q", q2 = dir_ / "q2";
  ASSERT_TRUE(checkpoint_quantize(kFixtures / c.fixture, q, {.variant = c.variant}).is_ok());
  ASSERT_TRUE(checkpoint_quantize(q, q2, {.variant = c.variant}).is_ok());
  dequantize_independently(q, dir_ / "f");
  dequantize_independently(q2, dir_ / "f2");
  auto a = SafetensorsCheckpoint::open(dir_ / "f"), b = SafetensorsCheckpoint::open(dir_ / "f2");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_EQ((*a)->names(), (*b)->names());
  for (const std::string& name : (*a)->names()) {
    const TensorView &x = *(*a)->find(name), &y = *(*b)->find(name);
    ASSERT_EQ(x.nbytes, y.nbytes) << name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << name << ": values changed on re-quantisation";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeFixture,
                         ::testing::Values(Case{"swa_hash", ReleaseVariant::kFlash}, Case{"csa", ReleaseVariant::kFlash},
                                           Case{"hca", ReleaseVariant::kFlash}, Case{"mixed_hc2", ReleaseVariant::kFlash},
                                           Case{"mixed_bf16", ReleaseVariant::kFlash},
                                           Case{"mixed_bf16", ReleaseVariant::kFlashBase},
                                           Case{"csa", ReleaseVariant::kFlashBase}),
                         case_name);

// ---- errors --------------------------------------------------------------------------------------

TEST(Quantize, ExpertsThatCannotBeMxfp4AreRefusedByName) {
  const fs::path dir = make_temp_dir("quantize_err");
  // tiny_config's experts have F = 16: w2's input is not a multiple of 32.
  testing::write_test_model(dir / "in", testing::tiny_config({AttentionKind::kSliding}, 1), 3);
  const Status st = checkpoint_quantize(dir / "in", dir / "out");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("layers.0.ffn.experts.0.w2.weight"), std::string::npos) << st.message();
  // The Flash-Base layout has FP8 experts, which any size fits.
  EXPECT_TRUE(checkpoint_quantize(dir / "in", dir / "base", {.variant = ReleaseVariant::kFlashBase}).is_ok());
  EXPECT_EQ(checkpoint_quantize(dir / "in", dir / "in").code(), StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(Quantize, NonFiniteWeightIsRefusedByName) {
  const fs::path dir = make_temp_dir("quantize_nan");
  testing::write_test_model(dir / "in", testing::tiny_config({AttentionKind::kSliding}, 1), 3, [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "layers.0.attn.wq_b.weight") {
        const float inf = INFINITY;
        std::memcpy(t.bytes.data() + 4 * 13, &inf, 4);
      }
  });
  const Status st = checkpoint_quantize(dir / "in", dir / "out", {.variant = ReleaseVariant::kFlashBase});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layers.0.attn.wq_b.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[1, 1]"), std::string::npos) << st.message();  // element 13 of [32, 12]
  fs::remove_all(dir);
}

// Copies checkpoint `in` into one model.safetensors under `out`, letting `mutate` edit the list.
void rewrite_checkpoint(const fs::path& in, const fs::path& out,
                        const std::function<void(std::vector<TensorToWrite>&)>& mutate) {
  auto ckpt = SafetensorsCheckpoint::open(in);
  ASSERT_TRUE(ckpt.is_ok());
  std::vector<TensorToWrite> ts;
  for (const std::string& name : (*ckpt)->names()) {
    const TensorView& t = *(*ckpt)->find(name);
    const auto* b = static_cast<const uint8_t*>(t.data);
    ts.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(b, b + t.nbytes)});
  }
  mutate(ts);
  fs::create_directories(out);
  ASSERT_TRUE(safetensors_write(out / "model.safetensors", ts).is_ok());
  fs::copy_file(in / "config.json", out / "config.json");
}

TensorToWrite* find_tensor(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  ADD_FAILURE() << "no tensor " << name;
  static TensorToWrite dummy;
  return &dummy;
}

class QuantizedLoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("quant_load");
    ASSERT_TRUE(checkpoint_quantize(kFixtures / "csa", dir_ / "q").is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Loads a rewritten copy of the quantised checkpoint; returns the error message ("" if it loads).
  std::string load_error(const std::function<void(std::vector<TensorToWrite>&)>& mutate) {
    const fs::path out = dir_ / ("m" + std::to_string(n_++));
    rewrite_checkpoint(dir_ / "q", out, mutate);
    auto m = Model::load(out);
    return m.is_ok() ? "" : m.status().message();
  }
  fs::path dir_;
  int n_ = 0;
};

TEST_F(QuantizedLoadErrors, UnchangedCopyLoads) { EXPECT_EQ(load_error([](auto&) {}), ""); }

TEST_F(QuantizedLoadErrors, MissingShardNamesTheShardAndATensor) {
  fs::remove(dir_ / "q" / "model-00001-of-00001.safetensors");
  auto m = Model::load(dir_ / "q");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().to_string();
  EXPECT_NE(m.status().message().find("model-00001-of-00001.safetensors"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("holding '"), std::string::npos) << m.status().message();
}

TEST_F(QuantizedLoadErrors, WrongScaleDtypeNamesTensorExpectedAndFound) {
  const std::string msg = load_error([](auto& ts) {
    auto* s = find_tensor(ts, "layers.0.ffn.experts.1.w3.scale");
    s->dtype = DType::kU8;
  });
  EXPECT_NE(msg.find("layers.0.ffn.experts.1.w3.scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("U8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected F8_E8M0"), std::string::npos) << msg;
}

TEST_F(QuantizedLoadErrors, ExpertInTheOtherFormatThanExpertDtypeIsRefused) {
  // An FP8 expert in a checkpoint whose config says expert_dtype "fp4".
  const std::string msg = load_error([](auto& ts) {
    auto* w = find_tensor(ts, "layers.1.ffn.experts.2.w1.weight");
    auto* s = find_tensor(ts, "layers.1.ffn.experts.2.w1.scale");
    const int64_t F = w->shape[0], D = 2 * w->shape[1];
    w->dtype = DType::kF8E4M3;
    w->shape = {F, D};
    w->bytes.assign(F * D, 0x38);
    s->shape = {(F + 127) / 128, (D + 127) / 128};
    s->bytes.assign(s->shape[0] * s->shape[1], 127);
  });
  EXPECT_NE(msg.find("layers.1.ffn.experts.2.w1.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("F8_E4M3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert_dtype \"fp4\""), std::string::npos) << msg;
}

TEST_F(QuantizedLoadErrors, WrongScaleShapeNamesTensorAndBothShapes) {
  const std::string msg = load_error([](auto& ts) {
    auto* s = find_tensor(ts, "layers.0.attn.wq_b.scale");
    s->shape = {2, 1};
    s->bytes.assign(2, 127);
  });
  EXPECT_NE(msg.find("layers.0.attn.wq_b.scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 1]"), std::string::npos) << msg;
}

TEST_F(QuantizedLoadErrors, MissingScaleIsNamed) {
  const std::string msg = load_error([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "layers.1.attn.wo_a.scale"; }),
             ts.end());
  });
  EXPECT_NE(msg.find("layers.1.attn.wo_a.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layers.1.attn.wo_a.scale"), std::string::npos) << msg;
}

TEST_F(QuantizedLoadErrors, PackedExpertWithWrongShapeNamesBothShapes) {
  const std::string msg = load_error([](auto& ts) {
    auto* w = find_tensor(ts, "layers.0.ffn.experts.0.w2.weight");
    w->shape = {w->shape[0], w->shape[1] * 2};
    w->bytes.resize(w->bytes.size() * 2);
  });
  EXPECT_NE(msg.find("layers.0.ffn.experts.0.w2.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparrow
