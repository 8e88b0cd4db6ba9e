// The CUDA backend (Hopper, sm_90a): every op of src/ops/backend.h on the GPU, fp32 arithmetic,
// weights in their checkpoint formats in device memory. Activation Tensors hold device pointers.
//
// Weights are uploaded on first use and cached by TensorView::id (checkpoint tensors) or by the
// address of their stored bytes checked against a fingerprint, so
// REQUIRES: a weight's bytes stay alive and unchanged while the backend is in use (the mmap'd
// checkpoint of a loaded Model satisfies this). All work runs on the calling thread's default
// stream (the build's `--default-stream per-thread`, CMakeLists.txt), in order; downloads
// synchronise. Not thread-safe: one backend per thread, and a backend's work all from that thread
// (another thread's default stream is not ordered with it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/kv_record.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

// Fails with a Status (no abort) when no usable CUDA device is present, or when GPU 0 is not a
// compute capability 9.0 (Hopper) part, the only one this build has code for.
Expected<std::unique_ptr<Backend>> make_cuda_backend();

namespace cuda {

// Whether the compressor keeps bf16 copies of a slot's entries (CompressorBuffer::entries_bf16)
// where a tensor-core kernel reads them: the indexer's keys when stored as bf16 values
// (--index-keys bf16 or fp4; `indexer_mma`), the compressed KV under the profiles that round to
// bf16 (`attn_mma`, `attn_bf16_kv`). The compressor op and the benchmark's state fill both ask here.
bool compressor_keeps_bf16_copies(CompressorSlot slot, KeyPrecision keys, bool round_bf16);

// The KV record layout (core/kv_record.h) a model's window and compressed KV can be stored in under
// the fast profiles (when the backend keeps records: kv_records below), or one with bytes = 0 where
// they stay values: the record needs its nope dims in whole blocks of 64 and 8-byte multiples for
// its size and RoPE offset (the kernel's copies and reads), the tensor-core attention (the one
// kernel that reads records) the model's heads and Dh, and `attn_mma` and `attn_split` on.
KvRecordLayout kv_records_layout(const ModelConfig& c);

// Test support: the compressed entries (`slot` = kMain) or indexer keys (kIndexer) stored so far in
// layer `layer` of a state created by the CUDA backend, [count, dim] row-major.
std::vector<float> state_entries(SequenceState& state, int64_t layer, CompressorSlot slot);
// Test support: whether layer `layer` of that state keeps its window ring or its compressed KV as
// FP8 KV records (LayerState::ring_form, CompressorBuffer::entries_rec).
bool state_keeps_records(SequenceState& state, int64_t layer);
// Test support: the device bytes layer `layer`'s compressed KV holds (entries, bf16 copies, records).
int64_t state_entry_bytes(SequenceState& state, int64_t layer);

// Test support: `rows` ([n, dim] row-major) rounded on the device by the kernel the compressor uses
// for `--index-keys`. REQUIRES a CUDA backend was created (the device is selected).
std::vector<float> key_sim_rows(const std::vector<float>& rows, int64_t dim, KeyPrecision precision);

// Test support: the indexer's top-k selection alone on the device (the kernel indexer_topk runs
// after its scores) over `scores` [T, C] row-major, T = visible.size(), entries w < visible[t] of
// row t competing: [T, k] indices by rank (higher score first, then the lower index), -1 past the
// visible count. REQUIRES a CUDA backend was created.
std::vector<int32_t> indexer_select_rows(const std::vector<float>& scores, const std::vector<int64_t>& visible,
                                         int64_t k);
// The same through one kernel (kernels.h IndexerSelectKernel; the kernel's bounds are not checked).
enum class IndexerSelectKernel : int;
std::vector<int32_t> indexer_select_rows(const std::vector<float>& scores, const std::vector<int64_t>& visible,
                                         int64_t k, IndexerSelectKernel kernel);

// Test support for linear_fp8_block (backends/cuda/fp8_linear.h). REQUIRES `backend` was made by
// make_cuda_backend. The path its last call took: "tensor cores: <cuBLASLt version, shape>" or
// "fallback: <why>".
std::string fp8_linear_last_path(Backend& backend);
// true: every call takes the fallback kernel (to test it where cuBLASLt works); false: the default.
void fp8_linear_force_fallback(Backend& backend, bool force);
// While on, linear_fp8_block reuses the activation quantisation of the same input tensor made by its
// last call (Fp8Linear::keep_quantised) instead of quantising it again: `sparrow bench` times the FP8
// GEMM alone this way, after one call that quantises. The caller must not write the input meanwhile.
void fp8_linear_keep_quantised(Backend& backend, bool on);

// Per-op timing (`sparrow bench --breakdown`). While on, every op of the backend records CUDA events
// around its work and its host wall time; take_op_profile synchronises, returns the sums per op
// (linear ops per weight format and shape, e.g. "linear fp8 1024x4096") sorted by GPU time, and
// forgets them. gpu_ms is the time between the op's first and last event on the default stream
// (launch gaps inside the op included); host_ms is the time the host spent in the op's call
// (launches, allocations, synchronising copies). Off by default; an op then pays one branch.
// An op name with a '/' ("moe/routed experts") is a part of the op before it, timed inside it:
// `part` is set, and a sum over the ops leaves it out.
struct OpTime {
  std::string op;
  bool part = false;
  int64_t calls = 0;
  double gpu_ms = 0, host_ms = 0;
};
void set_op_profiling(Backend& backend, bool on);
std::vector<OpTime> take_op_profile(Backend& backend);

// CUDA graphs for steps (Backend::begin_step; backends/cuda/step_graph.h): on by default, off with
// SPARROW_CUDA_DISABLE=graphs or this call; the same bits either way. The counters say how the
// backend's steps ran (eager, captured, through a kept graph updated in place, ...).
struct StepGraphStats {
  int64_t eager = 0;         // steps run op by op (not capturable, first of their token count, no free slot)
  int64_t captured = 0;      // steps captured and launched as graphs, one a segment
  int64_t segments = 0;      // graphs launched: of these,
  int64_t updated = 0;       // through a kept executable graph updated in place,
  int64_t instantiated = 0;  // as a new kept executable graph (a new shape, or an update refused),
  int64_t one_off = 0;       // run once and dropped (the capture used side memory or outgrew the staging)
};
void set_step_graphs(Backend& backend, bool on);
StepGraphStats step_graph_stats(Backend& backend);
// Whether this process's switches let steps be captured at all: the MoE planning on the device and
// grouping its experts (`moe_device_plan`, `grouped_moe`), stream-ordered allocations and uploads
// (`pool`, `async_upload`), no SPARROW_CUDA_SYNC. Where not, every step runs op by op.
bool step_capture_allowed();
// Each graph-run segment's GPU time, for diagnostics (`sparrow bench --model-step-segments`): while on, every
// segment's graph launch is bracketed by two events; step_segment_times waits for them, returns the
// segments launched since the last call in order, and forgets them. `driver_kernels` counts the
// kernel nodes launched through the driver API (cuBLASLt's), whose function the runtime cannot name;
// `fills` and `uploads` the memset and host-to-device copy nodes (none with copy_kernels, but for
// long-lived memory made during the step).
struct StepSegmentTime {
  int segment = 0;  // within its step (the model cuts after every layer; the head is the last)
  float ms = 0.0f;
  int nodes = 0, kernels = 0, driver_kernels = 0;
  int fills = 0, uploads = 0;  // memset nodes, host-to-device copy nodes
};
void set_step_segment_timing(Backend& backend, bool on);
std::vector<StepSegmentTime> step_segment_times(Backend& backend);
// Where a segment's time goes kernel by kernel (`sparrow bench --kernel-trace`): while on, each
// graph-run segment's kernels read the GPU's global timer (ns) around their griddepcontrol.wait
// (device_common.cuh), folded over each launch's blocks; kernel_trace waits for the segments
// launched since it was switched on, returns them in launch order and forgets them. A launch's
// records are in launch order (%gridid), one per kernel node when `complete`; `first_past_wait` is
// when the kernel before it had finished. Up to 256 segments are traced until the next call.
struct KernelTraceRecord {
  uint64_t grid = 0;
  uint64_t first_at_wait = 0, first_past_wait = 0, last_past_wait = 0;  // ns, the global timer's
  int64_t blocks = 0;
};
struct KernelTraceLaunch {
  int segment = 0;
  std::vector<std::string> kernels;         // the graph's kernel nodes' (mangled) names, in capture order
  std::vector<KernelTraceRecord> records;   // by grid id
  int64_t collisions = 0;                   // blocks that found their launch's slot taken (then not recorded)
  bool complete() const { return collisions == 0 && records.size() == kernels.size(); }
};
// Whether this build records them (-DSPARROW_KERNEL_TRACE=ON); without, set_kernel_trace(on) throws.
bool kernel_trace_compiled();
void set_kernel_trace(Backend& backend, bool on);
std::vector<KernelTraceLaunch> kernel_trace(Backend& backend);

// The fast profiles' FP8-stored linears (LinearParams::act_quant_fp8, 128x128 FP8 weights) through
// linear_fp8_block's tensor-core GEMM with one cuBLASLt algorithm per weight shape for every M
// (Fp8Linear::set_batch_invariant). On by default since its GPU run of 2026-12-01 showed the rows
// batch invariant (CudaFp8Linear.*BatchInvariant*); off with SPARROW_CUDA_DISABLE=fp8_gemm (or this call).
void set_fp8_gemm_in_linear(Backend& backend, bool on);
// Those linears on the project's wgmma kernels (kernels.h launch_fp8_wgmma_linear) instead of
// cuBLASLt: the W4A8 experts' arithmetic with e4m3 weights, K's quarters over up to 4 blocks at up
// to 64 rows (more blocks at batch 1), the TMA kernel's 128 x 128 tiles above, the same bits for
// any M. On by default since its GPU run of 2026-12-02 (batch-1 decode 4 % faster a layer, the
// 8-layer step 6 %; an 8K prefill 4-5 % slower: docs/perf.md); off with SPARROW_CUDA_DISABLE=fp8_wgmma.
void set_fp8_wgmma(Backend& backend, bool on);
// The fast profiles' bf16 GEMMs (wo_a's grouped one, the BF16 weights fed bf16 values: compressors,
// indexer head weights, gate, head) on the project's wgmma kernels (kernels.h
// launch_bf16_wgmma_linear) instead of cuBLASLt, where the shapes suit them (K a multiple of 64, a
// group's rows whole 128-row tiles): K's parts (16, or 4 from N = 8192) in separate blocks at up
// to 64 rows, 128 x 128 TMA tiles above, the same bits for any M. On unless SPARROW_CUDA_DISABLE=bf16_wgmma; whether the
// last bf16 GEMM ran on them.
void set_bf16_wgmma(Backend& backend, bool on);
bool bf16_linear_last_wgmma(Backend& backend);
// Whether that GEMM's kernel read its fp32 inputs itself (the decode form, up to 64 rows, once the
// weight's bf16 copy exists; on unless SPARROW_CUDA_DISABLE=bf16_f32_in), with no conversion pass.
bool bf16_linear_last_f32_in(Backend& backend);
// Whether it read an FP8 weight as stored, e4m3 codes made bf16 in the kernel (the decode form, block
// scales over whole 64 x 64 steps; on unless SPARROW_CUDA_DISABLE=bf16_fp8_w), not its bf16 copy.
bool bf16_linear_last_fp8_weights(Backend& backend);
// The routed MXFP4 experts under the reference numerics (fast, deepseek-ref) on the tensor cores
// (W4A8: kernels.h launch_grouped_w4a8). On by default since its GPU run of 2026-12-01; off with
// SPARROW_CUDA_DISABLE=w4a8 (or this call).
void set_w4a8_experts(Backend& backend, bool on);
// Whether those take the tiled W4A8 kernel when an expert averages 32 rows or more (on unless
// SPARROW_CUDA_DISABLE=w4a8_tiled); the same bits as the small kernel, which runs otherwise.
void set_w4a8_tiled(Backend& backend, bool on);
// Whether the W4A8 experts' swiglu, routing weight and act_quant run as one kernel (on unless
// SPARROW_CUDA_DISABLE=moe_fused_act); the same bits as the three kernels in turn.
void set_moe_fused_act(Backend& backend, bool on);
// Whether the MoE makes its input's FP8-rounded rows (ref numerics) only where a CUDA-core
// projection reads them (on unless SPARROW_CUDA_DISABLE=moe_x_lazy): the W4A8 experts and the shared
// expert's FP8 tensor-core GEMMs quantise the input themselves; the same bits either way.
// last_moe_x_rounded: whether the last MoE call made them.
void set_moe_x_lazy(Backend& backend, bool on);
bool last_moe_x_rounded(Backend& backend);
// Whether those run on wgmma, the FP8 tensor cores (kernels.h GroupedW4A8Args::wgmma), where every
// K is a multiple of 128 and the scales are packed e8m0 (on unless SPARROW_CUDA_DISABLE=w4a8_wgmma).
// Its decode and tiled kernels give the same bits as each other, not the mma.sync kernels' bits.
void set_w4a8_wgmma(Backend& backend, bool on);
// The expanded W4A8 form (kernels.h GroupedW4A8Args::expanded) for the tiled wgmma projections: 0
// (the default) where SPARROW_CUDA_ENABLE=w4a8_expand is set and the experts average kW4A8ExpandRows
// rows or more, 1 never, 2 always. The same bits any way. last_w4a8_expanded: whether the last moe
// call took it (test support).
void set_w4a8_expand(Backend& backend, int mode);
bool last_w4a8_expanded(Backend& backend);
// The tiled wgmma kernel's warpgroups a block (64 columns each): 1, 2 or 4; 0 (the default) takes
// SPARROW_CUDA_W4A8_WARPGROUPS's (1, 2 or 4; 4 when unset). The same bits any way.
void set_w4a8_wgmma_warpgroups(Backend& backend, int n);
// Whether the decode wgmma kernel splits K's quarters over blocks: 0 (the default) for 64 rows or
// fewer, 1 never, 2 always (over set_decode_quarter_blocks' blocks). The same bits either way.
void set_w4a8_wgmma_split(Backend& backend, int mode);
// The blocks the decode wgmma kernel (the W4A8 experts' and the FP8 linears' 8-row form) spreads
// K's quarters over where it splits them: 1, 2 or 4 (each block computing 4 / n quarters, each into
// its slice of the scratch, added in order after); 0 (the default) chooses by the grid's size
// (kernels_linear.cu decode_quarter_blocks). The same bits any way. Process-wide; defined with the
// kernels.
void set_decode_quarter_blocks(int n);
// Whether the tensor-core attention's 16-head blocks (from the bf16 copies) make a chunk's logits
// on 4 warps beside the chunk before's softmax and weighted sum on the other 12: 1 yes, -1 no, 0
// (the default) yes unless SPARROW_CUDA_DISABLE=attn_overlap. The same bits either way.
// Process-wide; defined with the kernels.
void set_attention_overlap(int n);
// The blocks a (token, 16 heads, split) of the tensor-core attention takes, each making the whole
// logits and softmax and the weighted sum of a slice of Dh: 1, 2 or 4; 0 (the default) the most of
// 4 and 2 that keeps the call's blocks within the SMs, or 1 with SPARROW_CUDA_DISABLE=attn_dims.
// The same bits any way. Process-wide; defined with the kernels. last_attention_dim_slices: the
// last tensor-core attention launch's, in any backend (1 where it ran 32-head blocks; not updated
// by the kernels without blocks of heads: check last_attention_tensor_cores first).
void set_attention_dim_slices(int n);
int last_attention_dim_slices();
// Whether the last tensor-core attention launch, in any backend, ran 64 heads a block on wgmma (the
// calls that do not go to 16-head blocks, from the bf16 copies, where H is a multiple of 64; off
// with SPARROW_CUDA_DISABLE=attn_wgmma). The same bits as the other forms. Defined with the kernels.
bool last_attention_wgmma();
// Whether that form issues a chunk's logits on the tensor cores before the chunk before's softmax:
// 1 yes, -1 no, 0 (the default) no unless SPARROW_CUDA_ENABLE=attn_wg_ahead. The same bits either
// way. Process-wide; defined with the kernels.
void set_attention_wg_ahead(int n);
// Whether that form takes two chunks of candidates a round, each warpgroup the whole logits of one
// (fewer barriers and no exchange of partial logits): 1 yes, -1 no, 0 (the default) yes unless
// SPARROW_CUDA_DISABLE=attn_wg_pair. The same bits either way; where on, set_attention_wg_ahead
// has no effect. Process-wide; defined with the kernels.
void set_attention_wg_pair(int n);
// The form the last such launch ran: 0 a chunk a round, 1 with the logits ahead, 2 two chunks a
// round (meaningful where last_attention_wgmma). Defined with the kernels.
int last_attention_wg_form();
// The W4A8 decode wgmma kernel's span: 1, 2 or 4 groups of 128 inputs a ring slot (a weight
// column's 64, 128 or 256 contiguous bytes a copy round); 0 (the default) takes
// SPARROW_CUDA_W4A8_SPAN's, else 2 with the producer warp (set_w4a8_decode_producer) and, without it,
// 2 where its blocks take all of K and 1 where K's quarters are spread over blocks (kernels_linear.cu
// w4a8_decode_span). The same bits any way. Process-wide; defined
// with the kernels.
void set_w4a8_decode_span(int n);
// The W4A8 decode wgmma kernel's rows a block: 8 (a plan item) or 16 (an item with an even tile
// index and the one after it); 0 (the default) takes SPARROW_CUDA_W4A8_ROWS's, else 8 with the
// producer warp (set_w4a8_decode_producer) and, without it, 16 where the experts average 6 rows or
// more (kernels_linear.cu w4a8_decode_rows). The same bits either way.
// Process-wide; defined with the kernels.
void set_w4a8_decode_rows(int n);
// The W4A8 prefill (tiled wgmma) kernel's raster: 1 a tile's column blocks one after another, -1 a
// column block's tiles; 0 (the default) takes SPARROW_CUDA_W4A8_COLS_FAST's (0 or 1, default 1).
// The same bits either way. Process-wide; defined with the kernels.
void set_w4a8_cols_fast(int n);
// The four-warpgroup W4A8 prefill kernel's ring: 1 handed over through mbarriers
// (grouped_w4a8_wgmma_kernel's kRing), its copy sources offset by the group number, 2 the same with
// its sources advanced a group at a time, 3 form 2 with each warpgroup's weights of a group by one
// bulk copy (form 2 where N % 64 != 0), 4 form 3 in a persistent grid (a block an SM taking tile
// after tile; form 3 where K has 3 groups of 128 or fewer), -1 a block barrier a group; 0 (the
// default) form 4, or 3 with SPARROW_CUDA_DISABLE=w4a8_persistent, 2 with
// SPARROW_CUDA_DISABLE=w4a8_ring_bulk, 1 with SPARROW_CUDA_W4A8_RING_ADVANCE=0, or the barrier with
// SPARROW_CUDA_DISABLE=w4a8_ring (each of the last three over w4a8_persistent). The same bits any
// way. Process-wide; defined with the kernels.
void set_w4a8_ring(int n);
// Ring form 4's grid: at most n blocks (n > 0; the tests make blocks take several tiles), or 0 one
// block an SM (the default). The same bits any way. Process-wide; defined with the kernels.
void set_w4a8_persistent_grid(int n);
// The FP8 and bf16 TMA kernels' raster: n > 0 their tiles in groups of n weight tiles, each token
// tile's group in a row (kernels_linear.cu tma_tile_at), 1 or -1 a weight tile's token tiles in a
// row; 0 (the default) takes SPARROW_CUDA_TMA_RASTER_GROUP's where set (1 to 64), else a choice by
// the activations' bytes a weight tile reads (tile_raster.h tma_raster_auto: groups of 8 past 24
// MiB). The same bits any way. Process-wide; defined with the kernels.
void set_tma_raster_group(int n);
// The FP8 TMA kernel's pair form (SPARROW_CUDA_ENABLE=fp8_pair: clusters of two blocks on weight
// tiles 2 n and 2 n + 1 of a token tile, each activation box copied once for both): n > 0 on, n < 0
// off, 0 (the default) as the environment says. The same bits any way. fp8_tma_pair_launches: the
// pair form's launches so far. Process-wide; defined with the kernels.
void set_fp8_tma_pair(int n);
int64_t fp8_tma_pair_launches();
// The W4A8 decode wgmma kernel's copies: 1 from a producer warp (kernels_linear.cu
// w4a8_decode_ws_kernel), -1 from all its threads (grouped_w4a8_wgmma_kernel); 0 (the default) the
// producer warp unless SPARROW_CUDA_DISABLE=w4a8_producer. The same bits either way. Process-wide;
// defined with the kernels.
void set_w4a8_decode_producer(int n);
// The small W4A8 kernel's width in m16 tiles of output columns: 1 or 2, 0 (the default) chooses by
// the batch (kernels.h w4a8_small_tiles). The same bits either way.
void set_w4a8_small_tiles(Backend& backend, int tiles);
// Whether the last indexer_topk scored on the tensor cores (IndexerTopkParams::bf16_operands, the
// keys' bf16 copies complete; SPARROW_CUDA_DISABLE=indexer_mma switches it off).
bool last_indexer_tensor_cores(Backend& backend);
// Whether the last attention ran on the tensor cores (AttentionParams::bf16_operands, 32 heads a
// block, Dh 128, 256 or 512; SPARROW_CUDA_DISABLE=attn_mma switches it off).
bool last_attention_tensor_cores(Backend& backend);
// Whether the tensor-core attention can take calls of H heads of Dh at all: its switches on
// (`attn_mma`, and `attn_split`, whose splits it computes in) and a form for the shape.
bool attention_tensor_cores_take(int64_t H, int64_t Dh);
// The launches (passes of tokens) the last attention took: its scratch (the split parts, or
// attention_kernel's logits and weights) stays within a cap, 256 MB by default;
// set_attention_scratch_cap(bytes) sets another (0: the default), for the tests. Process-wide. The
// same bits for every cap: a token's arithmetic does not depend on the others'.
int64_t last_attention_passes(Backend& backend);
void set_attention_scratch_cap(int64_t bytes);
// Whether it folded q's norm and rotation (AttentionParams::q_rope) into the tensor-core kernel.
bool last_attention_q_fold(Backend& backend);
// Whether it rotated its output back (AttentionParams::o_rope) in the tensor-core kernel's stores
// (`attn_o_fold`: every token one split, the 16- or 32-head blocks), not by the rope kernel after.
bool last_attention_o_fold(Backend& backend);
// Whether that attention read the bf16 copies of the KV state (the ring's copy, kept since the
// state was made; the entries', complete from the first; SPARROW_CUDA_DISABLE=attn_bf16_kv stops
// keeping them), and a switch for tests: off, the kernel converts the fp32 state (the same bits).
bool last_attention_bf16_kv(Backend& backend);
// Test support: whether the last attention call read the FP8 KV records (AttentionArgs::records).
bool last_attention_records(Backend& backend);
// Whether sequence states this backend creates from now on may keep their KV as FP8 KV records
// (LayerState::ring_rec, CompressorBuffer::entries_rec; the states' records are then chosen by the
// first calls whose rows are record values): off by default (slower in the attention, kernels.h
// cuda_feature_enabled), on with SPARROW_CUDA_ENABLE=kv_record or here.
void set_kv_records(Backend& backend, bool on);
bool kv_records(Backend& backend);
// Whether Backend::hc_boundary runs as one kernel where launch_hc_boundary takes the call (kernels.h
// hc_boundary_fits): on by default, off with SPARROW_CUDA_DISABLE=hc_fused or here; and whether the
// last hc_boundary call did (test support).
void set_hc_fused(Backend& backend, bool on);
bool hc_fused(Backend& backend);
// Whether a split decode GEMM's parts are added by the kernel that reads its output where the op
// runs both (kernels.h PartsView: the stacked linears' split_cols, the router, the experts' fused
// activation and scatter, the shared expert's swiglu_sim and the combine), instead of a
// parts_sum_kernel launch between them: on by default, off with SPARROW_CUDA_DISABLE=parts_in_readers
// or here; the same bits either way. parts_left_for_readers counts the outputs read that way since
// the backend was made (test support).
void set_parts_in_readers(Backend& backend, bool on);
int64_t parts_left_for_readers(Backend& backend);
// The fast FP8 linears' act_quant launches since the backend was made (test support: linears() of
// one input quantises it once, `act_quant_shared`).
int64_t fp8_linear_quantisations(Backend& backend);
// Test support: the FP8 wgmma linears' 8-row form quantising its rows itself where it can
// (`fp8_quant_in`, Fp8Linear::set_quant_in) or after an act_quant launch; the same bits either way.
void fp8_linear_set_quant_in(Backend& backend, bool on);
bool last_hc_boundary_fused(Backend& backend);
// Test support: whether the last moe call's w2 stored its rows straight into their slots
// (GroupedW4A8Args::scatter_slots, `moe_scatter_store`) instead of leaving them to the scatter kernel.
bool last_moe_scatter_store(Backend& backend);
// Whether the MoE runs its shared expert on a second stream beside the routed experts, in calls of
// up to 64 tokens (on unless SPARROW_CUDA_DISABLE=moe_shared_beside, or this call): forked from the
// default stream before the routed experts, joined before the combine, not while ops are profiled.
// The same kernels on the same inputs, so the same bits. last_moe_shared_beside: whether the last
// moe call did.
void set_moe_shared_beside(Backend& backend, bool on);
bool last_moe_shared_beside(Backend& backend);
// Test support: the tensor-core attention's heads a block (AttentionArgs::block_heads): 16, 32, 64
// (the wgmma form, from the bf16 copies where H takes it), or 0 (the default: by the call's size).
void set_attention_block_heads(Backend& backend, int heads);
void set_attention_bf16_kv(Backend& backend, bool on);
// That scorer's tiles of 128 entries a block: 1 to 32, 0 (the default) chooses by the grid's size.
// The same bits either way (test support).
void set_indexer_mma_tiles(Backend& backend, int tiles);
// Whether SPARROW_CUDA_DISABLE leaves the switchable path `name` on (the list: kernels.h).
bool cuda_feature_on(const char* name);
bool cuda_feature_enabled(const char* name);
// Whether the comma-separated names of SPARROW_CUDA_DISABLE (`disable`) and SPARROW_CUDA_ENABLE
// (`enable`) are all this build's switches and opt-ins (null: none): else invalid_argument naming
// the first that is not, and what it may be instead. make_cuda_backend refuses to start on that.
Status check_feature_names(const char* disable, const char* enable);

// Test support: whether the last `linear` or `grouped_linear` call ran the vectorized kernel of the fast profiles
// (kernels.h, LinearArgs::vectorized) rather than the element-wise one.
bool last_linear_vectorized(Backend& backend);
// Test support: whether it ran on the tensor cores (fp8_gemm's cuBLASLt FP8 GEMM for `linear`,
// bf16_gemm's bf16 GEMM for `grouped_linear`).
bool last_linear_tensor_cores(Backend& backend);

// Test support: the activation quantisation kernel of linear_fp8_block run on host rows [n, K] of
// `dtype` (F32 or BF16) values, padded to rows_pad rows and k_pad = K rounded up to 128 columns.
// codes [rows_pad, k_pad] and scales [k_pad / 128, rows_pad] as the GEMM reads them (kernels.h
// ActQuantFp8Args). REQUIRES a CUDA backend was created (the device is selected).
struct ActQuantFp8Rows {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t rows_pad = 0, k_pad = 0;
};
ActQuantFp8Rows act_quant_fp8_rows(const void* rows, DType dtype, int64_t n, int64_t K, int64_t rows_pad,
                                   bool w4a8_order = false);

}  // namespace cuda
}  // namespace sparrow
