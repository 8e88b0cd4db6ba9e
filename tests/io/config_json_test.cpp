// Tests for src/io/config_json: the released V4-Flash config.json (spec §1.1), the same model in the
// transformers schema, the released-schema writer, and the error messages of bad configs (each must
// name the field and the offending value, so a user can fix the file without reading the parser).

#include "io/config_json.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

namespace sparrow {
namespace {

// DeepSeek-V4-Flash config.json, field for field as spec §1.1 lists it.
constexpr const char* kFlashReleased = R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "vocab_size": 129280,
  "hidden_size": 4096,
  "num_hidden_layers": 43,
  "num_attention_heads": 64,
  "num_key_value_heads": 1,
  "head_dim": 512,
  "qk_rope_head_dim": 64,
  "q_lora_rank": 1024,
  "o_lora_rank": 1024,
  "o_groups": 8,
  "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576,
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "num_experts_per_tok": 6,
  "moe_intermediate_size": 2048,
  "num_hash_layers": 3,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0,
  "hidden_act": "silu",
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6,
  "rms_norm_eps": 1e-6,
  "num_nextn_predict_layers": 1,
  "expert_dtype": "fp4",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "bos_token_id": 0,
  "eos_token_id": 1,
  "tie_word_embeddings": false,
  "attention_bias": false,
  "attention_dropout": 0.0,
  "initializer_range": 0.02,
  "use_cache": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.57.1"
})";

// V4-Flash's schedule (spec §1.2): layers 0,1 window-only, then CSA on even and HCA on odd layers.
int64_t flash_ratio(int64_t layer) {
  if (layer < 2) return 0;
  return layer % 2 == 0 ? 4 : 128;
}

std::string quoted_list(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", \"" : "\"") + items[i] + "\"";
  return s + "]";
}

// The same model as transformers' save_pretrained writes it: no compress_ratios / num_hash_layers
// (consumed at load), layer_types / mlp_layer_types / compress_rates / nested rope_parameters instead,
// plus the top-level rope fields and the runtime attribute qk_rope_head_dim that to_dict keeps.
std::string flash_transformers() {
  std::vector<std::string> layer_types, mlp_types;
  for (int64_t i = 0; i < 43; ++i) {
    const int64_t r = flash_ratio(i);
    layer_types.push_back(r == 0 ? "sliding_attention"
                                 : r == 4 ? "compressed_sparse_attention" : "heavily_compressed_attention");
    mlp_types.push_back(i < 3 ? "hash_moe" : "moe");
  }
  return std::string(R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "vocab_size": 129280,
  "hidden_size": 4096,
  "moe_intermediate_size": 2048,
  "num_hidden_layers": 43,
  "num_attention_heads": 64,
  "num_key_value_heads": 1,
  "head_dim": 512,
  "q_lora_rank": 1024,
  "num_experts_per_tok": 6,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "scoring_func": "sqrtsoftplus",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "max_position_embeddings": 1048576,
  "rope_theta": 10000.0,
  "layer_types": )") +
         quoted_list(layer_types) + R"(,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
  "compress_rope_theta": 160000.0,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06,
  "mlp_layer_types": )" +
         quoted_list(mlp_types) + R"(,
  "swiglu_limit": 10.0,
  "sliding_window": 128,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "num_nextn_predict_layers": 1,
  "output_router_logits": false,
  "router_aux_loss_coef": 0.001,
  "router_jitter_noise": 0.0,
  "hidden_act": "silu",
  "initializer_range": 0.02,
  "rms_norm_eps": 1e-06,
  "use_cache": true,
  "pad_token_id": null,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
    "compress": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                 "beta_slow": 1.0, "rope_theta": 160000.0, "partial_rotary_factor": 0.125, "rope_type": "yarn",
                 "attention_factor": 1.0}
  },
  "partial_rotary_factor": 0.125,
  "qk_rope_head_dim": 64,
  "attention_bias": false,
  "mlp_bias": false,
  "attention_dropout": 0.0,
  "expert_dtype": "fp4",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "transformers_version": "5.17.0"
})";
}

