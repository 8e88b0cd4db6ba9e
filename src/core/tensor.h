// Views of checkpoint weights and owned activation buffers (the CPU backend's memory).
//
// Dimension letters used in shape comments across the project: T tokens, D hidden, H heads,
// Dh head dim, E experts, K experts per token, S residual streams, C compressed entries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sparrow {

// A read-only view of one stored tensor (usually inside an mmap'd safetensors file).
struct TensorView {
  std::string name;             // checkpoint key, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;   // not owned
  size_t nbytes = 0;
  // Process-unique identity of bytes that stay unchanged while any view of them lives (a tensor of
  // a mapped checkpoint: SafetensorsFile numbers its tensors); 0 when unknown. Device caches key
  // on it, so they need not look at the host bytes again (cuda_backend.cpp device_bytes).
  uint64_t id = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(size_t i) const { return shape.at(i); }
};

// How a weight matrix's stored bytes map to its logical [out, in] values.
enum class WeightFormat : uint8_t {
  kFloat,        // F32 / F16 / BF16, [out, in]
  kFp8Block,     // F8_E4M3 [out, in] with scales [ceil(out/bo), ceil(in/bi)] (e8m0 or f32)
  kFp4Packed,    // I8/U8 [out, in/2] packed e2m1 (low nibble = even input index), scales [out, in/32]
};

// A logical [out, in] weight matrix in its checkpoint format. Backends dequantise as they read.
struct WeightMatrix {
  WeightFormat format = WeightFormat::kFloat;
  int64_t out = 0;
  int64_t in = 0;
  TensorView data;
  TensorView scale;             // empty unless quantised
  int64_t block_out = 1;        // scale block shape
  int64_t block_in = 1;
  bool present() const { return data.data != nullptr; }
};

}  // namespace sparrow
