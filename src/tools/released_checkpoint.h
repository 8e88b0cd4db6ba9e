// The released DeepSeek-V4-Flash checkpoint layout (spec §2.1, §2.2) and a streaming writer for it.
//
// released_layout lists every tensor the release stores for a config, under its released name, with
// its logical shape and how the release stores it: FP8 e4m3 with 128x128 block scales for the
// attention projections (wq_a, wq_b, wkv, wo_a, wo_b), the indexer's wq_b and the shared expert;
// MXFP4 (packed e2m1, 1x32 e8m0 scales) for the routed experts; BF16 for embed, head, norms, the
// router gate, the compressors' wkv/wgate and the indexer's weights_proj; F32 for hc_*, attn_sink,
// ape and gate.bias; I64 for tid2eid. The V4-Flash-Base variant stores F32 scales and FP8 experts.
//
// released_checkpoint_write asks a TensorSource for each tensor's logical fp32 values a block of
// rows at a time, encodes them (power-of-two scales, spec §3.0.5: s = 2^ceil(log2(amax/qmax))) and
// streams them to disk with CheckpointWriter, so memory stays at a few chunks whatever the model's
// size. Then it writes config.json in the released schema. MTP blocks are not written
// (`num_nextn_predict_layers` 0, `compress_ratios` has one entry per main layer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "sparrow/status.h"
#include "tools/checkpoint_writer.h"

namespace sparrow {

// How a tensor is stored.
enum class Storage : uint8_t {
  kF32,
  kBF16,
  kFp8,   // F8_E4M3 [out, in] + `.scale` [ceil(out/128), ceil(in/128)] (F8_E8M0, or F32 for Base)
  kFp4,   // I8 [out, in/2] packed e2m1, low nibble = even input + `.scale` F8_E8M0 [out, in/32]
  kI64,
};

// What a tensor is (for initialisation by the synthesiser and for messages).
enum class TensorKind : uint8_t {
  kEmbed,     // [V, D]
  kLinear,    // [out, in] projection (head, attention, compressor, indexer, gate, experts)
  kNorm,      // RMSNorm weight [n]
  kHcFn,      // [mix, S*D]
  kHcBase,    // [mix]: layer sites (2+S)*S (pre, post, comb), head S (pre)
  kHcScale,   // [3] or [1]
  kSink,      // attn_sink [H]
  kApe,       // compressor position bias [ratio, width]
  kGateBias,  // [E]
  kTid2eid,   // [V, K] expert ids
};

enum class ReleaseVariant : uint8_t {
  kFlash,      // FP8 + e8m0 scales, MXFP4 routed experts (`expert_dtype: fp4`)
  kFlashBase,  // FP8 + F32 scales, FP8 routed experts (`expert_dtype: fp8`)
};

struct ReleasedTensor {
  std::string name;              // released name of the weight: "layers.3.attn.wq_a.weight"
  TensorKind kind;
  Storage storage;
  std::vector<int64_t> shape;    // logical: [out, in] for matrices, [n] for vectors
  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.back(); }
};

// Every tensor of the released layout for `c`, in the order they are written (globals, then layer
// by layer, routed experts last in each layer, the head last of all). Errors: Unsupported when an
// expert matrix cannot be stored as MXFP4 (input size not a multiple of 32).
Expected<std::vector<ReleasedTensor>> released_layout(const ModelConfig& c, ReleaseVariant variant);

// "X.weight" -> "X.scale".
std::string scale_name(const std::string& weight_name);

// Where the values come from. Calls come from one thread, in layout order; an implementation may
// use parallel_for inside.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The logical fp32 values of rows [r0, r1) of `t` (a vector is one row), row-major, into `out`.
  virtual Status float_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, float* out) = 0;
  // The same for integer tensors (tid2eid).
  virtual Status int_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, int64_t* out) = 0;
  // Optional, for MXFP4 tensors: the stored bytes of rows [r0, r1) directly, packed [r1-r0, C/2]
  // and e8m0 scales [r1-r0, C/32]. A source that generates codes rather than values (the
  // synthesiser) saves the encoder's work, which dominates writing a 160 GB model. Returns false
  // to have float_rows and the encoder used instead.
  virtual bool fp4_rows(const ReleasedTensor& t, int64_t r0, int64_t r1, uint8_t* packed, uint8_t* scales) {
    return false;
  }
};

struct ReleasedWriteOptions {
  ReleaseVariant variant = ReleaseVariant::kFlash;
  uint64_t max_shard_bytes = kReleaseShardBytes;
  // Called after each tensor with (bytes written, total bytes).
  std::function<void(uint64_t done, uint64_t total)> progress = nullptr;
};

// Writes `dir`/config.json and the sharded safetensors checkpoint. Non-finite source values are an
// error naming the tensor and element (the FP formats here have no infinities and e2m1 no NaN).
Status released_checkpoint_write(const std::filesystem::path& dir, const ModelConfig& c, TensorSource& source,
                                 const ReleasedWriteOptions& options = {});

// The released-schema config.json text for a checkpoint written in `variant` (quantization_config
// with scale_fmt ue8m0 for Flash, expert_dtype, no MTP entries).
std::string released_config_json(const ModelConfig& c, ReleaseVariant variant);

}  // namespace sparrow