// `text` with the first occurrence of `from` replaced; a test edit that matches nothing is a bug in
// the test, so it fails loudly instead of testing the unmodified config.
std::string edited(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  if (at == std::string::npos) {
    ADD_FAILURE() << "test edit: '" << from << "' not found";
    return text;
  }
  return text.replace(at, from.size(), to);
}

ModelConfig parse_ok(const std::string& text) {
  auto c = model_config_from_json(text, "config.json");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? c.value() : ModelConfig{};
}

// Parses `text`, expects failure with `code`, and that the message contains every needle.
void expect_error(const std::string& text, StatusCode code, const std::vector<std::string>& needles) {
  auto c = model_config_from_json(text, "config.json");
  ASSERT_FALSE(c.is_ok()) << "expected an error containing '" << (needles.empty() ? "" : needles[0]) << "'";
  const std::string& msg = c.status().message();
  EXPECT_EQ(c.status().code(), code) << msg;
  EXPECT_EQ(msg.rfind("config.json: ", 0), 0u) << msg;
  for (const auto& needle : needles) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
  }
}

void expect_same_rope(const RopeConfig& a, const RopeConfig& b, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.theta, b.theta);
  EXPECT_EQ(a.yarn, b.yarn);
  EXPECT_EQ(a.yarn_factor, b.yarn_factor);
  EXPECT_EQ(a.yarn_original_max_position, b.yarn_original_max_position);
  EXPECT_EQ(a.yarn_beta_fast, b.yarn_beta_fast);
  EXPECT_EQ(a.yarn_beta_slow, b.yarn_beta_slow);
}

// Every field of ModelConfig (keep in step with src/model/config.h).
void expect_same_config(const ModelConfig& a, const ModelConfig& b, bool compare_mtp = true) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.o_lora_rank, b.o_lora_rank);
  EXPECT_EQ(a.o_groups, b.o_groups);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.index_heads, b.index_heads);
  EXPECT_EQ(a.index_head_dim, b.index_head_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_shared_experts, b.num_shared_experts);
  EXPECT_EQ(a.experts_per_token, b.experts_per_token);
  EXPECT_EQ(a.moe_intermediate, b.moe_intermediate);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.hc_mult, b.hc_mult);
  EXPECT_EQ(a.hc_sinkhorn_iters, b.hc_sinkhorn_iters);
  EXPECT_EQ(a.hc_eps, b.hc_eps);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  expect_same_rope(a.rope_main, b.rope_main, "rope_main");
  expect_same_rope(a.rope_compress, b.rope_compress, "rope_compress");
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.compress_ratio, b.compress_ratio);
  EXPECT_EQ(a.moe, b.moe);
  if (compare_mtp) {
    EXPECT_EQ(a.mtp_compress_ratios, b.mtp_compress_ratios);
  }
  EXPECT_EQ(a.expert_dtype, b.expert_dtype);
  EXPECT_EQ(a.fp8_weights, b.fp8_weights);
}

TEST(ConfigJson, ReleasedFlashParses) {
  const ModelConfig c = parse_ok(kFlashReleased);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.nope_dim(), 448);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.index_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.experts_per_token, 6);
  EXPECT_EQ(c.moe_intermediate, 2048);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.mix_dim(), 24);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_TRUE(c.fp8_weights);

  ASSERT_EQ(c.attention.size(), 43u);
  ASSERT_EQ(c.compress_ratio.size(), 43u);
  ASSERT_EQ(c.moe.size(), 43u);
  EXPECT_EQ(c.attention[0], AttentionKind::kSliding);
  EXPECT_EQ(c.attention[1], AttentionKind::kSliding);
  EXPECT_EQ(c.attention[2], AttentionKind::kCsa);
  EXPECT_EQ(c.attention[3], AttentionKind::kHca);
  EXPECT_EQ(c.attention[41], AttentionKind::kHca);
  EXPECT_EQ(c.attention[42], AttentionKind::kCsa);
  int csa = 0, hca = 0;
  for (int64_t i = 0; i < 43; ++i) {
    EXPECT_EQ(c.compress_ratio[i], flash_ratio(i)) << "layer " << i;
    const AttentionKind want = flash_ratio(i) == 0   ? AttentionKind::kSliding
                               : flash_ratio(i) == 4 ? AttentionKind::kCsa
                                                     : AttentionKind::kHca;
    EXPECT_EQ(c.attention[i], want) << "layer " << i;
    csa += c.attention[i] == AttentionKind::kCsa;
    hca += c.attention[i] == AttentionKind::kHca;
    EXPECT_EQ(c.moe[i], i < 3 ? MoeKind::kHash : MoeKind::kScored) << "layer " << i;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.mtp_compress_ratios, std::vector<int64_t>{0});

  EXPECT_EQ(c.rope_main.theta, 10000.0);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.rope_compress.yarn_factor, 16.0);
  EXPECT_EQ(c.rope_compress.yarn_original_max_position, 65536);
  EXPECT_EQ(c.rope_compress.yarn_beta_fast, 32.0);
  EXPECT_EQ(c.rope_compress.yarn_beta_slow, 1.0);
}

