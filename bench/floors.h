// Floors for `sparrow bench`: the fewest bytes one layer's step must move through device memory
// and the FLOPs it must do, for a decode step (B sequences, one token each, C tokens of context)
// and for a prefill of N tokens, itemised. Pure arithmetic on a ModelConfig; no device.
//
// What is counted (spec = ../shared/docs/dsv4-spec.md):
//   Weights, in the released formats (spec §2.1, §2.2): FP8 e4m3 linears with one e8m0 byte per
//   128x128 tile; routed experts MXFP4 (two e2m1 per byte, one e8m0 byte per 1x32 block), or FP8
//   tiles for a checkpoint whose expert_dtype is "fp8" (V4-Flash-Base); compressor/indexer
//   projections, router gate and norms bf16; mHC, attn_sink, ape and gate.bias fp32. A weight is
//   read once per step whatever the batch (the kernel reuses it across the batch's tokens).
//   Routed experts: only those the batch touches, in expectation. ASSUMPTION: each token's K
//   experts are a uniformly random K-subset of the E, independently across tokens, so one expert
//   is missed by a token with probability 1 - K/E and the expected number of distinct experts is
//   E (1 - (1 - K/E)^B). This is what balanced routing looks like; it holds for the scored layers
//   of a load-balanced model, and for the hash layers when the batch's token ids are distinct and
//   tid2eid's rows are uniform (synth draws them so). Real batches correlate and touch fewer.
//   KV reads per decode token: the window's min(W, C+1) entries (including the new token's), plus
//   for CSA the min(index_topk, visible) selected compressed entries, for HCA all visible ones
//   (visible = floor((C+1)/m), spec §5.3), each at the fast layout's record size: 448 e4m3 nope
//   values + 7 e8m0 scales (one per 64) + 1 pad byte + 64 bf16 rope values = 584 bytes for
//   V4-Flash (spec §5.1, the vLLM layout; kv_record_bytes generalises it). Indexer key reads: all
//   visible entries of a CSA layer, at the chosen key format (fp8: di e4m3 + one fp32 scale = 132
//   bytes, vLLM's; fp4: di/2 packed + one e8m0 per 32 = 68 bytes, layout [UNVERIFIED] in the spec;
//   bf16: 2 di = 256 bytes).
//   State writes per decode token: the new window record, and the compressor's pending kv and gate
//   rows at bf16 (the least a fast layout can keep; the reference keeps fp32). The entry a
//   compressor emits once every m tokens (and the m rows it pools) is not counted: under 1/m of
//   a record per token.
//   Activations: the S residual streams read and written once, bf16 (spec §3.1), per token.
//   Prefill: every weight once (experts: the expected distinct ones over N tokens), the streams
//   in and out, and the state it leaves: min(N, W) window records, floor(N/m) compressed records
//   and indexer keys. Keys the prefill's own attention reads are assumed to stay on chip (a
//   lower bound: a tiled kernel re-reads them).
//   FLOPs: 2 M N K for every projection (classed by the format of its weights: FP8/FP4 weights run
//   on FP8 tensor cores, W4A8 dequantised to FP8 as on Hopper; bf16/fp32 weights on bf16 ones),
//   attention 4 H Dh per attended key (q.k and p.v, spec §8), the indexer 2 Hi di + 2 Hi per
//   scored entry (spec §8; run in FP8 as DeepGEMM does). Norms, RoPE, softmax, Sinkhorn and the
//   SwiGLU are not counted (element-wise, not tensor-core work).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace sparrow::bench {

enum class IndexKeyFormat : uint8_t { kFp8, kFp4, kBf16 };
enum class ExpertFormat : uint8_t { kMxfp4, kFp8Block };

struct FloorOptions {
  IndexKeyFormat index_keys = IndexKeyFormat::kFp8;
  ExpertFormat experts = ExpertFormat::kMxfp4;
};

