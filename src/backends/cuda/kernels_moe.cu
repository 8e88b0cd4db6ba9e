// Router (hash and sqrtsoftplus top-k), SwiGLU with the clamp, and the expert combine
// (spec §3.4). The expert projections themselves are launch_linear over gathered rows.
#include <algorithm>

#include "backends/cuda/device_common.cuh"

namespace sparrow::cuda {
namespace {

constexpr int kThreads = 256;

// log(sqrt(softplus(x))), finite for every finite x (cpu_backend.cpp log_sqrt_softplus): x above
// 20 (PyTorch's softplus threshold), log1p(exp(x)) below, ~x below -30 where log(softplus) ~ x.
__device__ inline float log_sqrt_softplus(float x) {
  float log_sp;
  if (x > 20.0f) {
    log_sp = logf(x);
  } else if (x < -30.0f) {
    log_sp = x + log1pf(-0.5f * expf(x));
  } else {
    log_sp = logf(log1pf(expf(x)));
  }
  return 0.5f * log_sp;
}

// An order-keeping key of a float for unsigned compares (a > b as floats: key(a) > key(b)); -0 is
// keyed as +0 (they compare equal), and a NaN as 1, below every number (key(-inf) = 0x007fffff), so
// that 0 can mean "no expert".
__device__ inline uint32_t router_key(float v) {
  if (v != v) return 1u;
  const uint32_t bits = __float_as_uint(v + 0.0f);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// grid (T), dynamic shared 2*E floats. Scores in log space; scored routing picks by rank of
// score + bias (higher first, then the lower expert); weights g_i = s_i / sum s from the unbiased
// scores, evaluated as exp(log s_i - max) / sum exp(. - max), times `scale`.
// kLane > 0 (E <= 32 kLane, `router_warp`, launch_router): warp 0 takes the scored top-k in K rounds
// of a warp argmax; its lanes hold the keys of experts lane, lane + 32, ... in registers, and a round
// is each lane's best (the highest key, then the lower expert), the warp's highest key
// (__reduce_max_sync) and the lowest expert holding it (__reduce_min_sync): the rank order's experts
// in the same slots. (The first warp form read each lane's scores from shared memory and reduced
// (score, expert) pairs by 5 xor-shuffle steps a round; the batch-1 step's scored routers held its
// chain 12.2 us against the hash routers' 5.3, H100 trace; in ncu 15.4 us, this form 6.8, and the
// 8-layer step 1.8-3.2 % shorter, H100, 2026-12-07.) kLane = 0: a thread an
// expert counts its rank over all E (a scored router of 15.8 us on the H200 at batch 1, 2026-12-03).
// A NaN score ranks below every number in the warp form; the rank count does not order NaNs.
template <int kLane>
__global__ void router_kernel(RouterArgs a) {
  wait_previous_grid();
  extern __shared__ float shared[];
  float* log_score = shared;     // [E]
  float* biased = shared + a.E;  // [E]
  __shared__ int32_t chosen[kMaxRouterTopk];
  const int64_t t = blockIdx.x, E = a.E, K = a.K;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    log_score[e] = log_sqrt_softplus(dev_parts_at(a.logits, t * E + e));
    if (!a.hash && !a.forced) biased[e] = expf(log_score[e]) + dev_load(a.bias, e);
  }
  __syncthreads();
  if (a.forced) {
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) chosen[i] = a.forced[t * K + i];
  } else if (a.hash) {
    const int64_t id = a.token_ids[t];
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) chosen[i] = static_cast<int32_t>(dev_load_index(a.tid2eid, id * K + i));
  } else if constexpr (kLane > 0) {
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      uint32_t key[kLane];  // expert lane + 32 j's key, 0 when it is past E or taken
#pragma unroll
      for (int j = 0; j < kLane; ++j) key[j] = lane + 32 * j < E ? router_key(biased[lane + 32 * j]) : 0u;
      for (int64_t r = 0; r < K; ++r) {
        uint32_t best = 0u;
        int best_j = 0;
#pragma unroll
        for (int j = 0; j < kLane; ++j)
          if (key[j] > best) best = key[j], best_j = j;  // strictly higher: the lower expert keeps a tie
        const uint32_t top = __reduce_max_sync(0xffffffffu, best);
        const uint32_t e = __reduce_min_sync(0xffffffffu, best == top ? static_cast<uint32_t>(lane + 32 * best_j) : ~0u);
        if (static_cast<int>(e & 31u) == lane)
#pragma unroll
          for (int j = 0; j < kLane; ++j)
            if (j == static_cast<int>(e >> 5)) key[j] = 0u;
        if (lane == 0) chosen[r] = static_cast<int32_t>(e);  // K <= E: an expert is left every round
      }
    }
  } else {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      const float mine = biased[e];
      int64_t rank = 0;
      for (int64_t v = 0; v < E && rank < K; ++v) rank += (biased[v] > mine || (biased[v] == mine && v < e)) ? 1 : 0;
      if (rank < K) chosen[rank] = static_cast<int32_t>(e);
    }
  }
  __syncthreads();
  // The weights, warp 0's lane l taking slots l and l + 32: each value's operations and the sum's
  // order are those of one thread's loops over the slots (their maximum is order-free).
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    constexpr int kSlots = 2;
    static_assert(kMaxRouterTopk <= 32 * kSlots);
    float ls[kSlots], ex[kSlots];
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      const int64_t i = lane + 32 * u;
      ls[u] = -INFINITY;
      if (i < K) {
        if (chosen[i] < 0 || chosen[i] >= E) __trap();  // a forced or table expert outside [0, E)
        ls[u] = log_score[chosen[i]];
        mx = fmaxf(mx, ls[u]);
      }
    }
    mx = warp_max(mx);
