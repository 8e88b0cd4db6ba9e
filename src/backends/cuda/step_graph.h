// CUDA graphs for a step's work (docs/cuda.md, "CUDA graphs"): the backend's ops between
// Backend::begin_step and end_step are recorded by stream capture on the calling thread's default
// stream, a segment at a time (Backend::step_segment: the model cuts after every layer), and each
// segment is launched as soon as it is recorded, while the host records the next. A segment runs
// through an executable graph kept from an earlier step whose segment had the same signature (the
// same nodes, kernels, grids and copy sizes), updated in place (cudaGraphExecUpdate), else through
// a new one.
//
// The host still plans every op each step, so what changes from step to step (positions, the
// per-op plans, the KV state's pointers, grid sizes) is whatever this step's ops chose; the update
// only takes this capture's arguments into the kept graph. What the graph saves: a launch costs the
// host about 1 µs captured against 4-5 µs (bench/host_overhead.cu), and the GPU runs the kernels
// back to back.
//
// What a capture needs from the rest of the backend, provided through the hooks below:
// - memory: allocations inside the step come from an arena (two slots used in turn, each kept
//   until every tensor in it is freed; blocks freed in the step are handed out again, first fit:
//   arena_blocks.h), so that a step of the same shape gets the same addresses;
//   allocations that outlive the step (weights, sequence state, kept scratch: a LongLived scope),
//   or that do not fit the arena, come from cudaMalloc ("side" memory, freed with cudaFree). No
//   allocation node enters a graph: such an allocation's address belongs to its graph, and the
//   graphs here are dropped or updated after their launch (an early version that let the pool's
//   allocations become graph nodes gave wrong tokens now and then in `sparrow serve`);
// - uploads: bytes copied from the host go through pinned staging memory of the same slot, which a
//   captured copy reads when the graph runs (the slot is reused only after its last graph finished);
// - frees of pool memory inside a segment wait until its graph is launched.
// A segment that used side memory or outgrew the staging memory runs once as a graph of its own,
// not kept; the slots grow before the next step. Anything that synchronises inside a step (a
// download, a synchronous copy) ends the process with a message naming SPARROW_CUDA_DISABLE=graphs:
// the backend captures only steps that read nothing back (Backend::begin_step's `capturable`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/arena_blocks.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"

namespace sparrow::cuda {

class StepGraphs {
 public:
  StepGraphs();
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Starts capturing the calling thread's default stream, or returns false (nothing started) when
  // neither arena slot is free (a tensor of each is still alive): the step then runs op by op.
  bool begin();
  // Ends the capture of the step's work so far and launches it, then captures the rest: the GPU
  // runs one segment (a layer) while the host records the next.
  void segment();
  // Ends the capture and launches the step's last segment (a capture error ends the process).
  void end();
  bool capturing() const { return capturing_; }
  void count_eager() { ++stats_.eager; }
  const StepGraphStats& stats() const { return stats_; }
  // Events around every segment's launch while on (cuda_backend.h set_step_segment_timing).
  void set_timing(bool on) { timing_ = on; }
  std::vector<StepSegmentTime> take_times();  // waits for the timed launches
  // Kernel timestamps in every segment launched while on (cuda_backend.h set_kernel_trace).
  void set_kernel_trace(bool on);
  std::vector<KernelTraceLaunch> take_kernel_trace();  // waits for the traced launches

  // The hooks (cuda_backend.cpp's device_alloc, device_free, host_to_device), valid while capturing.
  // `bytes` of the arena; memory that must outlive the step, or does not fit, from cudaMalloc
  // instead (side_alloc: no allocation node enters the graph, and the capture is not kept).
  void* arena_alloc(size_t bytes, bool long_lived);
  void* side_alloc(size_t bytes);
  // Side memory freed during the capture: freed (cudaFree) after the graph's launch.
  void defer_side_free(void* p) { deferred_side_frees_.push_back(p); }
  // A pinned copy of `bytes` at `src` for a captured host-to-device copy to read.
  const void* stage(const void* src, size_t bytes);
  // Pool memory freed during the capture: freed on the stream after the graph's launch.
  void defer_free(void* p) { deferred_frees_.push_back(p); }
  // Whether `p` lies in this object's arena; if so its slot counts one tensor fewer
  // (release_step_memory calls it under its lock).
  bool arena_release(void* p);

 private:
  struct Slot {
    char* dev = nullptr;
    size_t dev_cap = 0;
    ArenaBlocks blocks;  // the arena's blocks in dev (arena_blocks.h)
    char* pinned = nullptr;
    size_t pinned_cap = 0, pinned_used = 0;
    std::vector<void*> extra_pinned;  // one-off staging of a capture that outgrew pinned
    cudaEvent_t done = nullptr;       // recorded after the slot's last graph launch
    bool launched = false;
  };
  struct Kept {
    cudaGraphExec_t exec = nullptr;
    uint64_t signature = 0;  // graph_signature (step_graph.cpp, the node count in it): what an update may not change
    uint64_t last_use = 0;
  };
  static constexpr int kKept = 4;  // executable graphs kept a segment, by signature (least recently used goes)

  void start_capture();
  void finish_capture();  // ends the capture, launches its graph

  Slot slots_[2];
  int cur_ = 0;
  bool capturing_ = false, clean_ = true;
  size_t want_dev_ = size_t{16} << 20, want_pinned_ = size_t{1} << 20;  // slot sizes for the next step
  size_t demand_dev_ = 0, demand_pinned_ = 0;  // this step's needs beyond the slot (device), all of it (pinned)
  std::vector<void*> deferred_frees_, deferred_side_frees_;
  int segment_ = 0;                       // of the step being captured
  std::vector<std::vector<Kept>> kept_;   // by segment
  uint64_t tick_ = 0;
  StepGraphStats stats_;
  struct Timed {
    StepSegmentTime t;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  bool timing_ = false;
  std::vector<Timed> timed_;
  struct Traced {
    int segment = 0;
    std::vector<std::string> kernels;
  };
  static constexpr int kTraceRegions = 256;  // segments traced until take_kernel_trace
  bool trace_ = false;
  KernelTraceSlot* trace_dev_ = nullptr;     // kTraceRegions regions of kKernelTraceSlots, 0xff-filled
  std::vector<Traced> traced_;               // region i: traced_[i]
};

// device_free's first question: whether `p` is a step arena's memory (its slot then counts one
// tensor fewer) or a capture's cudaMalloc (freed, after the launch when freed in a capture).
bool release_step_memory(void* p);

// The StepGraphs capturing on this thread, or null.
StepGraphs* capturing_step();

// Allocations made while one of these lives outlive the step that makes them (weight caches,
// sequence state, scratch kept between calls): a capture takes them from cudaMalloc, not the arena.
class LongLived {
 public:
  LongLived();
  ~LongLived();
  LongLived(const LongLived&) = delete;
  LongLived& operator=(const LongLived&) = delete;
};
bool long_lived_now();

}  // namespace sparrow::cuda