// The experts' format from the config (expert_dtype "fp8" -> FP8 tiles, else MXFP4); fp8 keys.
FloorOptions floor_options_for(const ModelConfig& c);
const char* index_key_format_name(IndexKeyFormat f);  // "fp8", "fp4", "bf16"

// Stored bytes of one [out, in] weight.
int64_t fp8_block_weight_bytes(int64_t out, int64_t in);  // out*in + ceil(out/128)*ceil(in/128)
int64_t mxfp4_weight_bytes(int64_t out, int64_t in);      // out*in/2 + out*ceil(in/32); REQUIRES in even
// One KV record in the fast layout: round_up(nope + ceil(nope/64), 8) + 2*rope (584 for V4-Flash).
int64_t kv_record_bytes(const ModelConfig& c);
// One indexer key: fp8 di + 4, fp4 di/2 + ceil(di/32), bf16 2*di (132, 68, 256 for di = 128).
int64_t index_key_bytes(const ModelConfig& c, IndexKeyFormat f);
// E (1 - (1 - K/E)^picks): distinct experts touched by `tokens` tokens of K distinct experts each,
// in expectation under uniform independent routing (K for one token, E when K = E).
double expected_distinct_experts(int64_t E, int64_t K, int64_t tokens);

struct StepBytes {
  double attn_weights = 0;     // wq_a, wq_b, wkv, wo_a, wo_b (FP8 + scales), q_norm, kv_norm, attn_sink
  double extra_weights = 0;    // CSA/HCA compressor (and CSA indexer) weights, ape rows read
  double router_weights = 0;   // gate [E, D] bf16, gate.bias or the tid2eid rows read
  double routed_experts = 0;   // expected distinct experts x bytes per expert
  double shared_expert = 0;
  double norms_mhc = 0;        // attn_norm, ffn_norm, the two mHC sites' fn/base/scale
  double kv_window = 0;        // window records read
  double kv_compressed = 0;    // compressed records read (decode) or written (prefill)
  double index_keys = 0;       // indexer keys read (decode) or written (prefill)
  double state_writes = 0;     // window records and compressor rows written
  double activations = 0;      // residual streams in and out
  double weights() const {
    return attn_weights + extra_weights + router_weights + routed_experts + shared_expert + norms_mhc;
  }
  double total() const { return weights() + kv_window + kv_compressed + index_keys + state_writes + activations; }
};

struct StepFlops {
  double gemm_fp8 = 0;   // projections with FP8/FP4 weights (attention, indexer wq_b, experts)
  double gemm_bf16 = 0;  // projections with bf16/fp32 weights (compressors, weights_proj, router, mHC)
  double attention = 0;  // 4 H Dh per attended key
  double indexer = 0;    // (2 Hi di + 2 Hi) per scored entry
  double total() const { return gemm_fp8 + gemm_bf16 + attention + indexer; }
};

struct StepFloor {
  StepBytes bytes;
  StepFlops flops;
  double experts_touched = 0;  // expected distinct routed experts
  int64_t tokens = 0;          // tokens in the step (B for decode, N for prefill)
  int64_t attended_keys = 0;   // keys attended, summed over the step's tokens
  int64_t scored_entries = 0;  // indexer entries scored, summed over the step's tokens
};

// REQUIRES: 0 <= layer < c.num_layers, batch >= 1, context >= 0.
StepFloor decode_floor(const ModelConfig& c, int64_t layer, int64_t batch, int64_t context, const FloorOptions& o);
// One sequence, tokens 0 .. tokens-1. REQUIRES: tokens >= 1.
StepFloor prefill_floor(const ModelConfig& c, int64_t layer, int64_t tokens, const FloorOptions& o);

// Measured ceilings (bench/device_peaks.h measures them).
struct Peaks {
  double hbm_bytes_per_s = 0;
  double bf16_flops_per_s = 0;
  double fp8_flops_per_s = 0;
};

struct FloorTime {
  double memory_s = 0;   // bytes / bandwidth
  double compute_s = 0;  // (gemm_fp8 + indexer) / fp8 peak + (gemm_bf16 + attention) / bf16 peak
  double floor_s = 0;    // max of the two
  bool memory_bound = false;
};
FloorTime floor_time(const StepFloor& f, const Peaks& p);