#pragma unroll
    for (int u = 0; u < kSlots; ++u) ex[u] = expf(ls[u] - mx);
    float sum = 0.0f;
    for (int64_t i = 0; i < K; ++i) sum += __shfl_sync(0xffffffffu, i < 32 ? ex[0] : ex[1], static_cast<int>(i % 32));
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      const int64_t i = lane + 32 * u;
      if (i < K) {
        a.out_experts[t * K + i] = chosen[i];
        a.out_weights[t * K + i] = ex[u] / sum * a.scale;
      }
    }
  }
}

__global__ void swiglu_kernel(SwigluArgs a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  if (a.cols > 0) {
    const int64_t j = i / a.cols * a.stride + i % a.cols;
    a.out[i] = dev_swiglu(a.a[j], a.b[j], a.limit);
  } else {
    a.a[i] = dev_swiglu(a.a[i], a.b[i], a.limit);
  }
}

// kVec: four neighbouring values of a row a thread through 16-byte loads and stores (D a multiple
// of 4, both arrays 16-byte aligned), each value the one-value form's (g = weight x scale, then
// g x y). One a thread, batch 256's 33.5 MB took 32 us (H200, 2026-12-03).
template <bool kVec>
__global__ void expert_scatter_kernel(ScatterArgs a) {
  wait_previous_grid();
  constexpr int kW = kVec ? 4 : 1;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kW;
  if (i >= a.R * a.D) return;
  const int64_t r = i / a.D, d = i % a.D;
  const int64_t slot = a.slots[r];
  if constexpr (kVec) {
    float4 v = dev_parts_at4(a.y, i);
    if (a.weights) {
      const float g = a.weights[slot] * a.scale;
      v = make_float4(g * v.x, g * v.y, g * v.z, g * v.w);
    }
    *reinterpret_cast<float4*>(a.contrib + slot * a.D + d) = v;
  } else {
    const float y = dev_parts_at(a.y, i);
    a.contrib[slot * a.D + d] = a.weights ? a.weights[slot] * a.scale * y : y;
  }
}

// Slots are summed in slot order, then the shared expert: a token's result does not depend on
// which other tokens share the batch.
// kVec: four neighbouring values a thread (as expert_scatter_kernel's), each summed in the same order.
template <bool kVec>
__global__ void moe_combine_kernel(CombineArgs a) {
  wait_previous_grid();
  constexpr int kW = kVec ? 4 : 1;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kW;
  if (i >= a.T * a.D) return;
  const int64_t t = i / a.D, d = i % a.D;
  if constexpr (kVec) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t k = 0; k < a.K; ++k) {
      const float4 c = *reinterpret_cast<const float4*>(a.contrib + (t * a.K + k) * a.D + d);
      acc.x += c.x, acc.y += c.y, acc.z += c.z, acc.w += c.w;
    }
    if (a.shared.data) {
      const float4 sh = dev_parts_at4(a.shared, i);
      acc.x += sh.x, acc.y += sh.y, acc.z += sh.z, acc.w += sh.w;
    }
    if (a.round_bf16)
      acc = make_float4(dev_bf16_round(acc.x), dev_bf16_round(acc.y), dev_bf16_round(acc.z), dev_bf16_round(acc.w));
    *reinterpret_cast<float4*>(a.out + i) = acc;
  } else {
    float acc = 0.0f;
    for (int64_t k = 0; k < a.K; ++k) acc += a.contrib[(t * a.K + k) * a.D + d];
    if (a.shared.data) acc += dev_parts_at(a.shared, i);
    a.out[i] = a.round_bf16 ? dev_bf16_round(acc) : acc;
  }
}

}  // namespace

