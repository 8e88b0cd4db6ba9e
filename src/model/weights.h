// The DeepSeek-V4 weight table: every tensor the config implies, found under either naming scheme
// (the release's `layers.N.attn.kv_norm.weight` or transformers' `model.layers.N.attn.norm.weight`,
// spec §2.1 and its "Facts checked" note), checked for shape and dtype, and kept as zero-copy views
// into the mmap'd checkpoint in its stored format (float, FP8 block-scaled or packed FP4).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "core/model_config.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

struct CompressorWeights {
  WeightMatrix wkv;     // [width, D]
  WeightMatrix wgate;   // [width, D]
  TensorView ape;       // [ratio, width] F32
  TensorView norm;      // [dim]
};

struct LayerWeights {
  TensorView attn_norm, ffn_norm;   // [D]
  HcWeights hc_attn, hc_ffn;        // fn [mix, S*D], base [mix], scale [3]
  // attention
  TensorView attn_sink;             // [H] F32
  WeightMatrix wq_a;                // [q_lora, D]
  TensorView q_norm;                // [q_lora]
  WeightMatrix wq_b;                // [H*Dh, q_lora]
  WeightMatrix wkv;                 // [Dh, D]
  TensorView kv_norm;               // [Dh]
  WeightMatrix wo_a;                // [G*R, H*Dh/G]
  WeightMatrix wo_b;                // [D, G*R]
  CompressorWeights compressor;     // CSA (width 2*Dh) or HCA (width Dh)
  WeightMatrix index_wq_b;          // CSA: [Hi*di, q_lora]
  WeightMatrix index_weights_proj;  // CSA: [Hi, D]
  CompressorWeights index_compressor;  // CSA: width 2*di
  // MoE
  WeightMatrix gate;                // [E, D]
  TensorView gate_bias;             // [E] F32, scored routing
  TensorView tid2eid;               // [V, K] I64/I32, hash routing
  std::vector<ExpertWeights> experts;  // E
  ExpertWeights shared;             // present iff num_shared_experts == 1
};

struct ModelWeights {
  WeightMatrix embed;   // [V, D]
  WeightMatrix head;    // [V, D]
  TensorView norm;      // [D]
  HcWeights hc_head;    // fn [S, S*D], base [S], scale [1]
  std::vector<LayerWeights> layers;
};

// Resolves and validates every tensor. Errors name the tensor, the expected and the found
// shape/dtype. The views point into `ckpt`, which must outlive the result. Reads no weight data
// (only tid2eid, whose ids are range-checked), so loading touches almost none of the mapping.
// `progress`, if set, is called after each layer with (layers checked, num_layers).
Expected<ModelWeights> model_weights_load(const SafetensorsCheckpoint& ckpt, const ModelConfig& config,
                                          const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace sparrow
