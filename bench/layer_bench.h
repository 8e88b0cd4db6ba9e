// Times one decoder layer of a loaded model on the CUDA backend: a decode step of B sequences
// with C tokens of context each, and a prefill of N tokens (`sparrow bench`).
//
// Decode state is built directly, not by prefilling: each sequence's state for the timed layer is
// filled on the device with random values (device_fill.h) as if C tokens had been absorbed: the
// window ring full, floor(C/m) compressed entries (and for CSA as many indexer keys) plus room for
// the one this step may emit, C mod m pending compressor rows, the previous window's halves
// (CSA), and the host counters set to match (cuda_state.h). The layer only reads entries below
// the visible count, so random contents time exactly what real ones would. Layers other than the
// timed one get no compressed state (their rings exist, as CudaSequenceState allocates them).
// Each timed step decodes position C again: the compressor counters are reset after every step, so
// every repetition does the same work on the same state (the ring slot and pending row it writes
// are rewritten identically), and no buffer grows.
//
// Timing (/work/.library/device/METHOD.md): cudaEvents on the default stream around the layer's
// whole forward (host planning and the MoE's host round trip included: that is the step's
// latency on this backend); warm-up steps first; repetitions until both `min_reps` and
// `target_s` seconds are reached (or `max_reps`); median. Inputs rotate among `input_sets` sets
// (residual streams and token ids, so routing differs too), restored from a pristine copy before
// every step (the layer updates the streams in place); when a cell's state is small (under
// kRotateStateBytes) it rotates among as many state copies, so that L2 does not hold the KV.
// Before any timing, `warm` runs the layer once over enough tokens to touch every expert, so
// every weight is on the device (the backend uploads weights on first use).
//
// A cell whose state and activations would not fit in the free device memory (with a margin) is
// skipped with the reason, not run (the backend aborts when cudaMalloc fails).
//
// REQUIRES: `backend` is the CUDA backend (make_cuda_backend); `model` outlives this object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow::bench {

struct TimingOptions {
  int warmup = 2;
  int min_reps = 3;
  int max_reps = 20;
  double target_s = 1.0;  // timed seconds after which no more repetitions start (past min_reps)
  int input_sets = 4;
  uint64_t seed = 1;
  // After the timed steps, one more step with the backend's per-op profiling on
  // (cuda::set_op_profiling), kept in CellTiming::breakdown. Not part of the timing.
  bool breakdown = false;
  // Decode cells: each step a Backend step (begin_step / end_step), which the CUDA backend captures
  // as a CUDA graph (docs/cuda.md); off, the ops run one by one. A one-layer step captured whole
  // serialises the host's capture and the GPU's work, which a model step overlaps a layer at a time,
  // so the timed figure then overstates a step's share; `queued` shows the graph's GPU time.
  bool graphs = false;
};

struct CellTiming {
  bool ok = false;
  std::string skipped;  // why, when !ok
  double median_ms = 0, min_ms = 0, max_ms = 0;
  // The host's time to enqueue a step (the call's wall time, before the wait for the GPU), median:
  // near median_ms, the GPU waited on the host (launches, planning, uploads) for most of the step.
  double host_median_ms = 0;
  // Decode cells: the median step time with the step's work queued ahead on the GPU (behind a spin
  // kernel that outlasts the host's enqueue), so no launch or planning gap is in it: the GPU's own
  // time for the step, what it would take were the host not the bound (CUDA graphs aim there).
  // -1 when no such step could be timed; queued_reps steps counted.
  double queued_median_ms = 0;
  int queued_reps = 0;
  int reps = 0;
  int state_sets = 0;
  double state_bytes = 0;       // device bytes of the fp32 decode state built for the cell (all sets)
  double experts_touched = -1;  // distinct routed experts of one untimed step, measured (-1: not)
  std::vector<cuda::OpTime> breakdown;  // TimingOptions::breakdown: per op of one extra step
  // That step's wall time, host clock, synchronised at both ends; for decode cells, whose step runs
  // behind a spin kernel, its GPU time (events around the step) instead: with breakdown_queued (the
  // whole step enqueued before the spin ended, as for queued_median_ms) neither it nor the ops' GPU
  // times hold a wait for the host.
  double breakdown_step_ms = 0;
  bool breakdown_queued = false;
};

class LayerBench {
 public:
  LayerBench(const Model& model, Backend& backend) : model_(model), backend_(backend) {}

  // Uploads the layer's weights: one untimed forward over `tokens` tokens from position 0.
  // Returns its wall time in seconds, or why the layer cannot be held.
  Expected<double> warm(int64_t layer, int64_t tokens, uint64_t seed);

  CellTiming decode(int64_t layer, int64_t batch, int64_t context, const TimingOptions& options);
  CellTiming prefill(int64_t layer, int64_t tokens, const TimingOptions& options);

  // Device bytes the backend keeps for layer `layer`'s weights (their stored formats).
  static double layer_weight_bytes(const ModelConfig& c, int64_t layer);

 private:
  // One decode step of layer `layer`; with `graphs` a Backend step (TimingOptions::graphs).
  void decode_step(const BatchInfo& batch, int64_t layer, Tensor& streams, bool graphs) {
    if (!graphs) return model_.forward_layer(backend_, batch, layer, streams);
    const StepScope step(backend_, batch.num_tokens(), /*capturable=*/true);
    model_.forward_layer(backend_, batch, layer, streams);
  }

  const Model& model_;
  Backend& backend_;
};

}  // namespace sparrow::bench