// A whole model's one-token decode step (`sparrow bench --model-step`): each layer's batch-1 floor
// at `context`, summed (each the larger of its bytes and FLOPs terms), plus the output head's
// stored bytes over the bandwidth (its 2 V D FLOPs are far below its bytes' time).
struct ModelStepFloor {
  double layers_s = 0;
  double head_s = 0;
  double total_s() const { return layers_s + head_s; }
};
ModelStepFloor model_step_floor(const ModelConfig& c, int64_t context, double head_bytes, const FloorOptions& o,
                                const Peaks& p);

// A model-step cell's graph-run segments (`--model-step-segments`): each segment's GPU time
// between events around its launch, in launch order; a step starts again at segment 0 (the model
// cuts after every layer, the head is the last segment).
struct SegmentSample {
  int segment = 0;
  double ms = 0;
  int nodes = 0, kernels = 0, driver_kernels = 0;  // driver_kernels: cuBLASLt's, launched through the driver
};
struct SegmentSummary {
  int segment = 0;
  double median_ms = 0;  // over the steps kept (the upper median of an even count)
  int nodes = 0, kernels = 0, driver_kernels = 0;  // the last kept step's
};
// Per segment, over the last `last_steps` steps (a step: the samples from a segment 0 to the next);
// in segment order, empty without samples.
std::vector<SegmentSummary> summarise_segments(const std::vector<SegmentSample>& samples, size_t last_steps);

// A model-step cell's kernel trace (`--kernel-trace`; cuda_backend.h set_kernel_trace): per traced
// segment launch, its kernels' names in node order and the global timer's readings (ns) of each
// launch in launch order: its earliest block before griddepcontrol.wait, the earliest and the
// latest past it (past the wait = the kernel before it had finished).
struct TracedLaunch {
  int segment = 0;
  std::vector<std::string> kernels;
  struct Record {
    uint64_t first_at_wait = 0, first_past_wait = 0, last_past_wait = 0;
    int64_t blocks = 0;
  };
  std::vector<Record> records;  // one per kernel when complete
  bool complete = false;
};
// Per segment and kernel position, medians over the complete launches of that segment (the upper
// median of an even count), in µs: `chain` = the next kernel's first past-wait reading minus this
// one's (the time this kernel held the chain: from its predecessor's end to its own; the segment's
// last kernel has none, -1); `resident` = its first past-wait reading minus its first at-wait
// reading (how long its earliest block sat at the wait before the predecessor finished: the
// overlap programmatic dependent launch bought); `spread` = its latest past-wait reading minus its
// earliest (its blocks' start spread). Launches whose kernel list differs from the segment's first
// complete one are left out (counted in `skipped`).
struct TracedKernel {
  std::string name;  // short_kernel_name of the node's name
  double chain_us = -1, resident_us = 0, spread_us = 0;
  int64_t blocks = 0;
};
struct TracedSegment {
  int segment = 0;
  int launches = 0, skipped = 0;
  double span_us = 0;  // median of the last kernel's first past-wait reading minus the first kernel's
  std::vector<TracedKernel> kernels;
  // The kernels' chain times summed by name (kernels without one left out), largest first: where
  // the segment's time goes.
  struct ByName {
    std::string name;
    double chain_us = 0;
    int count = 0;
  };
  std::vector<ByName> by_name;
};
std::vector<TracedSegment> summarise_kernel_trace(const std::vector<TracedLaunch>& launches);
// A kernel's mangled name made readable: its function name and integer / bool template arguments
// ("_ZN7sparrow4cuda..25grouped_w4a8_wgmma_kernelILi8ELi1ELi4ELb1EEEv..." -> "grouped_w4a8_wgmma_kernel<8,1,4,1>");
// a name it cannot read, as it is.
std::string short_kernel_name(const std::string& mangled);

}  // namespace sparrow::bench
