// Random tiny DeepSeek-V4 checkpoints written by the tests themselves (released names and config
// schema), for properties that need no oracle: chunking invariance, load-time validation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/safetensors.h"
#include "core/model_config.h"

namespace sparrow::testing {

// A small config: D=32, H=2, Dh=16 (rope 4), E=4, K=2, hc=2, window 8, CSA ratio 4, HCA ratio 8,
// index_topk 2. `layers` gives each layer's attention kind; the first `hash_layers` use hash MoE.
ModelConfig tiny_config(const std::vector<AttentionKind>& layers, int64_t hash_layers);

// Writes config.json + model.safetensors. `mutate` may edit the tensor list before writing (to plant
// a bad shape or dtype).
void write_test_model(const std::filesystem::path& dir, const ModelConfig& c, uint64_t seed,
                      const std::function<void(std::vector<TensorToWrite>&)>& mutate = {});

// The token ids of an oracle fixture (tests/fixtures/<name>/ids.npy).
std::vector<int32_t> fixture_ids(const std::string& name);

// A fresh empty directory under the system temp dir.
std::filesystem::path make_temp_dir(const std::string& tag);

// n token ids drawn uniformly from [0, vocab) with std::mt19937_64(seed).
std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed);

// A planted fault: copies checkpoint `src` (config.json + model.safetensors) into a new temp dir,
// multiplying every element of `tensor` (F32 or BF16; empty: no tensor changes) by `factor`, after
// `edit_config` (if given) has changed the config.
std::filesystem::path copy_checkpoint_with_fault(const std::filesystem::path& src, const std::string& tensor,
                                                 float factor,
                                                 const std::function<void(nlohmann::json&)>& edit_config = {});

}  // namespace sparrow::testing