void launch_router(const RouterArgs& a) {
  if (a.T == 0) return;
  static const bool warp_topk = cuda_feature_on("router_warp");
  const bool scored = !a.hash && a.forced == nullptr && a.K <= a.E;
  const size_t shared = 2 * a.E * sizeof(float);
  // Where the keys fit 8 registers a lane (V4-Flash's 256 experts), else 64 (up to 2048 experts).
  if (scored && warp_topk && a.E <= 32 * 8) launch(router_kernel<8>, static_cast<unsigned>(a.T), kThreads, shared, a);
  else if (scored && warp_topk && a.E <= 32 * 64) launch(router_kernel<64>, static_cast<unsigned>(a.T), kThreads, shared, a);
  else launch(router_kernel<0>, static_cast<unsigned>(a.T), kThreads, shared, a);
}

namespace {

// The plan in two launches (one block with a serial placement loop on thread 0 took 6.9 ms for a
// prefill of 8192 tokens and 0.22 ms at batch 256 on the H200):
// 1. moe_count_kernel: rows per expert (shared-memory histograms added to counts[E], zero before;
//    stored by the one block where there is one).
// 2. moe_place_kernel: every block scans the counts (offsets, first item of each expert); warp w of
//    block b places expert e = 8b + w: it walks the T*K choices in (token, slot) order 32 at a time,
//    a ballot giving each match its place, so the rows of an expert keep that order (the host plan's);
//    then it writes the expert's items (tiles of kMoeTileRows rows). Block 0 writes offsets and n_items.
constexpr int kPlanThreads = 256, kPlanWarps = kPlanThreads / 32;

__global__ void moe_count_kernel(MoePlanArgs a) {
  wait_previous_grid();
  extern __shared__ int32_t hist[];  // [E]
  for (int64_t e = threadIdx.x; e < a.E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t n = a.T * a.K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = a.experts[i];
    if (e < 0 || e >= a.E) __trap();  // the router's output is always in range
    atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  // One block (up to 1,024 choices: the decode batches) stores every count, so counts need not be
  // zeroed (moe_plan_counts_unfilled: no fill node in the captured step); more add theirs to zeros.
  for (int64_t e = threadIdx.x; e < a.E; e += blockDim.x) {
    if (gridDim.x == 1) a.counts[e] = hist[e];
    else if (hist[e] != 0) atomicAdd(&a.counts[e], hist[e]);
  }
}

__global__ void moe_place_kernel(MoePlanArgs a) {
  wait_previous_grid();
  extern __shared__ int32_t plan_shared[];  // offsets [E + 1], first items [E + 1]
  int32_t* offs = plan_shared;
  int32_t* first_item = plan_shared + a.E + 1;
  // The exclusive prefix sums of the counts and of their tiles, kPlanThreads experts at a time: a
  // scan in each warp (shuffles), the warps' totals added in warp order. Thread 0 walking the
  // experts alone took 13 us of a batch-1 step's plan (ncu, H200). Integer sums: exact.
  __shared__ int32_t warp_total[2][kPlanWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t carry = 0, carry_items = 0;
  for (int64_t base = 0; base < a.E; base += kPlanThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < a.E ? a.counts[e] : 0;
    const int32_t tiles = (c + static_cast<int32_t>(kMoeTileRows) - 1) / static_cast<int32_t>(kMoeTileRows);
    int32_t sc = c, st = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t yc = __shfl_up_sync(0xffffffffu, sc, o), yt = __shfl_up_sync(0xffffffffu, st, o);
      if (lane >= o) sc += yc, st += yt;
    }
    if (lane == 31) warp_total[0][warp] = sc, warp_total[1][warp] = st;
    __syncthreads();
    int32_t before = carry, before_items = carry_items;
    for (int w = 0; w < kPlanWarps; ++w) {
      if (w < warp) before += warp_total[0][w], before_items += warp_total[1][w];
      carry += warp_total[0][w], carry_items += warp_total[1][w];
    }
    if (e < a.E) offs[e] = before + sc - c, first_item[e] = before_items + st - tiles;
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
  if (threadIdx.x == 0) {
    offs[a.E] = carry;
    first_item[a.E] = carry_items;
    if (carry_items > a.max_items) __trap();  // the host's bound (MoePlanArgs::max_items) is never reached
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int64_t e = threadIdx.x; e <= a.E; e += blockDim.x) a.offsets[e] = offs[e];
    if (threadIdx.x == 0) *a.n_items = first_item[a.E];
  }
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kPlanWarps + warp;
  if (e >= a.E) return;
  const int32_t count = offs[e + 1] - offs[e];
  if (count == 0) return;
  const int64_t n = a.T * a.K;
  int32_t placed = offs[e];
  // kPlaceUnroll rounds of 32 choices a step, all their loads issued before the first ballot (one
  // round a step, each load behind the last round's exit test, held an 8K prefill's placement 0.61
  // ms on the warps' L2 latency: ncu, H200 2026-12-04); the rounds still in (token, slot) order.
  constexpr int kPlaceUnroll = 8;
  for (int64_t i0 = 0; i0 < n && placed < offs[e + 1]; i0 += 32 * kPlaceUnroll) {
    int32_t ex[kPlaceUnroll];
#pragma unroll
    for (int u = 0; u < kPlaceUnroll; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      ex[u] = i < n ? a.experts[i] : -1;  // (-1 matches no expert)
    }
#pragma unroll
    for (int u = 0; u < kPlaceUnroll; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      const bool mine = ex[u] == e;
      const uint32_t mask = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const int32_t r = placed + __popc(mask & ((1u << lane) - 1u));
        a.rows[r] = static_cast<int32_t>(i / a.K);
        a.slots[r] = static_cast<int32_t>(i);
      }
      placed += __popc(mask);
    }
  }
  for (int32_t j = lane; j * static_cast<int32_t>(kMoeTileRows) < count; j += 32) {
    a.items[2 * (first_item[e] + j)] = static_cast<int32_t>(e);
    a.items[2 * (first_item[e] + j) + 1] = j * static_cast<int32_t>(kMoeTileRows);
  }
}

}  // namespace