TEST(ConfigJson, TransformersSchemaGivesTheSameConfig) {
  const ModelConfig released = parse_ok(kFlashReleased);
  const ModelConfig hf = parse_ok(flash_transformers());
  // transformers consumes compress_ratios at load, so the MTP blocks' ratios are not in its file.
  expect_same_config(released, hf, /*compare_mtp=*/false);
  EXPECT_TRUE(hf.mtp_compress_ratios.empty());
}

TEST(ConfigJson, BothSchemasTogetherMustAgree) {
  // compress_ratios + num_hash_layers next to layer_types + mlp_layer_types: fine when they agree.
  const std::string both = edited(flash_transformers(), R"("compress_rope_theta")",
                                  R"("compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
  "num_hash_layers": 3,
  "compress_rope_theta")");
  expect_same_config(parse_ok(kFlashReleased), parse_ok(both));

  // Layer 1 HCA in compress_ratios but sliding in layer_types.
  expect_error(edited(both, "[0, 0, 4, 128", "[0, 128, 4, 128"), StatusCode::kInvalidArgument,
               {"layer_types[1]", "sliding_attention", "compress_ratios[1]", "128"});
  expect_error(edited(both, R"("num_hash_layers": 3)", R"("num_hash_layers": 2)"), StatusCode::kInvalidArgument,
               {"num_hash_layers", "2", "mlp_layer_types"});
  expect_error(edited(both, R"("qk_rope_head_dim": 64)", R"("qk_rope_head_dim": 32)"),
               StatusCode::kInvalidArgument, {"qk_rope_head_dim", "32", "partial_rotary_factor", "0.125"});
}

TEST(ConfigJson, ReleasedJsonRoundTrips) {
  for (const std::string& text : {std::string(kFlashReleased), flash_transformers()}) {
    const ModelConfig c = parse_ok(text);
    const std::string out = model_config_to_released_json(c);
    EXPECT_NE(out.find("\"compress_ratios\""), std::string::npos) << out;
    EXPECT_NE(out.find("\"num_hash_layers\": 3"), std::string::npos) << out;
    EXPECT_EQ(out.find("layer_types"), std::string::npos) << out;
    auto back = model_config_from_json(out, "written");
    ASSERT_TRUE(back.is_ok()) << back.status().to_string() << "\n" << out;
    expect_same_config(c, back.value());
  }
}

