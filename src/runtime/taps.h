// Tap recording: the model calls a TapFn with every named intermediate (`L3.attn.q`, ...); the
// recorder keeps host copies of those matching a pattern, in execution order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

struct TapRecord {
  std::string name;
  std::vector<int64_t> shape;
  ElemType type = ElemType::kF32;
  std::vector<float> f32;    // when type == kF32
  std::vector<int32_t> i32;  // when type == kI32
};

// Comma-separated shell globs ("L3.*,logits"); "*" or empty matches everything.
bool tap_pattern_match(const std::string& pattern, const std::string& name);

// The layer of a tap name ("L12.attn.q" -> 12), or -1 for model-level taps (embed, logits).
int64_t tap_layer(const std::string& name);

// Selections (indexer top-k, expert choice) are compared as sets, not values.
bool tap_is_selection(const std::string& name);

// `*_own` taps record what a side would have picked while --force-decisions imposed another
// side's picks: reported, never a divergence.
bool tap_is_informational(const std::string& name);

class TapRecorder {
 public:
  TapRecorder(Backend& backend, std::string pattern) : backend_(backend), pattern_(std::move(pattern)) {
    fn_ = [this](const std::string& name, const Tensor& t) { record(name, t); };
  }
  const TapFn* fn() const { return &fn_; }
  const std::vector<TapRecord>& records() const { return records_; }
  std::vector<TapRecord>& records() { return records_; }

 private:
  void record(const std::string& name, const Tensor& t);
  Backend& backend_;
  std::string pattern_;
  TapFn fn_;
  std::vector<TapRecord> records_;
};

// One forward over `ids` from an empty state, recording the taps that match `pattern`.
Expected<std::vector<TapRecord>> taps_run(const Model& model, Backend& backend, const std::vector<int32_t>& ids,
                                          const std::string& pattern, const ForcedDecisions* forced = nullptr);

// Writes records as F32 / I32 tensors; metadata "tap_order" lists the names in execution order.
Status taps_write_safetensors(const std::filesystem::path& path, const std::vector<TapRecord>& records);

}  // namespace sparrow
