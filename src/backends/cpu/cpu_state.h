// Per-sequence decode state of the CPU backend (spec §5).
//
// Invariants, per layer: `ring` slot p % W holds the window key of position p for the last W
// positions absorbed; a compressor buffer holds the `pending` rows after its last complete window
// (gate rows with the positional bias already added), for CSA the first halves of the last
// complete window (`prev_*`), and the `count` entries emitted so far, normalised and rotated.
// The next window starts at position count * ratio.
#pragma once

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/model_config.h"
#include "ops/backend.h"

namespace sparrow::cpu {

struct CompressorBuffer {
  std::vector<float> pending_kv, pending_gate;  // [ratio, width]
  int64_t pending = 0;
  std::vector<float> prev_kv, prev_gate;        // [ratio, dim] (overlapping form only)
  bool has_prev = false;
  std::vector<float> entries;                   // [count, dim]
  int64_t count = 0;

  void init(int64_t ratio, int64_t dim, bool overlap) {
    const int64_t width = overlap ? 2 * dim : dim;
    pending_kv.assign(ratio * width, 0.0f);
    pending_gate.assign(ratio * width, 0.0f);
    if (overlap) {
      prev_kv.assign(ratio * dim, 0.0f);
      prev_gate.assign(ratio * dim, 0.0f);
    }
  }
};

struct CpuLayerState {
  std::vector<float> ring;   // [W, Dh]
  CompressorBuffer main;     // CSA/HCA compressed K=V entries [C, Dh]
  CompressorBuffer indexer;  // CSA indexer keys [C, di]
};

class CpuSequenceState final : public SequenceState {
 public:
  explicit CpuSequenceState(const ModelConfig& c) : layers_(c.num_layers) {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      CpuLayerState& s = layers_[l];
      s.ring.assign(c.sliding_window * c.head_dim, 0.0f);
      const int64_t m = c.compress_ratio[l];
      if (c.attention[l] == AttentionKind::kCsa) {
        s.main.init(m, c.head_dim, /*overlap=*/true);
        s.indexer.init(m, c.index_head_dim, /*overlap=*/true);
      } else if (c.attention[l] == AttentionKind::kHca) {
        s.main.init(m, c.head_dim, /*overlap=*/false);
      }
    }
  }
  int64_t length() const override { return length_; }
  void advance(int64_t n) override { length_ += n; }
  CpuLayerState& layer(int64_t l) {
    SPARROW_CHECK(l >= 0 && l < static_cast<int64_t>(layers_.size()));
    return layers_[l];
  }

 private:
  std::vector<CpuLayerState> layers_;
  int64_t length_ = 0;
};

}  // namespace sparrow::cpu