// A tiny config without CSA layers (so no indexer fields), plain compress RoPE and no bos: the
// writer must leave out what is absent and write null where null means "none".
TEST(ConfigJson, TinyConfigRoundTripsAndDefaults) {
  const std::string tiny = R"({
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 16,
    "qk_rope_head_dim": 8, "q_lora_rank": 16, "o_lora_rank": 8, "o_groups": 2, "sliding_window": 8,
    "compress_ratios": [0, 16, 8], "compress_rope_theta": 40000, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "num_hash_layers": 1, "hc_mult": 2,
    "bos_token_id": null, "eos_token_id": [7, 5]
  })";
  const ModelConfig c = parse_ok(tiny);
  EXPECT_EQ(c.attention, (std::vector<AttentionKind>{AttentionKind::kSliding, AttentionKind::kHca, AttentionKind::kHca}));
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 16, 8}));
  EXPECT_TRUE(c.mtp_compress_ratios.empty());
  EXPECT_EQ(c.moe, (std::vector<MoeKind>{MoeKind::kHash, MoeKind::kScored, MoeKind::kScored}));
  EXPECT_EQ(c.index_heads, 0);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, 7);
  // transformers defaults for what the file omits.
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.rope_main.theta, 10000.0);
  EXPECT_EQ(c.rope_compress.theta, 40000.0);
  EXPECT_FALSE(c.rope_compress.yarn);
  EXPECT_FALSE(c.fp8_weights);
  EXPECT_EQ(c.expert_dtype, "");

  const std::string out = model_config_to_released_json(c);
  EXPECT_EQ(out.find("index_"), std::string::npos) << out;
  EXPECT_NE(out.find("\"bos_token_id\": null"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rope_scaling\": null"), std::string::npos) << out;
  auto back = model_config_from_json(out, "written");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string() << "\n" << out;
  expect_same_config(c, back.value());

  // num_hash_layers absent: transformers' default of 3, clamped to the layer count.
  EXPECT_EQ(parse_ok(edited(tiny, R"("num_hash_layers": 1,)", "")).moe,
            (std::vector<MoeKind>{MoeKind::kHash, MoeKind::kHash, MoeKind::kHash}));
}

TEST(ConfigJson, Flash0731HasThreeMtpEntries) {
  const ModelConfig c = parse_ok(edited(kFlashReleased, "4, 128, 4, 0]", "4, 128, 4, 0, 0, 0]"));
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.mtp_compress_ratios, (std::vector<int64_t>{0, 0, 0}));
}

TEST(ConfigJson, TransformersVariants) {
  const std::string hf = flash_transformers();
  // transformers truncates a longer layer_types to num_hidden_layers.
  expect_same_config(parse_ok(flash_transformers()),
                     parse_ok(edited(hf, R"("heavily_compressed_attention", "compressed_sparse_attention"])",
                                     R"("heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"])")));
  // Legacy scalar rate and compress_rates must agree.
  expect_error(edited(hf, R"("compress_rope_theta")", R"("compress_rate_hca": 64, "compress_rope_theta")"),
               StatusCode::kInvalidArgument,
               {"compress_rate_hca", "64", "compress_rates.heavily_compressed_attention"});
  // Without rope_parameters, the top-level rope fields and rope_scaling are used.
  const size_t from = hf.find(R"("rope_parameters")");
  const size_t to = hf.find("\n  \"partial_rotary_factor\": 0.125,", from) + 3;  // the top-level one
  ASSERT_NE(from, std::string::npos);
  ASSERT_GT(to, from);
  std::string no_params = hf.substr(0, from) +
                          R"("rope_scaling": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536},
  )" + hf.substr(to);
  expect_same_config(parse_ok(hf), parse_ok(no_params), false);
  // A flat rope_parameters is the compressed layers' YaRN (transformers' own reading).
  std::string flat = hf.substr(0, from) +
                     R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16, "original_max_position_embeddings": 65536},
  )" + hf.substr(to);
  expect_same_config(parse_ok(hf), parse_ok(flat), false);
}

