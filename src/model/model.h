// The DeepSeek-V4 model, written once over the op interface (src/ops/backend.h).
//
// The model owns its config, RoPE tables and the weight table (views into the mmap'd checkpoint);
// it owns no per-sequence state: the runtime passes SequenceStates in a BatchInfo. Every
// intermediate has a stable tap name `L<layer>.<block>.<tensor>`; taps cost one branch when off.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "core/model_config.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

// Receives (name, tensor) for every tapped intermediate, in execution order.
using TapFn = std::function<void(const std::string& name, const Tensor& value)>;

// Selections to impose instead of computing them (`sparrow diff --force-decisions`): tap name
// ("L3.attn.indexer.topk" [T, k], "L0.moe.router.experts" [T, K]) -> int32 values, for one forward
// over the same tokens.
using ForcedDecisions = std::map<std::string, std::vector<int32_t>>;

struct ForwardOptions {
  RoutedScalePlacement routed_scale_placement = RoutedScalePlacement::kInRouterWeights;
  const TapFn* tap = nullptr;                // null: taps off
  const ForcedDecisions* forced = nullptr;   // null: every decision computed
};

// Run-time changes to what config.json says (for experiments: `--index-topk`).
struct ModelOverrides {
  std::optional<int64_t> index_topk;
  KeyPrecision index_keys = KeyPrecision::kF32;  // precision the indexer keys are stored in
};

class Model {
 public:
  // Loads config.json and the safetensors checkpoint from `dir` and checks every tensor.
  static Expected<std::unique_ptr<Model>> load(const std::filesystem::path& dir, const ModelOverrides& overrides = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const RopeTable& rope_main() const { return rope_main_; }
  const RopeTable& rope_compress() const { return rope_compress_; }

  // Runs the batch's tokens through every layer, updating the sequences' states, and returns the
  // logits [T, V]. REQUIRES: `batch` satisfies BatchInfo's contract. The caller advances states.
  Tensor forward(Backend& backend, const BatchInfo& batch, const ForwardOptions& options = {}) const;

 private:
  Model() = default;
  void layer_forward(Backend& be, const BatchInfo& batch, int64_t l, Tensor& streams, const ForwardOptions& opt) const;
  Tensor attention_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x,
                           const ForwardOptions& opt) const;
  Tensor moe_forward(Backend& be, const BatchInfo& batch, int64_t l, const Tensor& x, const ForwardOptions& opt) const;

  std::unique_ptr<SafetensorsCheckpoint> checkpoint_;
  ModelConfig config_;
  KeyPrecision index_keys_ = KeyPrecision::kF32;
  ModelWeights weights_;
  RopeTable rope_main_, rope_compress_;
};

}  // namespace sparrow
