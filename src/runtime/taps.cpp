#include "runtime/taps.h"

#include <fnmatch.h>

#include <cstring>
#include <sstream>

#include "io/safetensors.h"
#include "runtime/session.h"

namespace sparrow {

bool tap_pattern_match(const std::string& pattern, const std::string& name) {
  if (pattern.empty()) return true;
  std::stringstream ss(pattern);
  std::string glob;
  while (std::getline(ss, glob, ','))
    if (!glob.empty() && fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

int64_t tap_layer(const std::string& name) {
  if (name.size() < 3 || name[0] != 'L') return -1;
  int64_t layer = 0;
  size_t i = 1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) layer = layer * 10 + (name[i] - '0');
  return (i > 1 && i < name.size() && name[i] == '.') ? layer : -1;
}

bool tap_is_selection(const std::string& name) {
  return name.ends_with(".indexer.topk") || name.ends_with(".indexer.topk_own") || name.ends_with(".router.experts");
}

bool tap_is_informational(const std::string& name) { return name.ends_with("_own"); }

void TapRecorder::record(const std::string& name, const Tensor& t) {
  if (!tap_pattern_match(pattern_, name)) return;
  TapRecord r;
  r.name = name;
  r.shape = t.shape();
  r.type = t.type();
  if (t.type() == ElemType::kF32) {
    r.f32 = backend_.download_f32(t);
  } else {
    r.i32 = backend_.download_i32(t);
  }
  records_.push_back(std::move(r));
}

Expected<std::vector<TapRecord>> taps_run(const Model& model, Backend& backend, const std::vector<int32_t>& ids,
                                          const std::string& pattern, const ForcedDecisions* forced) {
  SPARROW_RETURN_IF_ERROR(token_ids_check(ids, model.config().vocab_size));
  SPARROW_RETURN_IF_ERROR(model.check_backend(backend));
  if (ids.empty()) return Status::invalid_argument("no token ids given");
  TapRecorder recorder(backend, pattern);
  auto state = backend.create_sequence_state(model.config());
  BatchInfo batch = batch_build({{state.get(), ids}});
  model.forward(backend, batch, {.tap = recorder.fn(), .forced = forced});
  return std::move(recorder.records());
}

Status taps_write_safetensors(const std::filesystem::path& path, const std::vector<TapRecord>& records) {
  std::vector<TensorToWrite> out;
  std::string order;
  for (const TapRecord& r : records) {
    TensorToWrite t;
    t.name = r.name;
    t.shape = r.shape;
    if (r.type == ElemType::kF32) {
      t.dtype = DType::kF32;
      t.bytes.resize(r.f32.size() * 4);
      std::memcpy(t.bytes.data(), r.f32.data(), t.bytes.size());
    } else {
      t.dtype = DType::kI32;
      t.bytes.resize(r.i32.size() * 4);
      std::memcpy(t.bytes.data(), r.i32.data(), t.bytes.size());
    }
    out.push_back(std::move(t));
    order += (order.empty() ? "" : ",") + r.name;
  }
  return safetensors_write(path, out, {{"tap_order", order}});
}

}  // namespace sparrow