TEST(ConfigJson, LoadFromDirectoryAndFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("sparrow_cfg_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "config.json") << kFlashReleased; }
  auto from_dir = model_config_load(dir);
  ASSERT_TRUE(from_dir.is_ok()) << from_dir.status().to_string();
  EXPECT_EQ(from_dir->num_layers, 43);
  auto from_file = model_config_load(dir / "config.json");
  ASSERT_TRUE(from_file.is_ok()) << from_file.status().to_string();
  auto missing = model_config_load(dir / "nope.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
  { std::ofstream(dir / "config.json") << "{\"vocab_size\": 1,"; }
  auto bad = model_config_load(dir);
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find((dir / "config.json").string()), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
}

// ---- Bad configs: each message names the field and the bad value. ----

TEST(ConfigJsonErrors, MissingHiddenSize) {
  expect_error(edited(kFlashReleased, R"("hidden_size": 4096,)", ""), StatusCode::kInvalidArgument,
               {"'hidden_size'", "missing"});
}

TEST(ConfigJsonErrors, WrongType) {
  expect_error(edited(kFlashReleased, R"("hidden_size": 4096)", R"("hidden_size": "4096")"),
               StatusCode::kInvalidArgument, {"'hidden_size'", "\"4096\"", "string", "expected an integer"});
  expect_error(edited(kFlashReleased, R"("hidden_size": 4096)", R"("hidden_size": 4096.5)"),
               StatusCode::kInvalidArgument, {"'hidden_size'", "4096.5", "expected an integer"});
  expect_error(edited(kFlashReleased, R"("norm_topk_prob": true)", R"("norm_topk_prob": 1)"),
               StatusCode::kInvalidArgument, {"'norm_topk_prob'", "1", "expected a boolean"});
  expect_error(edited(kFlashReleased, R"("compress_ratios": [0, 0,)", R"("compress_ratios": [0, "x",)"),
               StatusCode::kInvalidArgument, {"'compress_ratios[1]'", "\"x\"", "expected an integer"});
  expect_error(edited(kFlashReleased, R"("rope_scaling": {)", R"("rope_scaling": 5, "x": {)"),
               StatusCode::kInvalidArgument, {"'rope_scaling'", "5", "expected an object"});
}

TEST(ConfigJsonErrors, OGroupsNotDividingHeads) {
  expect_error(edited(kFlashReleased, R"("o_groups": 8)", R"("o_groups": 3)"), StatusCode::kInvalidArgument,
               {"field 'o_groups' = 3 must divide num_attention_heads = 64"});
}

TEST(ConfigJsonErrors, UnknownLayerType) {
  expect_error(edited(flash_transformers(), R"(["sliding_attention", "sliding_attention")",
                      R"(["sliding_attention", "full_attention")"),
               StatusCode::kInvalidArgument, {"'layer_types[1]'", "\"full_attention\""});
  expect_error(edited(flash_transformers(), R"(["hash_moe")", R"(["dense")"), StatusCode::kInvalidArgument,
               {"'mlp_layer_types[0]'", "\"dense\""});
}

TEST(ConfigJsonErrors, TooShortLists) {
  expect_error(edited(kFlashReleased, "4, 128, 4, 0]", "4, 128]"), StatusCode::kInvalidArgument,
               {"'compress_ratios'", "42 entries", "num_hidden_layers = 43"});
  expect_error(edited(flash_transformers(), R"("num_hidden_layers": 43)", R"("num_hidden_layers": 44)"),
               StatusCode::kInvalidArgument, {"'layer_types'", "43 entries", "num_hidden_layers = 44"});
  expect_error(edited(kFlashReleased, R"("compress_ratios")", R"("unused")"), StatusCode::kInvalidArgument,
               {"compress_ratios", "layer_types"});
}

TEST(ConfigJsonErrors, ScoringFuncSoftmax) {
  expect_error(edited(kFlashReleased, R"("sqrtsoftplus")", R"("softmax")"), StatusCode::kUnsupported,
               {"'scoring_func'", "\"softmax\""});
}

TEST(ConfigJsonErrors, YarnAttentionFactor) {
  expect_error(edited(flash_transformers(), R"("attention_factor": 1.0)", R"("attention_factor": 1.277)"),
               StatusCode::kUnsupported,
               {"'rope_parameters.compress.attention_factor'", "1.277", "no YaRN attention factor"});
  expect_error(edited(kFlashReleased, R"("factor": 16)", R"("factor": 0)"), StatusCode::kInvalidArgument,
               {"'rope_scaling.factor'", "0", "positive"});
  expect_error(edited(kFlashReleased, R"("type": "yarn")", R"("type": "linear")"), StatusCode::kUnsupported,
               {"'rope_scaling.type'", "\"linear\""});
  expect_error(edited(kFlashReleased, R"("rope_theta": 10000)", R"("rope_theta": -10000)"),
               StatusCode::kInvalidArgument, {"'rope_theta'", "-10000"});
  expect_error(edited(kFlashReleased, R"("compress_rope_theta": 160000)", R"("compress_rope_theta": 0.5)"),
               StatusCode::kInvalidArgument, {"'compress_rope_theta'", "0.5", "greater than 1"});
  // An overflowing literal never reaches the field checks: the JSON parser rejects it.
  expect_error(edited(kFlashReleased, R"("compress_rope_theta": 160000)", R"("compress_rope_theta": 1e999)"),
               StatusCode::kCorrupt, {"1e999"});
}

TEST(ConfigJsonErrors, NegativeIndexTopk) {
  expect_error(edited(kFlashReleased, R"("index_topk": 512)", R"("index_topk": -5)"), StatusCode::kInvalidArgument,
               {"'index_topk'", "-5"});
  // Indexer fields are required once a layer is CSA.
  expect_error(edited(kFlashReleased, R"("index_topk": 512,)", ""), StatusCode::kInvalidArgument,
               {"'index_topk'", "missing", "layer 2"});
}

TEST(ConfigJsonErrors, OtherRanges) {
  expect_error(edited(kFlashReleased, R"("n_shared_experts": 1)", R"("n_shared_experts": 2)"),
               StatusCode::kUnsupported, {"'n_shared_experts'", "2"});
  expect_error(edited(kFlashReleased, R"("num_experts_per_tok": 6)", R"("num_experts_per_tok": 300)"),
               StatusCode::kInvalidArgument, {"'num_experts_per_tok'", "300", "n_routed_experts = 256"});
  expect_error(edited(kFlashReleased, R"("qk_rope_head_dim": 64)", R"("qk_rope_head_dim": 63)"),
               StatusCode::kInvalidArgument, {"'qk_rope_head_dim'", "63", "even"});
  expect_error(edited(kFlashReleased, R"("qk_rope_head_dim": 64)", R"("qk_rope_head_dim": 256)"),
               StatusCode::kInvalidArgument, {"'qk_rope_head_dim'", "256", "index_head_dim = 128"});
  expect_error(edited(kFlashReleased, R"("num_key_value_heads": 1)", R"("num_key_value_heads": 8)"),
               StatusCode::kUnsupported, {"'num_key_value_heads'", "8"});
  expect_error(edited(kFlashReleased, R"("hc_sinkhorn_iters": 20)", R"("hc_sinkhorn_iters": 0)"),
               StatusCode::kInvalidArgument, {"'hc_sinkhorn_iters'", "0"});
  expect_error(edited(kFlashReleased, R"("sliding_window": 128)", R"("sliding_window": 0)"),
               StatusCode::kInvalidArgument, {"'sliding_window'", "0"});
  expect_error(edited(kFlashReleased, R"("compress_ratios": [0, 0,)", R"("compress_ratios": [0, -4,)"),
               StatusCode::kInvalidArgument, {"'compress_ratios[1]'", "-4"});
  expect_error(edited(kFlashReleased, R"("eos_token_id": 1)", R"("eos_token_id": 200000)"),
               StatusCode::kInvalidArgument, {"'eos_token_id'", "200000"});
  expect_error(edited(flash_transformers(), R"("compressed_sparse_attention": 4,)",
                      R"("compressed_sparse_attention": 8,)"),
               StatusCode::kUnsupported, {"'compress_rates.compressed_sparse_attention'", "8"});
}

TEST(ConfigJsonErrors, MalformedJsonNamesTheSource) {
  auto c = model_config_from_json("{\"vocab_size\": 1,,}", "/models/flash/config.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(c.status().message().rfind("/models/flash/config.json: malformed JSON", 0), 0u) << c.status().message();
  auto arr = model_config_from_json("[1, 2]", "cfg.json");
  ASSERT_FALSE(arr.is_ok());
  EXPECT_NE(arr.status().message().find("cfg.json"), std::string::npos);
}

}  // namespace
}  // namespace sparrow
