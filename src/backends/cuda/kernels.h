// Launchers of the CUDA backend's kernels: plain structs of device pointers and sizes, one struct
// per kernel, so the host side (cuda_backend.cpp, compiled by the C++ compiler) never sees CUDA
// syntax and each .cu file holds a few simple kernels.
//
// Every launcher enqueues on the legacy default stream and returns at once; launch errors are
// checked by the caller (cuda_check.h). Arithmetic is fp32 everywhere except RoPE angles (fp64: a
// position times a frequency loses its fraction in fp32 at long contexts). Shape comments use the
// project's letters (T tokens, D hidden, H heads, Dh head dim, E experts, K slots, S streams).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/kv_record.h"
#include "core/quant_sim.h"
#include "core/tensor.h"

namespace sparrow::cuda {

// Kernel timestamps inside captured steps (StepGraphs::set_kernel_trace, device_common.cuh's
// wait_previous_grid): a region of kKernelTraceSlots slots filled with 0xff bytes; slot 0's `blocks`
// counts blocks that found their slot taken by another launch, slot 1 + gridid % (kKernelTraceSlots
// - 1) holds a launch's global-timer readings (ns) folded over its blocks.
constexpr int kKernelTraceSlots = 512;
struct KernelTraceSlot {
  uint64_t grid;                    // %gridid, ~0 while unused
  uint64_t first_at_wait;           // the earliest block's reading before griddepcontrol.wait
  uint64_t first_past_wait;         // the earliest after it: the previous grid had finished
  uint64_t last_past_wait_inverted; // ~ the latest after it (a minimum, as the fill is 0xff)
  uint64_t blocks;                  // the fill plus one a block: n blocks leave n - 1 (it wraps)
};
// Points every kernel translation unit's trace region at `region` (null: off), in stream order on
// the calling thread's default stream.
void set_kernel_trace(KernelTraceSlot* region);

// Limits of the simple kernels, checked on the host before a launch.
inline constexpr int kMaxStreams = 8;       // S (mHC): per-thread stream registers, mix <= (2+S)*S
inline constexpr int kMaxRopePairs = 64;    // rope_dim / 2, passed by value in RopeTableArg
inline constexpr int kMaxRouterTopk = 64;   // K of the router

// Whether p is 16-byte aligned (the vectorised kernels' 16-byte loads and stores).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// Whether a pass whose rows are n values can take four of them a thread through 16-byte loads and
// stores: n a multiple of 4 and every array 16-byte aligned (a null one, an absent operand, skipped).
template <typename... P>
inline bool four_wide(int64_t n, const P*... arrays) {
  return n % 4 == 0 && (... && (arrays == nullptr || aligned16(arrays)));
}

// A GEMM's output as the kernel after it reads it. A split decode GEMM (K's parts in blocks of
// their own, each part's sums into its own slice) may leave its parts for that reader instead of
// a parts_sum_kernel launch (`parts_in_readers`): value i is then
// (((data[i] + data[stride + i]) + data[2 stride + i]) + ...) over `parts` slices, rounded to bf16
// when `round`: the sum's own operations in its order (dev_parts_at, device_common.cuh), so the same
// bits. A summed output is the one-slice view of itself (the implicit conversion).
struct PartsView {
  const float* data = nullptr;
  int64_t stride = 0;  // floats from one slice to the next
  int parts = 1;
  bool round = false;
  PartsView() = default;
  PartsView(const float* summed) : data(summed) {}  // NOLINT(google-explicit-constructor)
  PartsView(const float* slices, int64_t slice_stride, int n, bool round_bf16)
      : data(slices), stride(slice_stride), parts(n), round(round_bf16) {}
  // The view of the values from `offset` on (the same slices, each advanced).
  PartsView from(int64_t offset) const { return {data + offset, stride, parts, round}; }
  bool summed() const { return parts == 1 && !round; }
};
// Whether four neighbouring values can be read through 16-byte loads (dev_parts_at4).
inline bool parts_view_four_wide(const PartsView& v) { return aligned16(v.data) && (v.parts == 1 || v.stride % 4 == 0); }

// A float/index tensor in device memory, decoded by its stored dtype.
struct DevView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// A logical [out, in] weight matrix in its checkpoint format, in device memory (see WeightMatrix).
// The newer fast paths can be switched off at run time, to tell which one a wrong result comes
// from: SPARROW_CUDA_DISABLE is a comma-separated list of "vec_linear" (the vectorized linear
// kernel), "indexer_fast" (the shared-memory scorer and radix-select top-k), "grouped_moe" (the
// experts in one launch per projection), "moe_device_plan" (their grouping planned on the device,
// without downloading the expert choices), "attn_warp" (a warp per attention logit), "pool"
// (cudaMalloc/cudaFree instead of the stream-ordered pool), "async_upload" (synchronous
// cudaMemcpy for small uploads), "hc_split" (mHC's mix dot products in one block per token
// instead of tiles of tokens x mixes over many blocks), "compressor_parallel" (the compressors' entries one block
// each instead of one block walking each sequence), "attn_split" (flash-decoding attention: the candidates
// split over blocks), "w4a8" (the routed MXFP4 experts on the tensor cores), "w4a8_tiled" (their
// shared-memory tiled kernel for many rows an expert), "w4a8_wgmma" (their kernels on the FP8
// wgmma instead of the f16 mma.sync), "indexer_tiled" (the indexer's scores from
// register tiles of 4 heads x 8 entries a thread), "indexer_mma" (the fast profile's scores on the
// bf16 tensor cores, from a bf16 copy of the keys), "attn_mma" (the fast profiles' attention on the
// bf16 tensor cores), "attn_bf16_kv" (that attention reading bf16 copies of the KV state rather
// than converting the fp32 state), "sim_warp" (the fp8 / fp4 block roundings of quant_sim and the
// entry and MoE input passes a warp a scale block instead of a thread a block), "hc_staged" (the
// hc mix of 16 or more tokens through a shared-memory ring where its weights are f32), "hc_pre4" (the rest of hc_pre for S =
// 4 in blocks of 1-8 tokens), "norm_regs" (rms_norm rows in registers for calls of at most 2^23
// values), "moe_fused_act" (the W4A8 experts' SwiGLU, routing weight and act_quant in one kernel;
// each of these four gives the same bits as the path it replaces), "fp8_gemm" (the
// fast profiles' FP8 linears on cuBLASLt), "bf16_gemm" (their grouped wo_a and the BF16 weights
// fed bf16 values as bf16 cuBLASLt GEMMs), "graphs" (a step's ops captured and launched as a CUDA
// graph, step_graph.h; the same bits), "fp8_stack" (linears of one input as one GEMM over their
// stacked weights), "fp8_wgmma" (the batch-invariant FP8 linears on the project's wgmma kernels
// instead of cuBLASLt), "fp8_tma" (their TMA kernel above 64 rows; off: the 64-row tiles, the same
// bits), "bf16_wgmma" (the bf16 GEMMs of bf16_gemm on the project's wgmma kernels instead of
// cuBLASLt), "bf16_tma" (their TMA kernel above 64 rows; off: the 8-row kernel in 64-row chunks, the
// same bits), "graph_update" (kept graphs updated in place; off: every
// capture instantiated, run once and dropped), "argmax" (Backend::argmax_rows on the device; off:
// through the host, the same ids), "w4a8_pair" (the routed experts' w1 and w3 in one launch of the
// decode wgmma kernel; off: a launch each, the same bits), "pdl" (every kernel launched as a
// programmatic dependent of the one before it, device_common.cuh launch(); off: plain launches, the
// same bits), "fused_round" (an op's bf16 rounding of a tensor-core GEMM's or the MoE combine's
// outputs done in the kernel that writes them, the parts' sum, the combine or the unsplit TMA GEMMs' store; off: a bf16_round
// pass after, the same bits), "scratch_nofill" (ops' scratch buffers that kernels write whole left
// unfilled, DeviceBuffer::scratch; off: zero-filled as before), "copy_kernels" (a captured step's own
// fills and host uploads as kernels, launch_fill_bytes / launch_upload_pinned; off: memset and copy
// nodes, the same bytes), "swiglu_sim" (an FFN's SwiGLU, routing-weight rounding and fp8 rounding
// before w2 in one kernel, launch_swiglu_sim_fp8; off: three passes, the same bits), "w4a8_early"
// (the routed experts' decode kernel reads its plan and copies its first weight stages before its
// wait for the previous grid, GroupedW4A8Args::plan_early; off: after it, the same bits),
// "bf16_f32_in" (the bf16 GEMMs' decode form reads fp32 inputs and rounds them itself,
// Bf16LinearArgs::x_f32; off: a conversion pass before it, the same bits), "bf16_fp8_w" (that
// form reads FP8 weights as stored and makes them bf16 in registers, Bf16LinearArgs::w8; off: their
// bf16 copy, the same bits), "attn_q_fold" (q's per-head norm and RoPE, AttentionParams::q_rope, done
// by the tensor-core attention as it stages q, AttentionArgs::q_prep; off: the rms_norm and rope
// kernels first, the same bits), "attn_o_fold" (the output's inverse RoPE, AttentionParams::o_rope,
// done by the tensor-core attention's 16- and 32-head blocks in their stores where every token is one
// split, AttentionArgs::o_rope; off: the rope kernel after, the same bits), "attn_narrow" (the tensor-core attention on blocks of 16 heads and 16
// warps when a call has fewer blocks than SMs; off: 32 heads and 8 warps, the same bits),
// "router_warp" (the scored router's top-k by a warp's argmax rounds; off: a rank count a thread,
// the same experts), "rope_spread" (rope at decode sizes over blocks of 8 heads; off: a block a
// token, the same bits), "hc_fused" (Backend::hc_boundary at decode sizes in one kernel,
// launch_hc_boundary; off: the hc_post, hc_pre and rms_norm kernels, the same bits; on: the
// graph segments of the batch-1 step 1.5-2 % shorter on the H200, 2026-12-03), "select_rank" (the
// indexer's top-k of a small call by rank counting over many blocks, indexer_rank_select_fits,
// instead of the radix kernel's one block a token: the same slots and logits; the batch-1 step's
// graph segments 1.7-1.8 % shorter on the H200, 2026-12-03; its grid and shared memory follow the
// row length rounded up to a power of two, so a captured CSA layer's graph keeps its shape until
// the row doubles), "w4a8_producer" (the routed experts' decode kernel with a producer warp issuing
// its copies, w4a8_decode_ws_kernel, at 8 rows a block and 2-group slots; off: the block-wide
// kernel and its rows and spans, the same bits), "attn_overlap" (the tensor-core attention's 16-head
// blocks from the bf16 copies make a chunk's logits on 4 warps beside the chunk before's softmax and
// weighted sum on the other 12; off: the three phases one after the other on every warp, the same
// bits), "parts_in_readers" (a split decode GEMM's parts added by the kernel reading its output
// where one op runs both, PartsView; off: a parts_sum_kernel launch between them, the same bits),
// "attn_dims" (a call of few 16-head blocks spread over 2 or 4 times the blocks, each with the
// whole logits and softmax and a slice of the weighted sum's dims, the grid's z; off:
// one block a (token, 16 heads, split), the same bits), "moe_x_lazy" (the MoE's FP8-rounded input
// rows made only where a CUDA-core projection reads them, cuda_backend.cpp moe; off: always first,
// the same bits), "act_quant_shared" (FP8 linears of one input that linears() does not stack, a
// CSA layer's wq_b and indexer wq_b, quantise it once, Fp8Linear::keep_quantised; off: once each,
// the same bits), "attn_wgmma" (the tensor-core attention's calls that do not go to 16-head
// blocks, from the bf16 copies where H is a multiple of 64, on attention_wg_kernel: 64 heads of a
// token a block on wgmma; off: 32-head blocks, the same bits), "attn_wg_pair" (that form two
// chunks of 32 candidates a round, each warpgroup the whole logits, weights and exp-sum of one, so
// no exchange of partial logits and three barriers a round rather than eight; off: a chunk a round,
// its logits' k16 steps shared between the warpgroups; the same bits), "act_quant_half" (act_quant's calls
// of 2^15 pairs or more a half-warp a pair, 8 values a lane; off: a warp a pair, four pairs a warp
// from 2^17, the same codes and scales), "moe_scatter_store" (the MoE's w2 on the wgmma W4A8
// kernels, where a block sums all of K, writes each row's outputs straight into the combine's
// slots; off: into rows of their own, then expert_scatter_kernel copies them there; the same bits),
// "w4a8_ring" (the four-warpgroup W4A8 prefill kernel's ring handed over through mbarriers, each
// warp a few groups apart from the others; off: a block barrier a group, the same bits),
// "w4a8_ring_bulk" (that ring's weights, each warpgroup's 4 KB of a group, by one bulk copy; off:
// every thread's two 16-byte cp.async pieces, the same bits), "w4a8_persistent" (that ring in a
// persistent grid, ring form 4: a block an SM taking tile after tile, the next tile's first copies
// under the current one's last groups; off: a block a tile, ring form 3; the same bits, the same
// time within the spread on an H100, 2026-12-06: docs/perf.md, fifty-fifth session), "fp8_quant_in"
// (the FP8 wgmma linears' 8-row form quantises its rows itself in each block where
// fp8_wgmma_quant_in_takes, GroupedW4A8Args::x_f32; off: an act_quant launch first, the same codes,
// scales and bits), "moe_shared_beside" (the MoE's shared expert, in calls of up to 64 tokens, on
// a second stream beside the routed experts, forked before them and joined before the combine; off:
// after them on the one stream, the same kernels and bits) and
// "alloc_nofill" (tensors left unfilled at allocation; off: zero-filled). Read once per process.
bool cuda_feature_on(const char* name);
// SPARROW_CUDA_ENABLE, the same form, opts in to paths that are off by default: "kv_record" (under
// the fast profiles the window ring and the compressed KV kept as 584-byte FP8 KV records only, read
// and decoded by the tensor-core attention: 5.3x less KV memory, the same bits, but the decode in
// the attention's chunk loop made the batch-1 step 4 % and a 256 x 32K layer 3-4 % slower on the
// H200, 2026-12-03), "attn_wg_ahead" (attention_wg_kernel issues a chunk's logits before the
// chunk before's softmax: the same bits, slower on the H200, 2026-12-05) and "w4a8_expand" (the
// routed experts' tiled projections, where the experts average kW4A8ExpandRows rows or more, on the
// expanded form: each expert's MXFP4 weights written once as e5m2 bytes, then the FP8 TMA kernel's
// tiles, GroupedW4A8Args::expanded; the same bits, an SWA layer's 8K prefill 4.5-5 % slower on an
// H100, 2026-12-06: docs/perf.md, fiftieth session) and "fp8_pair" (the FP8 TMA kernel's unsplit tiles
// of an even number of weight tiles in clusters of two blocks that share each activation box, copied
// once from L2 for both: fp8_linear_tma_kernel's kPair; the same bits). Read once per process. A name in either
// variable that is not one of these lists (cuda_backend.cpp kCudaSwitches, kCudaOptIns) makes
// make_cuda_backend refuse to start.
bool cuda_feature_enabled(const char* name);
// The integer in environment variable `var` (a tuning knob; the caller keeps it for the process):
// `fallback` when unset or empty; a value that is not a whole decimal integer, or that `ok`
// refuses, throws std::runtime_error naming the variable, the value and `rule`.
int64_t cuda_env_int(const char* var, int64_t fallback, bool (*ok)(int64_t), const char* rule);
// A launch-cost probe's count (SPARROW_CUDA_REPEAT_PARTS_SUM, SPARROW_CUDA_REPEAT_ACT_QUANT,
// SPARROW_CUDA_REPEAT_UPLOAD; docs/cuda.md): the extra launches, 0 to 8 (0 when unset), of a kernel
// (or copy) whose launches each write the same values; through cuda_env_int, so a bad value stops
// the run naming the variable.
int cuda_probe_repeats(const char* var);

struct DevWeight {
  WeightFormat format = WeightFormat::kFloat;
  int64_t out = 0, in = 0;
  const void* data = nullptr;
  DType dtype = DType::kF32;       // of data (float formats)
  const void* scale = nullptr;
  DType scale_dtype = DType::kF8E8M0;
  int64_t scale_cols = 0;
  int64_t block_out = 1, block_in = 1;
  bool fp4_tiled = false;  // (MXFP4) the rows in fp4_layout.h's tiled order (fp4_tiles)
  // (MXFP4, the W4A8 wgmma kernels) each row's largest e8m0 scale byte over its K / 32 blocks, [out]:
  // the exponent the kernels' e5m2 tables are relative to (kernels_linear.cu w4a8_e5m2_table).
  const uint8_t* row_emax = nullptr;
};

struct RopeTableArg {
  int pairs = 0;
  double inv_freq[kMaxRopePairs] = {};
};

// ---- norms, mHC, embedding, RoPE, window (kernels_basic.cu) -------------------------------------

struct EmbedArgs {
  float* out;             // [T, S, D]
  const int32_t* ids;     // [T]
  DevWeight table;        // [V, D]
  int64_t T, S, D;
};
void launch_embed(const EmbedArgs& a);

struct HcPreArgs {
  float* out_input;       // [T, D]
  float* out_post;        // [T, S]
  float* out_comb;        // [T, S, S]
  const float* streams;   // [T, S, D]
  DevView fn, base, scale;
  int64_t T, S, D;
  int64_t sinkhorn_iters;
  float hc_eps, norm_eps;
  // [T, (2 + S) * S] scratch, or null: set, the mix dot products run in tiles of tokens x mixes
  // over many blocks before the per-token kernel (same bits); null, each token's block makes them
  // in turn.
  float* mix = nullptr;
  bool round_bf16 = false;  // out_input stored rounded to bf16
};
// launch_hc_pre_mix makes the mix values into a.mix (nothing when it is null), launch_hc_pre the
// rest (the mix values made per token when a.mix is null); hc_pre is both, in that order.
void launch_hc_pre_mix(const HcPreArgs& a);
void launch_hc_pre(const HcPreArgs& a);

struct HcPostArgs {
  float* streams;         // [T, S, D] in/out
  const float* sublayer;  // [T, D]
  const float* post;      // [T, S]
  const float* comb;      // [T, S, S]
  int64_t T, S, D;
  bool round_bf16 = false;  // the streams stored rounded to bf16
};
void launch_hc_post(const HcPostArgs& a);

// The mHC boundary of Backend::hc_boundary in one kernel: the sub-layer before's hc_post (when
// `sublayer` is set), hc_pre with its mix and Sinkhorn, and the RMS norm of u, each value with the
// bits launch_hc_post, launch_hc_pre_mix / launch_hc_pre and launch_rms_norm give it (so a step's
// bits do not depend on whether it ran here). Where hc_boundary_fits says so.
struct HcBoundaryArgs {
  HcPreArgs pre;               // pre.mix: [T, (2 + S) * S] scratch, required; pre.round_bf16 unused
  const float* sublayer;       // [T, D] the sub-layer before's output, or null: no hc_post
  const float* post;           // [T, S]    its post and comb (HcPostArgs)
  const float* comb;           // [T, S, S]
  DevView norm_weight;         // [D], data null for the unweighted norm
  float norm_eps = 0.0f;
  bool round_bf16 = false;     // the new streams, u and the norm's output each rounded to bf16
  unsigned* arrivals;          // [T] counters, zero before a call and left zero after it
};
// At most this many tokens a call (the arrival counters a backend keeps).
constexpr int64_t kHcBoundaryMaxTokens = 16;
// The calls launch_hc_boundary takes: S = 4, D = 4096 (V4-Flash) or 512, 1 <= T <=
// kHcBoundaryMaxTokens, the mix weights (fn, base, scale) f32, the norm's f32 or bf16 (pass kF32
// for an unweighted norm). The caller also needs one rounding flag for all three ops.
bool hc_boundary_fits(int64_t T, int64_t S, int64_t D, bool f32_mix_weights, DType norm_weight);
// The same from the call's weights (fn, base, scale; the norm's, data null for none): the one place
// the backend's choice and the launch's check derive the dtype conditions.
bool hc_boundary_fits(int64_t T, int64_t S, int64_t D, const DevView& fn, const DevView& base, const DevView& scale,
                      const DevView& norm_weight);
void launch_hc_boundary(const HcBoundaryArgs& a);

struct HcHeadArgs {
  float* out;             // [T, D]
  const float* streams;   // [T, S, D]
  DevView fn, base, scale;
  int64_t T, S, D;
  float hc_eps, norm_eps;
  float* mix = nullptr;   // [T, S] scratch, or null (as HcPreArgs::mix)
  bool round_bf16 = false;  // out stored rounded to bf16
};
void launch_hc_head(const HcHeadArgs& a);

struct RmsNormArgs {
  float* out;             // [T, N] (may alias in)
  const float* in;        // [T, N]
  DevView weight;         // [group], data null for the unweighted norm
  int64_t rows;           // T * N / group
  int64_t group;
  float eps;
  bool round_bf16 = false;  // outputs rounded to bf16 (launch_bf16_round's rounding, fused)
};
// A block a row; groups of at most 2048 a warp a row (each row's sums in a fixed order either way,
// whatever the number of rows).
void launch_rms_norm(const RmsNormArgs& a);

struct RopeArgs {
  float* x;                   // [T, n, width]
  const int64_t* positions;   // [T]
  int64_t T, n, width;
  RopeTableArg table;
  bool inverse;
  bool round_bf16 = false;  // the rotated dims stored rounded to bf16 (RopeParams::round_bf16)
};
void launch_rope(const RopeArgs& a);

struct WindowAppendArgs {
  float* const* dst;      // [T] ring slot of each token, null: skip (overwritten later in the batch)
  const float* kv;        // [T, Dh]
  int64_t T, Dh;
  uint16_t* const* dst_bf16 = nullptr;  // [T] the slot in the ring's bf16 copy (null with dst), or null
};
void launch_window_append(const WindowAppendArgs& a);

// out[i, :] = in[rows[i], :] for i < n, rows of `width` floats (Backend::gather_rows).
void launch_gather_rows(float* out, const float* in, const int64_t* rows, int64_t n, int64_t width);
// out[r] = argmax_first of row r (core/argmax.h) of `rows` rows of `width` floats, 0 < width < 2^31
// (Backend::argmax_rows).
void launch_argmax_rows(int32_t* out, const float* in, int64_t rows, int64_t width);
// out[i] = in[i], i < n (device ids into the batch's buffer: a kernel, so a kept graph updates its
// pointers).
void launch_copy_i32(int32_t* out, const int32_t* in, int64_t n);
// A captured step's fills and uploads as kernel nodes (a memset or copy node between two kernels
// cuts their programmatic edge; cuda_backend.cpp fill_device, host_to_device): bytes [p, p + bytes)
// set to `byte`; `bytes` bytes copied from pinned, device-mapped host memory `src` (16-byte aligned)
// to `dst`, the source read before the wait for the previous grid.
void launch_fill_bytes(void* p, uint8_t byte, int64_t bytes);
void launch_upload_pinned(void* dst, const void* src, int64_t bytes);

// ---- linear layers (kernels_linear.cu) ----------------------------------------------------------

// out[t, n] = sum_k W[n, k] * in[row(t), g(n)*K + k], row(t) = in_rows ? in_rows[t] : t,
// g(n) = n / rows_per_group (grouped projection; rows_per_group = N for a plain linear).
struct LinearArgs {
  float* out;                 // [T, N]
  const float* in;            // [*, in_stride]
  const int32_t* in_rows;     // [T] or null
  DevWeight w;                // [N, K]
  int64_t T;
  int64_t in_stride;
  int64_t rows_per_group;
  // The fast profiles' kernel (fast, deepseek-ref): FP8-block and packed-FP4 weights read 16 bytes
  // per lane, each chunk's partial sum scaled once. A different summation order from the fp32
  // profile's kernel, the same for every token of any batch (batch invariant). Taken only where
  // linear_vectorizable says so; otherwise the element-wise kernel runs.
  bool vectorized = false;
};
// Returns whether the vectorized kernel ran.
bool launch_linear(const LinearArgs& a);
// Rows of a grouped-expert work item: the linear kernels' token tile, which the W4A8 kernel's m16
// fragments also hold (rows 8..15 unused). The plans (device and host) cut each expert's rows by it.
inline constexpr int64_t kMoeTileRows = 8;
// The MoE's grouping planned on the device (no download of the expert choices): from experts
// [T, K] (each in [0, E)), rows grouped by expert in (token, slot) order as the host plan does:
// offsets [E + 1], rows [T*K] (token of each grouped row), slots [T*K] (t*K + i), and the work
// items of the grouped projections, one per (expert with rows, tile of 8 rows): items [2 * max_items]
// (expert, first row of the tile within the expert), n_items [1]; counts [E] is scratch the caller
// zero-fills. An expert id out of range traps.
struct MoePlanArgs {
  const int32_t* experts;
  int64_t T, K, E;
  int64_t* offsets;
  int32_t* rows;
  int32_t* slots;
  int32_t* items;
  int32_t* n_items;
  int64_t max_items;  // a bound on the items: T*K / 8 + min(E, T*K) + 1 (cuda_backend.cpp)
  int32_t* counts;    // [E] scratch, zero on entry unless moe_plan_counts_unfilled(T * K)
};
void launch_moe_plan(const MoePlanArgs& a);
// Whether launch_moe_plan's count kernel runs one block for this many choices (T * K), which stores
// every count: MoePlanArgs::counts then need not be zeroed.
bool moe_plan_counts_unfilled(int64_t choices);

// The routed experts of one MoE call in one launch, over a plan (launch_moe_plan, or the same
// built on the host): grid x = max_items work items (blocks past *n_items leave); item (e, t0)
// computes rows t0 .. t0+7 of expert e's rows offsets[e] .. offsets[e+1]-1 of out ([T*K, N]) from
// the input rows in_rows[r] (gathered) or, when in_rows is null, rows r of in. Each tile exactly as
// launch_linear would compute it for that expert alone (the same bits). w: device array of all E
// experts' weights, [N, K] in one format; vectorized: the caller checked linear_vectorizable.
struct GroupedExpertLinearArgs {
  float* out;
  const float* in;
  const int32_t* in_rows;    // [T*K] or null
  const DevWeight* w;        // [E]
  const int64_t* offsets;    // [E + 1]
  const int32_t* items;      // [2 * max_items]
  const int32_t* n_items;
  int64_t max_items, N, in_stride;
  WeightFormat format;
  bool vectorized;
};
void launch_grouped_expert_linear(const GroupedExpertLinearArgs& g);

// W4A8 on the tensor cores, over the same plan: out[r, n] = sum_k x_q[row(r), k] W[e][n, k] for the
// rows r of each item's tile, where x_q = e4m3 codes x per-(row, 128-block) scales (act_quant_fp8,
// bit for bit the CPU's) and W = packed MXFP4 (e2m1 x e8m0 per 32 inputs). Both operands become f16
// exactly (e2m1 times 2^-14, which the weight scale takes back) and each 32-input block is two
// mma.sync.m16n8k16 steps; the block sums are scaled by the weight scales and the 128-input group's
// sum by the activation scale, in an order fixed by K alone (kernels_linear.cu). Grid (max_items,
// ceil(N / 32)): a block computes 32 output columns of one tile of 8 rows, its 4 warps each a quarter
// of K, summed in warp order. `tiled` (for many rows an expert, e.g. prefill): grid (max_tiles,
// ceil(N / 128)), a block per 64-row tile of an expert x 128 columns, each output the same
// arithmetic, so the same bits.
// REQUIRES w[e] packed FP4 with block_in 32, K % 32 == 0, N and K < 2^30.
inline constexpr int64_t kW4A8TileRows = 64;      // rows of the tiled kernel's tile
inline constexpr int64_t kW4A8TmaTileRows = 128;  // rows of the expanded form's TMA tile
// A bound on the experts' tiles of `tile_rows` rows, the sum over experts of ceil(R_e / tile_rows),
// for `rows` rows over `experts` experts: rows / tile_rows + min(experts, rows) + 1.
inline int64_t w4a8_tile_bound(int64_t rows, int64_t experts, int64_t tile_rows) {
  return rows / tile_rows + std::min(experts, rows) + 1;
}
struct GroupedW4A8Args {
  float* out;                // [offsets[E], N]
  const uint8_t* codes;      // [rows_pad, k_pad] e4m3 (launch_act_quant_fp8's layout)
  const float* scales;       // [k_pad / 128, rows_pad]
  int64_t rows_pad, k_pad;
  const int32_t* in_rows;    // codes row of each grouped row, or null (the grouped row itself)
  const DevWeight* w;        // [E]
  const int64_t* offsets;    // [E + 1]
  const int32_t* items;      // [2 * max_items]
  const int32_t* n_items;
  int64_t max_items, N, K;
  bool tiled = false;
  int64_t experts = 0;    // E (tiled)
  int64_t max_tiles = 0;  // (tiled) a bound on the tiles, sum over experts of ceil(R_e / kW4A8TileRows)
  // (small kernel) m16 tiles of output columns a block, 1 or 2; 0 chooses (w4a8_small_tiles). The
  // outputs are the same bits either way (test support).
  int small_tiles = 0;
  // The wgmma kernels (kernels_linear.cu): 64 columns x 8 rows (decode items) or x 64 rows (tiled)
  // a block on the FP8 tensor cores, each output's arithmetic the same in both: per group of 128
  // inputs one wgmma sum (the block scales folded into the weights relative to the weight row's
  // largest, DevWeight::row_emax), acc = fma(d, sa, acc) group by group within each quarter of the
  // groups (w4a8_quarter), the quarters added in order, and the sum times 2^(row_emax - 140) where it
  // is stored. REQUIRES K % 128 == 0, every expert's scales packed e8m0 (scale_cols % 4 == 0) and
  // 4-byte aligned, its row_emax, the codes in ActQuantFp8Args::w4a8_order.
  bool wgmma = false;
  // (tiled wgmma kernel; set by its launch) grid x the column blocks and y the tiles, not the other
  // way round (kernels_linear.cu w4a8_cols_fast). The same bits either way.
  bool cols_fast = false;
  // (tiled wgmma kernel) warpgroups a block, 1, 2 or 4 (64 columns each); 0 chooses. The outputs are
  // the same bits any way (test support).
  int wgmma_warpgroups = 0;
  // (decode wgmma kernel) scratch [4, rows_total, N] fp32, or null: when given, K's four quarters
  // may run in 2 or 4 blocks (decode_quarter_blocks: more blocks for small batches), each into its
  // slice, and a second kernel adds them in order; the same bits any way. rows_total = offsets[E].
  float* partial = nullptr;
  int64_t rows_total = 0;
  // (decode wgmma kernel, not tiled) a second projection of the same rows and shapes in the same
  // launch (w1 and w3), or null: its experts' weights [E]; out is then [2, rows_total, N] (the
  // second's rows after the first's) and partial [4, 2, rows_total, N]. The same bits as two launches.
  const DevWeight* w_b = nullptr;
  // (decode wgmma kernel) the plan (items, n_items, offsets, in_rows) was written two launches back
  // or earlier, so the kernel may read it, and copy its first weight stages, before its wait for the
  // previous grid (device_common.cuh): the caller's promise (launch_act_quant_fp8 or the swiglu pass
  // runs between the plan and the kernel). The same bits either way.
  bool plan_early = false;
  // A dense FP8 linear through the wgmma kernels (launch_fp8_wgmma_linear): one weight of e4m3
  // codes [N, K] row-major (K a multiple of 128) with fp32 128x128 block scales [ceil(N / 128),
  // w_scale_ld]; the rows are 0 .. rows_total - 1 of codes (no experts, offsets, items or in_rows).
  const uint8_t* w_codes = nullptr;
  const float* w_scales = nullptr;
  int64_t w_scale_ld = 0;
  // (launch_fp8_wgmma_linear, its 8-row form) The rows' fp32 inputs [rows_total, x_ld] (the
  // linear's first x_k columns; k_pad's rest counts as 0), or null: where given, each block
  // quantises its own rows' groups with act_quant's arithmetic (device_common.cuh act_quant_lane:
  // the codes and scales act_quant writes) into its shared memory, and codes and scales are not
  // read, so a linear takes one launch, not two (`fp8_quant_in`). The same bits. REQUIRES
  // fp8_wgmma_quant_in_takes(g).
  const float* x_f32 = nullptr;
  int64_t x_ld = 0, x_k = 0;
  // (launch_fp8_wgmma_linear) the outputs rounded to bf16 (an op's round_bf16): in the quarters'
  // sum where one runs, else by launch_bf16_round after the kernel; the same values either way.
  bool round_bf16 = false;
  // Where K's quarters run in separate blocks (the decode wgmma kernel, either launcher; the FP8 TMA
  // kernel's split items), leave them in `partial` for the output's reader (the returned PartsView,
  // with the rounding), instead of adding them in a launch of their own: the caller's promise that
  // only that view is read, before the next launch that writes `partial`. `out` is then not written.
  bool leave_parts = false;
  // (wgmma kernels, the MoE's w2) grouped row r's outputs go to out row scatter_slots[r]: the rows
  // expert_scatter_kernel would copy them to (the routing weight was applied before w2 on this path),
  // written by the GEMM's own stores (`moe_scatter_store`); out is then [slots, N]. REQUIRES wgmma,
  // no w_b, and tiled or no partial (every output stored once, by the block that sums its quarters).
  const int32_t* scatter_slots = nullptr;
  // (tiled wgmma, one projection, unsplit) The expanded form (launch_w4a8_expanded, the MoE's prefill
  // where the experts average many rows): every expert with rows has its MXFP4 weights written once
  // as the e5m2 bytes the tiled kernel's tables give, in the codes' w4a8_order, into `expanded`
  // ([E, N, K] bytes); then the FP8 TMA kernel's 128 x 128 tiles (tokens as wgmma's M, both operands
  // from shared memory) over each expert's rows, each output's arithmetic the tiled kernel's (the same
  // products in the same k-slots of each group's four wgmma, acc = fma(d, sa, acc), the quarters
  // added in order, the row's 2^(e_ref - 140) at the store): the same bits. Where in_rows is given,
  // the rows' codes are first copied into their grouped order, `sorted_codes` [rows_total, k_pad]
  // (the tensor copies read rows of one matrix); the scales are read where they are.
  uint8_t* expanded = nullptr;
  uint8_t* sorted_codes = nullptr;
  bool sorted_ready = false;  // sorted_codes already holds these rows (w3 after w1)
  // [w4a8_tile_bound(rows_total, E, kW4A8TmaTileRows)][2]: the 128-row tiles' list; and their rows'
  // scales [that bound, K / 128][kW4A8TmaTileRows].
  int64_t* tile_list = nullptr;
  float* tile_scales = nullptr;
};
// Returns the view of the output: `out` itself, or the quarters left (leave_parts).
PartsView launch_grouped_w4a8(const GroupedW4A8Args& g);
// The expanded form's scratch: the weights' bytes.
inline int64_t w4a8_expanded_bytes(int64_t experts, int64_t N, int64_t K) { return experts * N * K; }
// With SPARROW_CUDA_ENABLE=w4a8_expand, the MoE takes the expanded form where its experts average this
// many rows or more (an 8K prefill of V4-Flash: 8192 x 6 / 256 = 192): the expansion's bytes (read
// the MXFP4, write the e5m2) are the same at any rows, the tiled kernel's conversions grow with them.
inline constexpr int64_t kW4A8ExpandRows = 160;
// Whether launch_grouped_w4a8 can take the expanded form for g (GroupedW4A8Args::expanded): wgmma
// and tiled, one projection, no split, K a multiple of 128, the driver's tensor-map entry point.
bool w4a8_expanded_takes(const GroupedW4A8Args& g);
// The expanded form's launches since the process started (test support).
int64_t w4a8_expanded_launches();
// The launches of the W4A8 prefill kernel's mbarrier-ring forms so far, and of those the form
// with its weights by bulk copies (kRing 3) (test support).
int64_t w4a8_ring_launches();
int64_t w4a8_ring_bulk_launches();
// The W4A8 prefill kernel's persistent form's launches (ring form 4, grouped_w4a8_persistent_kernel).
int64_t w4a8_persistent_launches();
// out [rows_total, N] = the FP8 linear of the dense fields above, with the W4A8 wgmma kernels'
// arithmetic (a group's 128 products summed by the tensor core, acc = fma(d, sw * sa, acc) group by
// group within each quarter of the groups, the quarters added in order; sw the weight's block
// scale): every row the same bits for any rows_total. Up to 64 rows: 8-row items, the quarters over
// 1, 2 or 4 blocks by the grid's size when `partial` ([4, rows_total, N]) is given; more: the TMA kernel's 128 x 128
// tiles (fp8_linear_tma_kernel; its quarters in separate work items where
// fp8_wgmma_linear_wants_partial), or with `fp8_tma` off the 64-row tiles of 128 columns. REQUIRES
// the codes in their natural order (not w4a8_order), K % 128 == 0, 16-byte aligned rows, the
// scales' rows_pad a multiple of 4. Returns the output's view (leave_parts: the quarters, where the
// 8-row form split them over blocks or the TMA kernel into separate items).
PartsView launch_fp8_wgmma_linear(const GroupedW4A8Args& g);
// Whether launch_fp8_wgmma_linear can quantise g's rows itself (GroupedW4A8Args::x_f32, which
// g must set, with every other field as for its launch): up to 64 rows (the 8-row form), x_k at most
// K, its blocks' groups past the ring's slots within kFp8QuantInMaxBytes of extra shared memory, and
// the column blocks' reads of the rows (each block reads them again) within kFp8QuantInMaxReads.
bool fp8_wgmma_quant_in_takes(const GroupedW4A8Args& g);
// The FP8 wgmma linear's launches that quantised their rows themselves so far (test support).
int64_t fp8_wgmma_quant_in_launches();
// Whether launch_fp8_wgmma_linear would use `partial` ([4, rows, N] floats) for rows x N: up to 64
// rows, and where its 128 x 128 tiles, cut into K's quarters as separate work items (added in
// order after), take fewer waves of the SMs than whole (kernels_linear.cu tma_split_pays).
bool fp8_wgmma_linear_wants_partial(int64_t rows, int64_t N);
// The bf16 linears on the project's wgmma kernels (bf16_linear.h; kernels_linear.cu): out [rows, N]
// fp32 = W [N, K] (bf16, row-major) times the bf16 inputs x [rows, x_ld], row n of W reading inputs
// (n / R) K .. (n / R) K + K - 1 of a row (R rows a group: V4's grouped wo_a; R = N for one group).
// One arithmetic for every rows: K in steps of 64, cut in 16 parts (4 from N = 8192), each part's wgmma k16
// accumulated by the tensor core from zero in input order, the parts added in order; up to 64 rows
// 8-row items x 64 weight rows, a part a block (A from registers), above 128 x 128 tiles through
// TMA (parts in separate work items where that takes fewer waves of the SMs). `partial` holds
// bf16_wgmma_partial_floats(rows, N) floats.
// REQUIRES bf16_wgmma_linear_takes(N, K, R), x_ld % 8 == 0, 16-byte aligned x and W.
struct Bf16LinearArgs {
  float* out;
  float* partial;
  const uint16_t* x;
  // Or, where bf16_wgmma_reads_f32(rows), fp32 inputs [rows, x_ld] (16-byte aligned), rounded to bf16
  // in the kernel (f32_to_bf16's bits): no conversion pass before.
  const float* x_f32 = nullptr;
  const uint16_t* w = nullptr;
  // Or, where bf16_wgmma_reads_f32(rows), the weight as stored: e4m3 codes [N, K] with block scales
  // (format kFp8Block, block_out and block_in multiples of 64, 16-byte aligned codes), each value
  // made bf16(e4m3 x scale) in the kernel (launch_weight_to_bf16's bits): half the bf16 copy's bytes.
  DevWeight w8{};
  int64_t rows = 0, x_ld = 0;
  int N = 0, K = 0, R = 0;
  bool round_bf16 = false;  // the outputs rounded to bf16: in the parts' sum where one runs, else after
  // The parts of the decode form (up to 64 rows) or of the TMA form's split items left in `partial`
  // for the output's reader, as GroupedW4A8Args::leave_parts: the returned view; `out` not written.
  bool leave_parts = false;
};
// The shapes the kernels take: K a multiple of 64, and a group's rows whole 128-row tiles (R % 128
// == 0) unless there is one group (R == N); K below 2^31, N at most 65535 x 64 (the decode form's grid).
bool bf16_wgmma_linear_takes(int64_t N, int64_t K, int64_t R);
int64_t bf16_wgmma_partial_floats(int64_t rows, int64_t N);
PartsView launch_bf16_wgmma_linear(const Bf16LinearArgs& a);  // the output's view
// Whether launch_bf16_wgmma_linear takes Bf16LinearArgs::x_f32 for `rows` rows (its decode form).
bool bf16_wgmma_reads_f32(int64_t rows);
// The small kernel's tiles a block: 1 (16 columns) while 32-column blocks would number under about
// eight per SM of an H200 (small batches), else 2.
inline int w4a8_small_tiles(const GroupedW4A8Args& g) {
  if (g.small_tiles == 1 || g.small_tiles == 2) return g.small_tiles;
  return g.max_items * ((g.N + 31) / 32) < 1024 ? 1 : 2;
}

// bf16 operands of the tensor-core GEMMs (bf16_linear.cpp), as raw bf16 bits, round to nearest even:
// out[n * w.in + k] = bf16(W[n, k]) for the whole weight (exact for FP8-block weights, whose e4m3
// value times a power-of-two scale has at most 4 significant bits, and for BF16 ones), and
// out[i] = bf16(in[i]) for i < n (exact for the fast profiles' bf16-valued activations).
void launch_weight_to_bf16(const DevWeight& w, uint16_t* out);
// MXFP4 weight words [n] re-laid in place from the released layout to the device one (fp4_layout.h:
// fp4_word_to_device), at upload.
void launch_fp4_to_device_layout(uint32_t* words, int64_t n);
// out = the released MXFP4 codes `in` ([rows][row_bytes]) in the device layout and the tiled row
// order (fp4_layout.h; fp4_tiles(rows, row_bytes)).
void launch_fp4_to_device_tiled(const uint32_t* in, uint32_t* out, int64_t rows, int64_t row_bytes);
void launch_f32_to_bf16(const float* in, uint16_t* out, int64_t n);
// Test hook: dev_div_recip (device_common.cuh) against the IEEE division over divisor significands
// d_first + j d_step (j < d_count, modulo 2^23) and every x_step-th dividend significand, both in
// [1, 2): counts[0] += pairs checked, counts[1] += pairs that differ, *example = the smallest
// differing pair as divisor significand << 23 | dividend significand.
void launch_div_recip_check(uint32_t d_first, uint32_t d_count, uint32_t d_step, uint32_t x_step, unsigned long long* counts,
                            unsigned long long* example);
// Test hook: the W4A8 wgmma kernels' e5m2 tables of each packed e8m0 word words[i] relative to the
// row's largest scale byte e_ref[i] (>= each of the word's bytes), through the decode kernel's group
// prep and through the per-block table alone (out: 18 words an entry; kernels_linear.cu says which).
void launch_w4a8_table_pair(const uint32_t* words, const uint32_t* e_ref, int64_t n, uint32_t* out);
// Test hook: the W4A8 prefill kernels' tile search (w4a8_find_tile) of blocks 0 .. blocks - 1 over
// experts whose rows are offsets[0 .. experts] (device): out[2 b] its expert (-1 past the last
// tile), out[2 b + 1] its first row within the expert.
void launch_w4a8_find_tiles(const int64_t* offsets, int64_t experts, int64_t blocks, int64_t* out);

// Whether the vectorized kernel can take a: FP8 block (block_in a multiple of 16, K of 16) or
// packed FP4 (block_in and K multiples of 32) weights, 16-byte aligned weight and input rows.
bool linear_vectorizable(const LinearArgs& a);

// ---- FP8 block-scaled linear: activation quantisation (kernels_fp8.cu) ---------------------------

inline constexpr int64_t kFp8ActBlock = 128;  // activation scale block along K (spec §3.0.5)

// act_quant_fp8 on the device, bit for bit with core/quant_sim.cpp fp8_pow2_quant_sim(row, K, 128):
// per row and block of 128 inputs, amax = max(1e-4, |x|), s = 2^ceil(log2(amax / 448)),
// code = e4m3(clamp(x / s, ±448)). Written in the padded layout the cuBLASLt GEMM reads:
//   codes  [rows_pad, k_pad] e4m3, row-major; 0 past column K and in rows >= rows;
//   scales [k_pad / 128, rows_pad] fp32: the rows of one K-block contiguous (cuBLASLt's
//          VEC128_32F layout for its B operand); 1 in rows >= rows.
// REQUIRES finite inputs, k_pad a multiple of 128 and >= K, rows_pad >= rows.
struct ActQuantFp8Args {
  uint8_t* codes;
  float* scales;
  const void* in;     // [rows, in_stride], F32 or BF16
  DType in_dtype;
  int64_t rows, K, in_stride, rows_pad, k_pad;
  // The codes of each 128-input block in the order the W4A8 wgmma kernels read them: input
  // 32 t + 8 i + r (t, i < 4, r < 8) at 32 i + 4 t + r for r < 4, at 32 i + 16 + 4 t + r - 4 otherwise.
  // The scales are unchanged.
  bool w4a8_order = false;
};
void launch_act_quant_fp8(const ActQuantFp8Args& a);

// out[t, k] = e4m3(codes[t, k]) * scales[k / 128, t] for t < rows, k < K: the quantised input
// dequantised, exactly (the scales are powers of two and the products stay normal).
struct ActDequantFp8Args {
  float* out;            // [rows, K]
  const uint8_t* codes;  // [rows_pad, k_pad]
  const float* scales;   // [k_pad / 128, rows_pad]
  int64_t rows, K, rows_pad, k_pad;
};
void launch_act_dequant_fp8(const ActDequantFp8Args& a);

// ---- numerics simulation of the fast / deepseek-ref profiles (kernels_fp8.cu) -------------------
// Quantise-then-dequantise in place, the device twins of core/quant_sim.cpp bit for bit on the same
// input (the encoders of device_common.cuh; every step exact or one correctly rounded IEEE op).

enum class RowSimKind : uint8_t {
  kBf16,            // bf16_round_inplace
  kFp8Pow2,         // fp8_pow2_quant_sim(row, dims, block): 128 before GEMMs, 64 for the KV record
  kFp4Pow2Block32,  // fp4_pow2_quant_sim
  kHadamardBf16,    // hadamard_transform then bf16_round_inplace (dims a power of two <= kMaxHadamard)
};
inline constexpr int64_t kMaxHadamard = 256;

// Rounds the first `dims` values of each of n rows: row r is rows[r] when rows is set, else
// x + r * row_stride. One block per row; each thread owns whole scale blocks (no barriers).
struct RowSimArgs {
  float* x;
  float* const* rows;
  int64_t n, row_stride, dims;
  RowSimKind kind;
  int64_t block;  // kFp8Pow2 only
  // Out of place: the rows read from src (laid out as x) and written to x, which must then be
  // whole rows (dims == row_stride, rows null); null: in place.
  const float* src = nullptr;
};
void launch_row_sim(const RowSimArgs& a);

// x[i] = bf16(x[i]) for i < n (the round_bf16 flags: an op's fp32 output rounded once).
void launch_bf16_round(float* x, int64_t n);

// The columns of src [rows, sum of cols] row-major handed out to parts: dst[p] [rows, cols[p]] gets
// the p-th run of columns, rounded to bf16 (as launch_bf16_round) when round_bf16. src may be a
// split GEMM's parts (PartsView), added here.
inline constexpr int kSplitColsParts = 4;  // at most
struct SplitColsArgs {
  PartsView src;
  int64_t rows;
  int parts;
  float* dst[kSplitColsParts];
  int64_t cols[kSplitColsParts];
  bool round_bf16;
};
void launch_split_cols(const SplitColsArgs& a);

// deepseek-ref/fast MoE (MoeParams::ref_numerics): h[r, f] = bf16(fp32(g_r * h[r, f])) with
// g_r = fp64(weights[slots[r]]) * scale, or g_r = 1 when weights is null (shared expert), as the
// CPU's swiglu_ffn computes it in fp64.
struct RouteScaleArgs {
  float* h;               // [R, F]
  const int32_t* slots;   // [R] (ignored when weights is null)
  const float* weights;   // [T*K] or null
  int64_t R, F;
  double scale;
};
void launch_route_scale_bf16(const RouteScaleArgs& a);

// launch_swiglu, launch_route_scale_bf16 and launch_act_quant_fp8 on h = swiglu(h1, h3) in one
// kernel, the same bits, h not written: q's codes and scales from h1 [R, F], h3 [R, F] (q.in unused,
// q.rows = R, q.K = q.in_stride = F).
struct SwigluQuantArgs {
  PartsView h1;  // [R, F] each (or the w1 / w3 GEMM's quarters)
  PartsView h3;
  float limit;
  const int32_t* slots;   // [R] (ignored when weights is null)
  const float* weights;   // [T*K] or null (g = 1)
  double scale;
  ActQuantFp8Args q;
  bool four_wide = false;  // (set by the launch) h1 and h3 allow 16-byte loads
};
void launch_swiglu_quant_fp8(const SwigluQuantArgs& a);

// The KV record (core/kv_record.h) on the device, the host codec's bytes and values: `rows` entries
// of l.dim floats (in_stride apart) to records of l.bytes (rec_stride apart), and back. Encoding
// takes a warp a 64-value block of the nope dims (amax by fmaxf over the warp, the scale and codes
// as row_sim's fp8 rounding makes them) and a thread a RoPE value (bf16, to nearest even).
struct KvRecordArgs {
  const float* in = nullptr;   // encode: entries [rows][in_stride]
  uint8_t* rec = nullptr;      // encode: records [rows][rec_stride]
  uint8_t* const* rec_rows = nullptr;  // encode, instead of rec: row r's record at rec_rows[r] (null: skipped)
  const uint8_t* rec_in = nullptr;  // decode: records
  float* out = nullptr;        // decode: entries [rows][out_stride]
  int64_t rows = 0, in_stride = 0, rec_stride = 0, out_stride = 0;
  KvRecordLayout layout{};     // kv_record_layout's
};
void launch_kv_record_encode(const KvRecordArgs& a);
void launch_kv_record_decode(const KvRecordArgs& a);

// launch_swiglu (strided), launch_route_scale_bf16 and launch_row_sim's fp8 pow2 rounding in blocks
// of `block` (<= 128) on h in one pass, the same bits: out [R, F] = fp8_sim(bf16(g swiglu(a, b)))
// with row r's values at a + r * stride and b + r * stride (a may be out itself, stride F), g as
// route_scale_bf16's (1 when weights is null). The shared expert's h before w2 (`swiglu_sim`).
struct SwigluSimArgs {
  float* out;
  PartsView a;  // (or the stacked w1 / w3 GEMM's quarters, b its view from F on)
  PartsView b;
  int64_t R, F, stride;
  float limit;
  const int32_t* slots = nullptr;  // [R] (ignored when weights is null)
  const float* weights = nullptr;  // [T*K] or null (g = 1)
  double scale = 1.0;
  int64_t block = 128;
};
void launch_swiglu_sim_fp8(const SwigluSimArgs& a);

// ---- compressor, indexer, attention (kernels_attention.cu) --------------------------------------

// One sequence's compressor buffer and its share of the batch (mirrors cpu_state.h).
struct CompressorSeqArgs {
  float* pending_kv;      // [ratio, width]
  float* pending_gate;    // [ratio, width]
  float* prev_kv;         // [ratio, dim] (overlapping form)
  float* prev_gate;       // [ratio, dim]
  float* entries;         // room for every entry this batch emits: entry e at entries + (e - entries_first) * dim
  int64_t entries_first;  // 0 (the state's entries), or `count` (the batch's new entries alone)
  int64_t t_begin, t_end; // batch rows
  int64_t pending, count; // before this batch
  int32_t has_prev;
};

struct CompressorArgs {
  const CompressorSeqArgs* seqs;  // [nseq]
  int64_t nseq;
  const float* kv;                // [T, width]
  const float* gate;              // [T, width]
  const int64_t* positions;       // [T]
  DevView ape;                    // [ratio, width]
  DevView norm_weight;            // [dim]
  RopeTableArg rope;
  int64_t ratio, dim;
  bool overlap;
  float norm_eps;
  // fast/deepseek-ref: the pooled entry bf16 before the norm, the norm and the rotation bf16 out.
  bool round_bf16 = false;
  // false: one block per sequence walks its tokens in order. true: the entries in parallel, one
  // block per job {sequence index, e} (every entry the batch emits: e < (pending + n) / ratio), then
  // one block per sequence leaves the pending and prev buffers; the same bits (kernels_attention.cu).
  bool parallel = false;
  const int64_t* jobs = nullptr;  // [2 * n_jobs] when parallel
  int64_t n_jobs = 0;
};
void launch_compressor(const CompressorArgs& a);

// Rounds each row of `dim` values as stored in `precision` and read back, in place: the device
// twin of core/quant_sim.cpp simulate_key_precision, bit for bit (`--index-keys`: the indexer
// compressor's newly emitted entries). kF32 is a no-op and launches nothing.
struct KeySimArgs {
  float* const* rows;           // [n] device pointers to rows of `dim` values
  int64_t n, dim;
  KeyPrecision precision;
};
void launch_key_sim(const KeySimArgs& a);

// The indexer's top-k kernels, each giving the same slots (test support forces one; kAuto chooses):
// kRank counts each entry's rank against every other in shared memory, over many blocks (small
// calls: indexer_rank_select_fits); kRadix, a block a token, radix passes then a sort; kCount, the
// reference, a thread an entry counting in global memory.
enum class IndexerSelectKernel : int { kAuto, kRank, kRadix, kCount };
// The rank-counting kernel's bounds, for C the row length rounded up to a power of two (the launch's
// grid and shared memory): every row in shared memory (C <= 8192, 32 KB), and T * C * C at most
// 2^24 comparisons (an estimate from the H200's issue rate: about 3 us, not measured; one block a
// token of the radix kernel took 20 us at C = 1024, H200 2026-12-03).
constexpr int64_t kRankSelectMaxC = 8192;
inline bool indexer_rank_select_fits(int64_t T, int64_t C) {
  return T > 0 && C > 0 && C <= kRankSelectMaxC && T * C * C <= (int64_t{1} << 24);
}

struct IndexerArgs {
  int32_t* out_indices;         // [T, k], every slot written (-1 past the token's visible count)
  float* scores;                // [T, C] scratch: score of every visible entry, -inf past them
  const float* q;               // [T, Hi, di]
  const float* head_weights;    // [T, Hi]
  const float* const* keys;     // [T] the token's sequence's indexer entries [count, di]
  const int64_t* visible;       // [T]
  int64_t T, Hi, di, k, C;      // C >= every visible
  float scale;
  // deepseek-ref (IndexerTopkParams::bf16_scores): the CPU's bf16 products, summed in fp64 over
  // heads with the fp64 scale, the sum rounded to bf16.
  bool bf16_scores = false;
  double scale_f64 = 0.0;
  // When set: the scores on the bf16 tensor cores (indexer_score_mma_kernel) from these copies of
  // the keys, [T] pointers to [count, di] bf16 bits, and q rounded to bf16. Exact products, fp32
  // sums in the tensor cores' order (not the fp32 kernels' FMA chains). REQUIRES q and the keys to
  // be bf16 values (the fast profile with --index-keys bf16 or fp4), indexer_mma_fits(Hi, di).
  const uint16_t* const* keys_bf16 = nullptr;
  int mma_tiles = 0;  // tiles of 128 entries a block of that scorer, 1 to 32; 0 chooses (the same bits)
  IndexerSelectKernel select = IndexerSelectKernel::kAuto;  // the top-k kernel (all give the same slots)
};
// Scores into `scores`, then top-k by rank (higher score first, then the lower index).
void launch_indexer_topk(const IndexerArgs& a);
// The top-k part alone, from the scores in `scores` (uses out_indices, scores, visible, T, k, C).
void launch_indexer_select(const IndexerArgs& a);
// The shapes the tensor-core scorer takes: heads a multiple of 16 up to 64, di 32, 64 or 128.
inline bool indexer_mma_fits(int64_t Hi, int64_t di) {
  return Hi > 0 && Hi % 16 == 0 && Hi <= 64 && (di == 32 || di == 64 || di == 128);
}

// dst[i][0 .. dim) = bf16 bits of src[i][0 .. dim), round to nearest even (exact for bf16 values):
// the indexer keys' bf16 copies. One block per row.
void launch_rows_to_bf16(const float* const* src, uint16_t* const* dst, int64_t n, int64_t dim);

// Where one token's candidate keys live.
struct AttnTokenArgs {
  const float* ring;       // [W, Dh] its sequence's window ring
  const float* entries;    // [count, Dh] compressed entries
  const float* batch_kv;   // [n, Dh] its sequence's rows of this batch's kv
  // The same as bf16 bits (AttentionArgs::bf16_keys): the ring's and the entries' copies, this
  // batch's kv converted.
  const uint16_t* ring_bf16 = nullptr;
  const uint16_t* entries_bf16 = nullptr;
  const uint16_t* batch_kv_bf16 = nullptr;
  // The same as FP8 KV records (AttentionArgs::records; core/kv_record.h, AttentionArgs::rec's
  // layout): the ring's, the entries' and this batch's kv encoded.
  const uint8_t* ring_rec = nullptr;
  const uint8_t* entries_rec = nullptr;
  const uint8_t* batch_kv_rec = nullptr;
  int64_t pos;             // absolute position
  int64_t first_pos;       // position of the sequence's first token in this batch
  int64_t n_window;        // window candidates: min(W, pos + 1)
  int64_t n_compressed;    // HCA: visible entries; CSA: k (selection slots); else 0
  int64_t n_entries;       // entries stored (selections must be below)
};

constexpr int64_t kAttnMmaSplitDefault = 640;  // attn_mma_split_candidates() without the variable
struct AttentionArgs {
  float* out;                    // [T, H, Dh]
  float* scratch;                // [kernel_tokens_per_pass * H, max_candidates] (attention_kernel)
  const float* q;                // [T, H, Dh]
  const AttnTokenArgs* tokens;   // [T]
  const int32_t* selected;       // [T, k] (CSA) or null
  DevView sinks;                 // [H]
  int64_t T, H, Dh, window, k, max_candidates;
  bool csa;
  float scale;
  // Split attention (flash-decoding), when set: a (token, head)'s candidates in blocks of
  // kAttnSplitCandidates, each block's max, exp-sum and weighted keys into split_scratch, then one
  // combine per (token, head); the tokens in passes of split_tokens_per_pass (scratch bounded).
  // The split depends only on the token's own candidate count: batch invariant. `scratch` is unused.
  float* split_scratch = nullptr;  // [split_tokens_per_pass, H, max_splits, Dh + 2]
  int64_t split_tokens_per_pass = 0;
  // attention_kernel (no split, no tensor cores): the tokens in launches of this many, each reusing
  // `scratch` (its logits and weights; bounded as the split scratch is); 0: all in one.
  int64_t kernel_tokens_per_pass = 0;
  // The splits on the bf16 tensor cores (attention_mma_kernel), each of attn_mma_split_candidates()
  // candidates (launch_attention sets mma_split to it); split_scratch may be null when no token has
  // more than one split. REQUIRES q and the keys bf16 values (AttentionParams::bf16_operands), attention_mma_fits(H, Dh), 16-byte
  // aligned rows.
  bool mma = false;
  // With mma: the keys read from the tokens' bf16 copies (AttnTokenArgs::*_bf16) instead of
  // converted from fp32 in the kernel; the same values, so the same bits.
  bool bf16_keys = false;
  // With mma (instead of bf16_keys): the keys read from the tokens' FP8 KV records
  // (AttnTokenArgs::*_rec, layout `rec`: bytes a multiple of 8, nope a multiple of 8) and decoded
  // to bf16 in the kernel; the same values as the bf16 copies, so the same bits.
  bool records = false;
  KvRecordLayout rec{};
  // With mma: heads a block, 16 (Dh 256 or 512), 32 or 64 (attention_wg_kernel, from the bf16
  // copies where H is a multiple of 64; else as 0), or 0 to choose by the call's size; the same
  // bits either way (tests force each).
  int block_heads = 0;
  bool round_bf16 = false;  // out stored rounded to bf16
  int64_t mma_split = kAttnMmaSplitDefault;  // set by launch_attention: attn_mma_split_candidates()
  // With mma: q holds the heads' projections, normalised and rotated as the kernel stages them
  // (AttentionParams::q_rope; attention_mma_q_prep): rms_norm_warp_kernel's sums and products (eps
  // q_eps, no weight) and rope_kernel's rotation of the last 2 q_rope.pairs dims at the token's
  // position, each rounded to bf16 when round_bf16: the values those kernels would write, so the same
  // bits. REQUIRES 2 q_rope.pairs <= Dh.
  bool q_prep = false;
  float q_eps = 0.0f;
  RopeTableArg q_rope{};
  // (AttentionParams::o_rope; `attn_o_fold`) With o_rope.pairs > 0, attention_mma_kernel rotates the
  // last 2 o_rope.pairs dims of each output it finishes itself (a token of one split) back by the
  // token's position as it stores them: rope_kernel's inverse rotation of the stored value and its
  // rounding, so the same bits. launch_attention keeps it only where every token is finished so (the
  // 16- and 32-head blocks, one split a token) and says whether it did; else it is the caller's to
  // rotate (Backend::attention_o_finish).
  RopeTableArg o_rope{};
  // AttentionParams::weights_bf16: each softmax weight rounded to bf16 where it weights its key. With
  // mma one bf16 term in the weighted sum's mma instead of three (every block shape); without, the
  // one-block-a-(token, head) attention_kernel (REQUIRES split_scratch null), whose running max
  // over chunks of 32 is the CPU's, and whose logits (fp64 sums, times scale_f64, to fp32) and
  // weights (fp64 exp, to fp32, then bf16) are made as the CPU makes them, so that a weight rounds
  // as the CPU's does (not only to within a few ulps of it, which would flip a few near bf16 ties).
  bool weights_bf16 = false;
  double scale_f64 = 0.0;  // AttentionParams::scale, for attention_kernel under weights_bf16
};
// Returns whether a.o_rope's rotation was done in the kernels (AttentionArgs::o_rope).
bool launch_attention(const AttentionArgs& a);
// The device's SM count (132 where it cannot be read), for launches sized to fill it.
int sm_count();
constexpr int64_t kAttnSplitCandidates = 64;
// The tensor-core attention's candidates a split: 640, or SPARROW_CUDA_ATTN_MMA_SPLIT (a multiple of
// 32 from 32 to 8192; read once per process; another value throws naming the variable). A split's
// size is part of a token's arithmetic (which candidates share a running max and sum), so it is one
// value for the whole process: the splits still depend only on the token's own candidates (batch
// and chunking invariant), and a run with another value gives other bits, close to the CPU's
// either way. 640 is V4-Flash's CSA candidates (a window of 128 and a top-k of 512): every CSA
// token is one split, finished in the kernel without the scratch and the combine. Against 512 (two
// splits of 512 and 128) a CSA layer's 8K prefill went 29.28 -> 26.62 ms and its 256 x 4K step
// 2.09-2.11 -> 1.99-2.01 (H200, 2026-12-04); its batch-1 cell moved within the run's spread. At
// 128 the batch-1 step was 3.3 % shorter than at 512 but batch 256 5 % and an 8K prefill 10 %
// slower (H200, 2026-12-03): a knob to A/B split sizes.
int64_t attn_mma_split_candidates();
// The shapes the tensor-core attention takes: heads in blocks of 32, Dh 128, 256 or 512.
inline bool attention_mma_fits(int64_t H, int64_t Dh) { return H > 0 && H % 32 == 0 && (Dh == 128 || Dh == 256 || Dh == 512); }
// Blocks of the split attention for a (token, head) with `candidates` candidates (at least 1).
inline int64_t attention_splits(int64_t candidates, bool mma = false) {
  const int64_t per = mma ? attn_mma_split_candidates() : kAttnSplitCandidates;
  return (std::max<int64_t>(candidates, 1) + per - 1) / per;
}

// ---- router and experts (kernels_moe.cu) --------------------------------------------------------

struct RouterArgs {
  int32_t* out_experts;          // [T, K]
  float* out_weights;            // [T, K]
  PartsView logits;              // [T, E] (or the gate GEMM's parts)
  const int32_t* forced;         // [T, K] or null
  const int32_t* token_ids;      // [T]
  DevView bias;                  // [E] (scored) or data null
  DevView tid2eid;               // [V, K] I32/I64 (hash) or data null
  int64_t T, E, K;
  bool hash;
  float scale;                   // routed_scale, or 1 when the combine applies it
};
// (Scored routing takes its top-k by warp argmax rounds unless SPARROW_CUDA_DISABLE=router_warp.)
void launch_router(const RouterArgs& a);

// h = silu(min(a, L)) * clamp(b, -L, L) (no clamp when limit <= 0), written over a.
struct SwigluArgs {
  float* a;          // [n] gate (w1) outputs, becomes h
  const float* b;    // [n] up (w3) outputs
  int64_t n;
  float limit;
  // Strided form (cols > 0): n / cols rows; row r's values at a + r * stride and b + r * stride, h
  // written to out [n / cols, cols] (a and b then unchanged).
  float* out = nullptr;
  int64_t cols = 0, stride = 0;
};
void launch_swiglu(const SwigluArgs& a);

// contrib[slots[r], :] = weights[slots[r]] * scale * y[r, :], or y[r, :] when weights is null
// (ref_numerics: the routing weight went in before w2).
struct ScatterArgs {
  float* contrib;         // [T*K, D]
  PartsView y;            // [R, D] (or the w2 GEMM's quarters)
  const int32_t* slots;   // [R]
  const float* weights;   // [T*K] or null
  int64_t R, D;
  float scale;
};
void launch_expert_scatter(const ScatterArgs& a);

// out[t, d] = sum_i contrib[t*K + i, d] (+ shared[t, d]).
struct CombineArgs {
  float* out;              // [T, D]
  const float* contrib;    // [T*K, D]
  PartsView shared;        // [T, D] (or the shared expert's w2 quarters), or data null
  int64_t T, K, D;
  bool round_bf16 = false;  // the sums rounded to bf16 (MoeParams::ref_numerics' final rounding)
};
void launch_moe_combine(const CombineArgs& a);

}  // namespace sparrow::cuda