namespace {
// The count kernel's blocks for this many choices: 1,024 a block, at most 132.
unsigned moe_count_blocks(int64_t choices) {
  return static_cast<unsigned>(std::min<int64_t>((choices + 1023) / 1024, 132));
}
}  // namespace
bool moe_plan_counts_unfilled(int64_t choices) { return moe_count_blocks(choices) == 1; }

void launch_moe_plan(const MoePlanArgs& a) {
  if (a.T * a.K == 0) return;
  launch(moe_count_kernel, moe_count_blocks(a.T * a.K), 1024, a.E * sizeof(int32_t), a);
  launch(moe_place_kernel, blocks_for(a.E, kPlanWarps), kPlanThreads, 2 * (a.E + 1) * sizeof(int32_t), a);
}

void launch_swiglu(const SwigluArgs& a) {
  if (a.n > 0) launch(swiglu_kernel, blocks_for(a.n, kThreads), kThreads, 0, a);
}

void launch_expert_scatter(const ScatterArgs& a) {
  if (a.R * a.D <= 0) return;
  if (four_wide(a.D, a.contrib) && parts_view_four_wide(a.y))
    launch(expert_scatter_kernel<true>, blocks_for(a.R * a.D / 4, kThreads), kThreads, 0, a);
  else
    launch(expert_scatter_kernel<false>, blocks_for(a.R * a.D, kThreads), kThreads, 0, a);
}

void launch_moe_combine(const CombineArgs& a) {
  // The rounding in the combine unless SPARROW_CUDA_DISABLE=fused_round (a bf16_round pass after).
  static const bool fused = cuda_feature_on("fused_round");
  if (a.T * a.D <= 0) return;
  CombineArgs c = a;
  c.round_bf16 = a.round_bf16 && fused;
  if (four_wide(a.D, a.out, a.contrib) && (a.shared.data == nullptr || parts_view_four_wide(a.shared)))
    launch(moe_combine_kernel<true>, blocks_for(a.T * a.D / 4, kThreads), kThreads, 0, c);
  else
    launch(moe_combine_kernel<false>, blocks_for(a.T * a.D, kThreads), kThreads, 0, c);
  if (a.round_bf16 && !fused) launch_bf16_round(a.out, a.T * a.D);
}

// This translation unit's trace region (kernels.h set_kernel_trace).
cudaError_t set_kernel_trace_moe(KernelTraceSlot* region) { return set_kernel_trace_here(region); }

}  // namespace sparrow::cuda
