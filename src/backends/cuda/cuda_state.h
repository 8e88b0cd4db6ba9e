// Device memory of the CUDA backend: an owning buffer, and the per-sequence decode state (spec §5),
// laid out as src/backends/cpu/cpu_state.h lays out the CPU's.
//
// Invariants, per layer: `ring` slot p % W holds the window key of position p for the last W
// positions absorbed; a compressor buffer holds the `pending` rows after its last complete window
// (gate rows with the positional bias already added), for CSA the first halves of the last
// complete window (`prev_*`), and the `count` entries emitted so far, normalised and rotated, in
// `entries` (room for `capacity`; it grows by doubling). The counters live on the host: they
// follow from the positions absorbed, so the host plans every launch without reading the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/kv_record.h"
#include "core/model_config.h"
#include "ops/backend.h"

namespace sparrow::cuda {

// The weight caches (device copies of stored tensors, and the FP8 GEMM's padded copies) key a view
// without a TensorView::id by host address, and freed memory reused for another tensor can put
// different bytes at the same address. Each such entry keeps this fingerprint of what it was made
// from, the size and FNV-1a over three 256-byte windows (start, middle, end), and is rebuilt when it
// differs; two tensors that agree in size and in all three windows would still collide.
// Checkpoint tensors have ids and are never fingerprinted (their pages are not read again).
inline uint64_t host_fingerprint(const void* p, size_t bytes) {
  uint64_t h = 1469598103934665603ull ^ bytes;
  const auto* b = static_cast<const unsigned char*>(p);
  auto mix = [&](size_t from) {
    const size_t end = from + 256 < bytes ? from + 256 : bytes;
    for (size_t i = from; i < end; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  if (!p || bytes == 0) return h;
  mix(0);
  if (bytes > 512) mix(bytes / 2 - 128);
  if (bytes > 256) mix(bytes - 256);
  return h;
}

// The fingerprint a cache entry made from view `v` carries: 0 for a view with an id (its bytes never
// change), else host_fingerprint of its bytes.
inline uint64_t view_fingerprint(const TensorView& v) {
  return v.id != 0 ? 0 : host_fingerprint(v.data, static_cast<size_t>(v.numel()) * dtype_size(v.dtype));
}

// The fingerprint of a device copy made from several weights (a stack, cached under its first
// weight's view): every weight's identity (its views' ids, else their addresses) and
// view_fingerprint, so that two stacks sharing a first weight are told apart (view_fingerprint
// alone is 0 for every view with an id).
inline uint64_t stack_fingerprint(std::span<const WeightMatrix* const> ws) {
  uint64_t h = 1469598103934665603ull ^ ws.size();
  const auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const WeightMatrix* w : ws)
    for (const TensorView* v : {&w->data, &w->scale}) {
      mix(v->id != 0 ? v->id : reinterpret_cast<uintptr_t>(v->data));
      mix(view_fingerprint(*v));
    }
  return h;
}

// Device copies made from stored tensors, keyed as above: by the view's id when it has one, else by
// its host address, an entry counting only while its fingerprint matches. One per cache (the
// backend's uploads, the FP8 GEMM's padded weights).
template <class V>
class WeightCache {
 public:
  // The entry made from `v` with fingerprint `fp`, or null.
  V* find(const TensorView& v, uint64_t fp) {
    Entry* e = nullptr;
    if (v.id != 0) {
      auto it = by_id_.find(v.id);
      if (it != by_id_.end()) e = &it->second;
    } else {
      auto it = by_address_.find(v.data);
      if (it != by_address_.end()) e = &it->second;
    }
    return e && e->fingerprint == fp ? &e->value : nullptr;
  }
  // Stores `value` as the entry of `v` (replacing any) and returns it.
  V& put(const TensorView& v, uint64_t fp, V value) {
    Entry& e = v.id != 0 ? by_id_[v.id] : by_address_[v.data];
    e = Entry{std::move(value), fp};
    return e.value;
  }

 private:
  struct Entry {
    V value;
    uint64_t fingerprint = 0;
  };
  std::unordered_map<uint64_t, Entry> by_id_;              // checkpoint tensors
  std::unordered_map<const void*, Entry> by_address_;      // views without an id
};

// `bytes` of device memory from the stream-ordered pool on the default stream (cuda_backend.cpp),
// zero-filled unless `zero` is false (then left as they come).
void* device_alloc(size_t bytes, bool zero = true);
void device_free(void* p);
// `bytes` from host memory `src` to device memory `dst`, in stream order (cuda_backend.cpp); `src`
// may be reused as soon as it returns.
void host_to_device(void* dst, const void* src, size_t bytes);
// Synchronises and returns the pool's cached free blocks to the driver (so that cudaMemGetInfo
// counts them as free).
void trim_device_pool();

// Device bytes from device_alloc, zero-filled unless `zero` is false, freed (stream-ordered) on
// destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, bool zero = true);
  // An op's scratch whose every byte a kernel writes before any is read: not filled (a fill is a
  // graph node of its own, which also cuts a chain of programmatic dependent launches), unless
  // SPARROW_CUDA_DISABLE=scratch_nofill; 0xff bytes under SPARROW_CUDA_POISON_ALLOC=1.
  static DeviceBuffer scratch(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // Scratch reused across calls: at least `bytes` (grown, never shrunk; the contents are then not
  // kept). Work is in stream order on one stream, so the previous user's kernels have read it first.
  void ensure(size_t bytes);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct CompressorBuffer {
  DeviceBuffer pending_kv, pending_gate;  // [ratio, width]
  DeviceBuffer prev_kv, prev_gate;        // [ratio, dim] (overlapping form only)
  DeviceBuffer entries;                   // [capacity, dim]
  int64_t ratio = 0, dim = 0;
  bool overlap = false;
  int64_t pending = 0;
  int64_t count = 0;
  int64_t capacity = 0;
  bool has_prev = false;
  // The entries also as bf16 bits [capacity, dim] when they are bf16 values, for the tensor-core
  // kernels: the indexer's keys at --index-keys bf16 or fp4, the compressed KV under the fast
  // profiles (round_bf16). Entries 0 .. mirrored - 1 are copied; the copy is kept only while every
  // entry since the first has been (mirrored == count), else the kernels read the fp32 entries.
  DeviceBuffer entries_bf16;
  int64_t mirrored = 0;
  // The compressed KV stored as FP8 KV records only (core/kv_record.h): `entries_rec` [capacity,
  // rec.bytes] instead of `entries` and `entries_bf16` (which stay empty). Chosen by the compressor
  // at a sequence's first entries, when they are record values (the fast profiles) and the
  // layer's KV can be records (LayerState::rec); kept from then on.
  DeviceBuffer entries_rec;
  KvRecordLayout rec{};

  void init(int64_t ratio, int64_t dim, bool overlap);
  // Makes room for `n` entries in total, keeping the ones stored (and their copies or records).
  void reserve(int64_t n);
  // Whether the bf16 copy holds every entry.
  bool mirror_complete() const { return entries_bf16.get() != nullptr && mirrored == count; }
  bool records() const { return rec.bytes > 0; }
};

// How a layer's window ring holds its keys, fixed by the sequence's first window_append: as values
// (`ring` in fp32 and `ring_bf16`), or as FP8 KV records only (`ring_rec`; the appended rows were
// record values: WindowAppendParams::kv_record).
enum class RingForm : uint8_t { kUnset, kValues, kRecords };

struct LayerState {
  DeviceBuffer ring;         // [W, Dh]
  DeviceBuffer ring_bf16;    // [W, Dh] bf16 bits of the ring, written with it (the tensor-core attention)
  DeviceBuffer ring_rec;     // [W, rec.bytes] the ring as records (rec.bytes > 0)
  RingForm ring_form = RingForm::kUnset;
  int64_t window = 0;        // W
  // The layout of this layer's KV records when its KV may be stored so (the state was made keeping
  // records and kv_records_layout allows them), else bytes = 0.
  KvRecordLayout rec{};
  CompressorBuffer main;     // CSA/HCA compressed K=V entries [C, Dh]
  CompressorBuffer indexer;  // CSA indexer keys [C, di]
};

class CudaSequenceState final : public SequenceState {
 public:
  // kv_records: the state may keep its KV as FP8 KV records (LayerState::rec set where the model's
  // shape allows, cuda_backend.h kv_records_layout; the backend's setting, set_kv_records).
  explicit CudaSequenceState(const ModelConfig& c, bool kv_records = false);
  int64_t length() const override { return length_; }
  void advance(int64_t n) override { length_ += n; }
  LayerState& layer(int64_t l);

 private:
  std::vector<LayerState> layers_;
  int64_t length_ = 0;
};

}  // namespace sparrow::cuda
