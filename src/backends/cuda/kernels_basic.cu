// Embedding, mHC (pre with Sinkhorn, post, head), RMS norms, RoPE and window appends.
// One block per token (or per normalised group) where a reduction is needed, one thread per
// element otherwise. Formulas: spec §3.0-§3.2, §3.6; they mirror src/backends/cpu/cpu_backend.cpp.
#include <climits>

#include <cuda_bf16.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_common.cuh"
#include "core/check.h"

namespace sparrow::cuda {

bool pdl_launch_on() {
  static const bool on = cuda_feature_on("pdl");
  return on;
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxMix = (2 + kMaxStreams) * kMaxStreams;
// Norm groups up to this size take a warp a row (rms_norm_warp_kernel), larger ones a block.
constexpr int64_t kNormWarpGroup = 2048;

__device__ inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (T), block over D: every stream a copy of the embedding row.
// A bf16 table's row (the checkpoints' embedding): 8 values a thread loaded before it stores any
// (load_ahead_store; the compiler cannot tell that out does not alias the table: one at a time, a
// batch-1 token's row of 4096 held the step's chain 11.0 us, H100 kernel trace, 2026-12-07). Other
// formats: a value at a time through weight_at (the same values: weight_at reads a bf16 table's
// value as dev_bf16 of its bits).
__global__ void embed_kernel(EmbedArgs a) {
  wait_previous_grid();
  const int64_t t = blockIdx.x;
  const int64_t id = a.ids[t];
  if (a.table.format == WeightFormat::kFloat && a.table.dtype == DType::kBF16) {
    const uint16_t* src = static_cast<const uint16_t*>(a.table.data) + id * a.table.in;
    load_ahead_store<8>(threadIdx.x, blockDim.x, a.D, [&](int64_t d) { return static_cast<uint32_t>(src[d]); },
                        [&](int64_t d, uint32_t raw) {
                          for (int64_t s = 0; s < a.S; ++s) a.out[(t * a.S + s) * a.D + d] = dev_bf16(static_cast<uint16_t>(raw));
                        });
    return;
  }
  for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) {
    const float v = weight_at(a.table, id, d);
    for (int64_t s = 0; s < a.S; ++s) a.out[(t * a.S + s) * a.D + d] = v;
  }
}

// mix[m] = (fn[m] . X) * rsqrt(mean(X^2) + eps) over the flattened streams X of one token,
// into shared `mix` (spec §3.2 steps 1-2). Every thread of the block calls it.
__device__ void hc_mix(const float* X, int64_t width, const DevView& fn, int64_t nmix, float norm_eps, float* mix) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) ss += X[i] * X[i];
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(width) + norm_eps);
  for (int64_t m = 0; m < nmix; ++m) {
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) acc += dev_load(fn, m * width + i) * X[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) mix[m] = acc * r;
  }
  __syncthreads();
}

// Loads a thread issues before it adds them, in order (the hc mix at small batches, rms_norm).
constexpr int kMixUnroll = 8;

// The block sums of a tile: each value's warp_sum, then a thread per (token, mix) adds the 8 warp
// partials in warp order (block_sum's order), all values at once (one barrier). Every thread of the
// block calls it; tokens from nt on are not written.
template <int kTok, int kMix>
__device__ inline void hc_mix_tile_reduce(const float (&ss)[kTok], const float (&acc)[kMix][kTok], int nt, int64_t t0,
                                          int64_t m0, int64_t width, int64_t nmix, float norm_eps, float* mix_out) {
  constexpr int kValues = kTok * (kMix + 1), kWarps = kThreads / 32;
  static_assert(kThreads >= kTok * kMix, "a thread per (token, mix) of the tile");
  __shared__ float part[kValues][kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < kTok; ++k) {
    const float s = warp_sum(ss[k]);
    if (lane == 0) part[k * (kMix + 1)][warp] = s;
#pragma unroll
    for (int mm = 0; mm < kMix; ++mm) {
      const float v = warp_sum(acc[mm][k]);
      if (lane == 0) part[k * (kMix + 1) + 1 + mm][warp] = v;
    }
  }
  __syncthreads();
  const int q = threadIdx.x;
  if (q < kTok * kMix && q / kMix < nt) {
    const int k = q / kMix, mm = q % kMix;
    float s2 = 0.0f, a2 = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s2 += part[k * (kMix + 1)][w];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) a2 += part[k * (kMix + 1) + 1 + mm][w];
    const float r = 1.0f / sqrtf(s2 / static_cast<float>(width) + norm_eps);
    mix_out[(t0 + k) * nmix + m0 + mm] = a2 * r;
  }
}

// The mix values of T tokens into mix_out [T, nmix], with the sums hc_mix makes: each (token, mix)
// value is thread i's elements i, i + 256, ... in increasing order, then the block's sum as
// block_sum forms it (each warp's warp_sum, the 8 warp partials added in warp order), so every value
// is hc_mix's bit for bit, whatever the tile. hc_mix runs the nmix dot products of a token one after
// another in one block (one SM reading 24 x 64 KB for V4-Flash's 4 x 4096 streams: 0.67 ms a call
// on the H200 at batch 1). Here grid (ceil(T / kTok) * nmix / kMix): block b takes mixes kMix
// (b % groups) .. + kMix - 1 of tokens kTok (b / groups) .. + kTok - 1 (groups = nmix / kMix), the
// mix fastest-varying so the blocks reading one token group's streams run side by side and find
// them in L2; each thread loads kUnroll of its elements (of every token and mix of the tile) before
// adding them in order, and all kTok (kMix + 1) block sums are reduced at once (one barrier).
// Measured on the H200: one mix a block, one token, one load at a time 0.09 ms a call at batch 1
// (8 loads in flight: the 0.10 ms per layer of the table in docs/cuda.md); one mix a block for
// every T, an 8K prefill's hc_pre took 6.9 ms; 8 mixes a block with a block_sum after another (two
// barriers each) 3.9 ms; with the sums reduced at once, 4 or 8 tokens a block, 2.2 ms, and at 256
// tokens 0.273 -> 0.138 ms (hc_pre's two calls).
template <int kTok, int kMix, int kUnroll>
__global__ void __launch_bounds__(kThreads) hc_mix_tile_kernel(const float* streams, int64_t T, int64_t width, DevView fn,
                                                              int64_t nmix, float norm_eps, float* mix_out) {
  const int64_t groups = nmix / kMix;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) / groups * kTok, m0 = blockIdx.x % groups * kMix;
  const int nt = T - t0 < kTok ? static_cast<int>(T - t0) : kTok;
  const bool f32 = fn.dtype == DType::kF32;
  // The block's weight rows into L2 while the previous grid finishes (a hint; device_common.cuh).
  const int64_t fn_elem = dev_float_bytes(fn.dtype);
  const int64_t fn_rows = nmix - m0 < kMix ? nmix - m0 : kMix;
  prefetch_l2(static_cast<const char*>(fn.data) + m0 * width * fn_elem, fn_rows * width * fn_elem, threadIdx.x, kThreads);
  wait_previous_grid();
  float ss[kTok] = {}, acc[kMix][kTok] = {};
  for (int64_t i0 = threadIdx.x; i0 < width; i0 += kUnroll * kThreads) {
    float xs[kTok][kUnroll], ws[kMix][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * kThreads;
#pragma unroll
      for (int k = 0; k < kTok; ++k) xs[k][u] = i < width && k < nt ? streams[(t0 + k) * width + i] : 0.0f;
#pragma unroll
      for (int mm = 0; mm < kMix; ++mm)
        ws[mm][u] = i < width ? (f32 ? static_cast<const float*>(fn.data)[(m0 + mm) * width + i] : dev_load_call(fn, (m0 + mm) * width + i))
                              : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i0 + u * kThreads >= width) break;
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
        ss[k] += xs[k][u] * xs[k][u];
#pragma unroll
        for (int mm = 0; mm < kMix; ++mm) acc[mm][k] += ws[mm][u] * xs[k][u];
      }
    }
  }
  hc_mix_tile_reduce<kTok, kMix>(ss, acc, nt, t0, m0, width, nmix, norm_eps, mix_out);
}

// hc_mix_tile_kernel's tile and sums (each thread's elements i, i + 256, ... in the same order, the
// same reduction: the same bits) with the tile's rows, kTok tokens' streams and kMix weight rows
// (f32), staged through shared memory with cp.async, kStages chunks of kChunk = 256 kUnroll
// elements a row in a ring. With the loads in registers an 8K prefill's tile kept 32 loads a thread
// in flight at two blocks an SM (128 registers), about 64 KB an SM: the mix took 1.25 of hc_pre's
// 2.27 ms for its two calls; staged, 0.78 (H200). REQUIRES width % kChunk == 0, 16-byte aligned rows.
template <int kTok, int kMix, int kUnroll, int kStages>
__global__ void __launch_bounds__(kThreads, 2) hc_mix_staged_kernel(const float* streams, int64_t T, int64_t width,
                                                                   const float* fn, int64_t nmix, float norm_eps,
                                                                   float* mix_out, bool prefetch) {
  constexpr int kChunk = kUnroll * kThreads, kRows = kTok + kMix, kQuads = kChunk / 4;
  static_assert((kRows * kQuads) % kThreads == 0 && kThreads % kQuads == 0, "whole rows of 16-byte pieces a pass");
  constexpr int kRowsPerPass = kThreads / kQuads;
  extern __shared__ float4 hc_stage4[];
  float* stage = reinterpret_cast<float*>(hc_stage4);
  const int64_t groups = nmix / kMix;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) / groups * kTok, m0 = blockIdx.x % groups * kMix;
  // A decode batch's few blocks hint their weight rows into L2 while the previous grid finishes (as
  // hc_mix_tile_kernel); a prefill's many blocks would hint the same rows over and over, so they
  // only wait (their ring streams the weights already).
  if (prefetch)
    prefetch_l2(fn + m0 * width, (nmix - m0 < kMix ? nmix - m0 : kMix) * width * static_cast<int64_t>(sizeof(float)),
                threadIdx.x, kThreads);
  wait_previous_grid();
  const int nt = T - t0 < kTok ? static_cast<int>(T - t0) : kTok;
  const int64_t chunks = width / kChunk;
  // This thread's pieces: quad q of rows r0, r0 + kRowsPerPass, ... (rows past the tile's tokens
  // repeat its last token: their sums are never written).
  const int q = threadIdx.x % kQuads, r0 = threadIdx.x / kQuads;
  const auto row_src = [&](int r) {
    return r < kTok ? streams + (t0 + (r < nt ? r : nt - 1)) * width : fn + (m0 + r - kTok) * width;
  };
  const auto issue = [&](int64_t c) {
    if (c < chunks) {
      float* dst = stage + (c % kStages) * (kRows * kChunk);
#pragma unroll
      for (int r = r0; r < kRows; r += kRowsPerPass) cp_async(dst + r * kChunk + 4 * q, row_src(r) + c * kChunk + 4 * q, true, 16);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) issue(c);
  float ss[kTok] = {}, acc[kMix][kTok] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c landed for every thread; every thread is done with chunk c - 1's slot
    issue(c + kStages - 1);
    const float* src = stage + (c % kStages) * (kRows * kChunk) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float xs[kTok], ws[kMix];
#pragma unroll
      for (int k = 0; k < kTok; ++k) xs[k] = src[k * kChunk + u * kThreads];
#pragma unroll
      for (int mm = 0; mm < kMix; ++mm) ws[mm] = src[(kTok + mm) * kChunk + u * kThreads];
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
        ss[k] += xs[k] * xs[k];
#pragma unroll
        for (int mm = 0; mm < kMix; ++mm) acc[mm][k] += ws[mm] * xs[k];
      }
    }
  }
  cp_async_wait<0>();
  hc_mix_tile_reduce<kTok, kMix>(ss, acc, nt, t0, m0, width, nmix, norm_eps, mix_out);
}

// The tile by T: under kMixTileTokens one mix a block of 4 tokens, 8 loads a thread in flight (the
// weights' reads spread over nmix blocks; batch 1); from there 4 tokens x 8 mixes a block, from
// kMixManyTokens 8 x 8 (the weights read half as often); both staged through shared memory where
// the weights are f32 and the rows whole chunks (hc_mix_staged_kernel; `hc_staged` off: registers).
// The staged 4 x 8 tile is for decode batches: in registers, batch 256's 192 blocks held 24 loads a
// thread in flight and took 55 us a call for 18 MB (ncu, H200 2026-12-03).
constexpr int64_t kMixTileTokens = 16, kMixManyTokens = 2048;
constexpr int kStagedMix = 8, kStagedUnroll = 2, kStagedStages = 3;
template <int kTok>
void launch_hc_mix_staged(const float* streams, int64_t T, int64_t width, const float* fn, int64_t nmix, float norm_eps,
                          float* mix) {
  auto* kernel = hc_mix_staged_kernel<kTok, kStagedMix, kStagedUnroll, kStagedStages>;
  constexpr int smem = kStagedStages * (kTok + kStagedMix) * kStagedUnroll * kThreads * 4;
  static const bool attr = [&] {
    SPARROW_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr;
  launch(kernel, blocks_for(T, kTok) * static_cast<unsigned>(nmix / kStagedMix), kThreads, smem, streams, T, width, fn,
         nmix, norm_eps, mix, T < kMixManyTokens);
}
void launch_hc_mix(const float* streams, int64_t T, int64_t width, const DevView& fn, int64_t nmix, float norm_eps,
                        float* mix) {
  static const bool staged_on = cuda_feature_on("hc_staged");
  constexpr int64_t chunk = kStagedUnroll * kThreads;
  const bool staged = staged_on && nmix % kStagedMix == 0 && T >= kMixTileTokens && fn.dtype == DType::kF32 &&
                      width % chunk == 0 && aligned16(streams) && aligned16(fn.data);
  if (staged && T >= kMixManyTokens) {
    launch_hc_mix_staged<8>(streams, T, width, static_cast<const float*>(fn.data), nmix, norm_eps, mix);
  } else if (staged) {
    launch_hc_mix_staged<4>(streams, T, width, static_cast<const float*>(fn.data), nmix, norm_eps, mix);
  } else if (nmix % 8 == 0 && T >= kMixManyTokens) {
    launch(hc_mix_tile_kernel<8, 8, 2>, blocks_for(T, 8) * static_cast<unsigned>(nmix / 8), kThreads, 0, streams, T,
           width, fn, nmix, norm_eps, mix);
  } else if (nmix % 8 == 0 && T >= kMixTileTokens) {
    launch(hc_mix_tile_kernel<4, 8, 2>, blocks_for(T, 4) * static_cast<unsigned>(nmix / 8), kThreads, 0, streams, T,
           width, fn, nmix, norm_eps, mix);
  } else if (T >= 4) {
    launch(hc_mix_tile_kernel<4, 1, kMixUnroll>, blocks_for(T, 4) * static_cast<unsigned>(nmix), kThreads, 0, streams, T,
           width, fn, nmix, norm_eps, mix);
  } else {
    // One token a block, 16 loads a thread in flight: V4-Flash's 64 elements a thread in 4 rounds
    // (8 rounds of 8 loads: 12 us a call at batch 1 in ncu, H200).
    launch(hc_mix_tile_kernel<1, 1, 16>, static_cast<unsigned>(T * nmix), kThreads, 0, streams, T, width, fn, nmix,
           norm_eps, mix);
  }
}

// The token's nmix mix values into shared `mix`: computed here (hc_mix) or read from
// hc_mix_tile_kernel's output when `mix_in` is set.
__device__ void hc_mix_or_load(const float* X, int64_t width, const DevView& fn, int64_t nmix, float norm_eps,
                               const float* mix_in, float* mix) {
  if (mix_in == nullptr) return hc_mix(X, width, fn, nmix, norm_eps, mix);
  const int64_t t = blockIdx.x;
  for (int64_t m = threadIdx.x; m < nmix; m += blockDim.x) mix[m] = mix_in[t * nmix + m];
  __syncthreads();
}

// Each of the S lines of an S x S matrix (line l: m[l * line_step + i * elem_step], i < S) divided
// by its sum + eps, the sum in element order: rows with (S, 1), columns with (1, S).
__device__ inline void normalise_lines(float* m, int64_t S, int64_t line_step, int64_t elem_step, float eps) {
#pragma unroll
  for (int64_t l = 0; l < S; ++l) {
    float sum = 0.0f;
#pragma unroll
    for (int64_t i = 0; i < S; ++i) sum += m[l * line_step + i * elem_step];
#pragma unroll
    for (int64_t i = 0; i < S; ++i) m[l * line_step + i * elem_step] /= sum + eps;
  }
}

// mix * scale + base as the CPU reference computes it: a rounded product, then a rounded sum. Left
// to the compiler it became one fma where base and scale came by plain loads (a form of the fused
// boundary's Sinkhorn: comb 1-6 ulps off hc_pre4_kernel's at scales other than 1, H200) and two
// operations where they came through dev_load's switch; spelled out, the bits no longer depend on
// the loads.
__device__ inline float hc_affine(float mix, float scale, float base) { return __fadd_rn(__fmul_rn(mix, scale), base); }

// pre, post and comb of token t from its mix values, Sinkhorn with eps in every denominator (one
// thread; comb in local memory). S = 4 (V4's) takes hc_pre_weights_s4, a warp with the same bits.
__device__ void hc_pre_weights(const HcPreArgs& a, const float* mix, float* pre, int64_t t) {
  const int64_t S = a.S;
  const float eps = a.hc_eps;
  const float scale_pre = dev_load_call(a.scale, 0), scale_post = dev_load_call(a.scale, 1), scale_comb = dev_load_call(a.scale, 2);
  float comb[kMaxStreams * kMaxStreams];
#pragma unroll
  for (int64_t j = 0; j < S; ++j) {
    pre[j] = sigmoidf(hc_affine(mix[j], scale_pre, dev_load_call(a.base, j))) + eps;
    a.out_post[t * S + j] = 2.0f * sigmoidf(hc_affine(mix[S + j], scale_post, dev_load_call(a.base, S + j)));
  }
#pragma unroll
  for (int64_t j = 0; j < S; ++j) {
    // Row j: softmax over k, then + eps.
    float mx = -INFINITY;
#pragma unroll
    for (int64_t k = 0; k < S; ++k) {
      comb[j * S + k] = hc_affine(mix[2 * S + j * S + k], scale_comb, dev_load_call(a.base, 2 * S + j * S + k));
      mx = fmaxf(mx, comb[j * S + k]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int64_t k = 0; k < S; ++k) sum += (comb[j * S + k] = expf(comb[j * S + k] - mx));
#pragma unroll
    for (int64_t k = 0; k < S; ++k) comb[j * S + k] = comb[j * S + k] / sum + eps;
  }
  // Columns once, then (rows, columns) sinkhorn_iters - 1 times, as the CPU reference does.
  for (int64_t it = 0; it < (a.sinkhorn_iters > 1 ? a.sinkhorn_iters : 1); ++it) {
    if (it > 0) normalise_lines(comb, S, S, 1, eps);  // rows
    normalise_lines(comb, S, 1, S, eps);               // columns
  }
#pragma unroll
  for (int64_t i = 0; i < S * S; ++i) a.out_comb[t * S * S + i] = comb[i];
}

// The weights hc_pre_weights_s4 reads, a lane's share (model weights, never written by a kernel: a
// kernel may load them before its wait, under the previous kernel).
struct HcS4Weights {
  float scale_pre, scale_post, scale_comb;
  float base_pre, base_post, base_comb;  // base[lane], base[S + lane] (lanes < S), base[2S + lane % 16]
};

__device__ inline HcS4Weights hc_s4_weights(const HcPreArgs& a) {
  constexpr int S = 4;
  const int lane = threadIdx.x % 32;
  HcS4Weights w;
  w.scale_pre = dev_load_call(a.scale, 0), w.scale_post = dev_load_call(a.scale, 1), w.scale_comb = dev_load_call(a.scale, 2);
  w.base_pre = lane < S ? dev_load_call(a.base, lane) : 0.0f;
  w.base_post = lane < S ? dev_load_call(a.base, S + lane) : 0.0f;
  w.base_comb = dev_load_call(a.base, 2 * S + lane % (S * S));
  return w;
}

// hc_pre_weights for S = 4 by the 32 lanes of a warp (all of them must call it): lane 4j + k (< 16)
// holds comb[j][k]; a row's or column's sum is gathered by shuffles and added in hc_pre_weights'
// order (0 + v0 + v1 + v2 + v3), every division and exponential the same, so the results are its
// bits. One thread walking the 16 entries through 20 Sinkhorn iterations took 45 us a token (ncu on
// the H200, batch 1); here the 16 entries go side by side.
// Its two parts: pre and post (lanes < S; they need no Sinkhorn), then comb (the whole warp).
__device__ inline void hc_pre_post_s4(const HcPreArgs& a, const HcS4Weights& w, const float* mix, float* pre, int64_t t) {
  constexpr int S = 4;
  const int lane = threadIdx.x % 32;
  if (lane < S) {
    pre[lane] = sigmoidf(hc_affine(mix[lane], w.scale_pre, w.base_pre)) + a.hc_eps;
    a.out_post[t * S + lane] = 2.0f * sigmoidf(hc_affine(mix[S + lane], w.scale_post, w.base_post));
  }
}

__device__ void hc_comb_s4(const HcPreArgs& a, const HcS4Weights& w, const float* mix, int64_t t) {
  constexpr int S = 4;
  const int lane = threadIdx.x % 32, j = (lane / S) % S, k = lane % S, row0 = lane & ~(S - 1);
  const float eps = a.hc_eps;
  const float scale_comb = w.scale_comb;
  const auto row_at = [&](float v, int kk) { return __shfl_sync(0xffffffffu, v, (row0 + kk) & 31); };
  const auto col_at = [&](float v, int jj) { return __shfl_sync(0xffffffffu, v, jj * S + k); };
  // Row j: softmax over k, then + eps.
  float c = hc_affine(mix[2 * S + j * S + k], scale_comb, w.base_comb);  // j * S + k = lane % 16
  float mx = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < S; ++kk) mx = fmaxf(mx, row_at(c, kk));
  c = expf(c - mx);
  float sum = 0.0f;
#pragma unroll
  for (int kk = 0; kk < S; ++kk) sum += row_at(c, kk);
  c = c / sum + eps;
  // Columns once, then (rows, columns) sinkhorn_iters - 1 times, as the CPU reference does.
  for (int64_t it = 0; it < (a.sinkhorn_iters > 1 ? a.sinkhorn_iters : 1); ++it) {
    if (it > 0) {
      sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < S; ++kk) sum += row_at(c, kk);
      c /= sum + eps;
    }
    sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < S; ++jj) sum += col_at(c, jj);
    c /= sum + eps;
  }
  if (lane < S * S) a.out_comb[t * S * S + lane] = c;
}

__device__ inline void hc_pre_weights_s4(const HcPreArgs& a, const HcS4Weights& w, const float* mix, float* pre, int64_t t) {
  hc_pre_post_s4(a, w, mix, pre, t);
  hc_comb_s4(a, w, mix, t);
}

// out[t, d] = sum_j pre_j X[j * D + d] for this block's token, kRowUnroll columns a thread loaded
// before any is written (one column at a time, each store kept the next loads waiting; with the
// Sinkhorn warp, hc_pre at batch 1 went 0.115 -> 0.078 ms for its two calls on the H200).
constexpr int kRowUnroll = 8;
// kS > 0: S known at compile time, so all kRowUnroll x kS loads go out before the first add (with S
// at run time a thread's loads went out a stream at a time, by the source; hc_pre's two calls at
// batch 1 went 0.081 -> 0.076 ms with this on the H200). The same adds in the same order.
template <int kS>
__device__ inline void hc_collapse(const float* X, const float* pre, int64_t S, int64_t D, float* out, bool round_bf16) {
  for (int64_t d0 = threadIdx.x; d0 < D; d0 += kRowUnroll * blockDim.x) {
    float acc[kRowUnroll];
    if constexpr (kS > 0) {
      float x[kRowUnroll][kS];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u)
#pragma unroll
        for (int j = 0; j < kS; ++j) x[u][j] = d0 + u * blockDim.x < D ? X[j * D + d0 + u * blockDim.x] : 0.0f;
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        acc[u] = 0.0f;
#pragma unroll
        for (int j = 0; j < kS; ++j) acc[u] += pre[j] * x[u][j];
      }
    } else {
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t d = d0 + u * blockDim.x;
        acc[u] = 0.0f;
        if (d < D)
          for (int64_t j = 0; j < S; ++j) acc[u] += pre[j] * X[j * D + d];
      }
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (d0 + u * blockDim.x < D) out[d0 + u * blockDim.x] = round_bf16 ? dev_bf16_round(acc[u]) : acc[u];
  }
}

// grid (T): pre/post/comb of one token (hc_pre_weights), u = sum_j pre_j X[j].
__global__ void hc_pre_kernel(HcPreArgs a) {
  wait_previous_grid();
  __shared__ float mix[kMaxMix];
  __shared__ float pre[kMaxStreams];
  const int64_t t = blockIdx.x, S = a.S, D = a.D;
  const float* X = a.streams + t * S * D;
  hc_mix_or_load(X, S * D, a.fn, (2 + S) * S, a.norm_eps, a.mix, mix);
  if (S == 4) {
    if (threadIdx.x < 32) hc_pre_weights_s4(a, hc_s4_weights(a), mix, pre, t);
  } else if (threadIdx.x == 0) {
    hc_pre_weights(a, mix, pre, t);
  }
  __syncthreads();
  if (S == 4) hc_collapse<4>(X, pre, S, D, a.out_input + t * D, a.round_bf16);
  else hc_collapse<0>(X, pre, S, D, a.out_input + t * D, a.round_bf16);
}

// S = 4 with the mix values made beforehand (HcPreArgs::mix): `per_block` (at most kPre4Tokens)
// tokens a block, warp w the Sinkhorn of the block's token w (hc_pre_weights_s4), then the block's
// tokens' weighted stream sums 4 columns a thread (16-byte loads and stores, kPre4Unroll float4
// columns' loads before the adds). Each value's operations and their order are hc_pre_kernel's (the
// same bits). A block a token kept seven warps waiting on the eighth's Sinkhorn, at one block an SM
// (142 registers): an 8K prefill's hc_pre without its mix 1.01 -> 0.36 ms (two calls, H200); at 8
// and 256 tokens, 8 tokens a block left most SMs idle (0.033 -> 0.052 ms, 0.049 -> 0.056), so
// launch_hc_pre takes fewer tokens a block there. REQUIRES D % 4 == 0, 16-byte aligned streams and
// out_input.
constexpr int kPre4Tokens = kThreads / 32, kPre4Unroll = 4;
__global__ void __launch_bounds__(kThreads, 3) hc_pre4_kernel(HcPreArgs a, int per_block) {
  wait_previous_grid();
  constexpr int S = 4, nmix = (2 + S) * S;
  __shared__ float pre[kPre4Tokens][S];
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * per_block;
  const int w = threadIdx.x / 32;
  const int nt = a.T - t0 < per_block ? static_cast<int>(a.T - t0) : per_block;
  if (w < nt) hc_pre_weights_s4(a, hc_s4_weights(a), a.mix + (t0 + w) * nmix, pre[w], t0 + w);
  __syncthreads();
  const int64_t D4 = a.D / 4, total = nt * D4;
  for (int64_t i0 = threadIdx.x; i0 < total; i0 += kPre4Unroll * kThreads) {
    float4 x[kPre4Unroll][S];
#pragma unroll
    for (int u = 0; u < kPre4Unroll; ++u) {
      const int64_t i = i0 + u * kThreads;
      const int64_t t = t0 + (i < total ? i : 0) / D4, d = 4 * ((i < total ? i : 0) % D4);
#pragma unroll
      for (int j = 0; j < S; ++j)
        x[u][j] = i < total ? *reinterpret_cast<const float4*>(a.streams + (t * S + j) * a.D + d) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kPre4Unroll; ++u) {
      const int64_t i = i0 + u * kThreads;
      if (i >= total) break;
      const int k = static_cast<int>(i / D4);
      const int64_t d = 4 * (i % D4);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < S; ++j) {
        const float p = pre[k][j];
        acc.x += p * x[u][j].x;
        acc.y += p * x[u][j].y;
        acc.z += p * x[u][j].z;
        acc.w += p * x[u][j].w;
      }
      if (a.round_bf16)
        acc = make_float4(dev_bf16_round(acc.x), dev_bf16_round(acc.y), dev_bf16_round(acc.z), dev_bf16_round(acc.w));
      *reinterpret_cast<float4*>(a.out_input + (t0 + k) * a.D + d) = acc;
    }
  }
}

// One thread per (t, d): X'[k] = post_k y + sum_j comb[j][k] X[j] (comb applied transposed). The
// thread owns column d of all streams of token t, so the update is in place without a race.
__global__ void hc_post_kernel(HcPostArgs a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.T * a.D) return;
  const int64_t t = i / a.D, d = i % a.D, S = a.S;
  float* X = a.streams + t * S * a.D;
  const float* comb = a.comb + t * S * S;
  float x[kMaxStreams];
  for (int64_t j = 0; j < S; ++j) x[j] = X[j * a.D + d];
  const float y = a.sublayer[t * a.D + d];
  for (int64_t k = 0; k < S; ++k) {
    float acc = a.post[t * S + k] * y;
    for (int64_t j = 0; j < S; ++j) acc += comb[j * S + k] * x[j];
    X[k * a.D + d] = a.round_bf16 ? dev_bf16_round(acc) : acc;
  }
}

// The same for 4 columns a thread (D % 4 == 0, 16-byte aligned rows), S = kS: 16-byte loads and
// stores, each token's comb and post read once for 4 columns. Each value's operations and their
// order are hc_post_kernel's.
template <int kS>
__global__ void hc_post4_kernel(HcPostArgs a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D4 = a.D / 4;
  if (i >= a.T * D4) return;
  const int64_t t = i / D4, d = 4 * (i % D4);
  float* X = a.streams + t * kS * a.D;
  const float* comb = a.comb + t * kS * kS;
  float4 x[kS];
#pragma unroll
  for (int j = 0; j < kS; ++j) x[j] = *reinterpret_cast<const float4*>(X + j * a.D + d);
  const float4 y = *reinterpret_cast<const float4*>(a.sublayer + t * a.D + d);
#pragma unroll
  for (int k = 0; k < kS; ++k) {
    const float p = a.post[t * kS + k];
    float4 acc = make_float4(p * y.x, p * y.y, p * y.z, p * y.w);
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      const float c = comb[j * kS + k];
      acc.x += c * x[j].x;
      acc.y += c * x[j].y;
      acc.z += c * x[j].z;
      acc.w += c * x[j].w;
    }
    if (a.round_bf16) acc = make_float4(dev_bf16_round(acc.x), dev_bf16_round(acc.y), dev_bf16_round(acc.z), dev_bf16_round(acc.w));
    *reinterpret_cast<float4*>(X + k * a.D + d) = acc;
  }
}

// The mHC boundary (kernels.h HcBoundaryArgs) for S = 4 and D = 256 kCols: grid (T * nmix), block
// b making mix b % nmix of token b / nmix. Every block makes all of its token's new streams X' in
// registers (thread tid: column tid + 256 v of each stream; the sums of hc_post4_kernel) and its one
// mix value from them as hc_mix_tile_kernel makes it (the thread's elements tid, tid + 256, ... of
// the flattened streams in order, then hc_mix_tile_reduce). The streams are read by all nmix blocks
// of the token, so none writes them; the token's last block to arrive (an atomic count, reset by
// that block) reads the nmix values, writes X' from its registers, makes pre and post, then
// u = sum_j pre_j X'[j] (hc_pre4_kernel's sums) and u's RMS norm with the sums of the kernel
// launch_rms_norm picks for a row of D (a block's order above kNormWarpGroup, a warp's at or below
// it), and comb (hc_pre_weights_s4's Sinkhorn): above kNormWarpGroup on warp 0 while the other
// warps make their u and the norm's partial sums, below it before u. Each value's operations and
// their order are those of the three ops' kernels, for the same bits
// (CudaOps.HcBoundaryIsItsThreeOpsBitForBit). The weights (the f32 mix row; the norm's, bf16 or
// f32; the Sinkhorn warp's scales and bases) are loaded into registers before the wait for the
// previous grid (weights are never written). Sizes, dtypes and the rounding are
// compile-time: a first form with dev_load's switch over every stored dtype at each of its 80
// weight loads, the column count and the roundings at run time was 9.7K instructions, and at one
// block an SM its warps waited on instruction fetch (62 % of the stall samples; 38.5 us in ncu on
// the H200, against 24 us for the four kernels it replaces).
template <int kCols, bool kRound>
__global__ void __launch_bounds__(kThreads) hc_boundary_kernel(HcBoundaryArgs a) {
  constexpr int S = 4, nmix = (2 + S) * S;
  constexpr int64_t D = static_cast<int64_t>(kCols) * kThreads, width = S * D;
  const HcPreArgs& p = a.pre;
  const int64_t t = blockIdx.x / nmix, m = blockIdx.x % nmix;
  const int tid = threadIdx.x;
  const auto round = [](float v) {
    if constexpr (kRound) return dev_bf16_round(v);
    else return v;
  };
  float w[S][kCols], nw[kCols];
  const float* fn = static_cast<const float*>(p.fn.data) + m * width + tid;
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int v = 0; v < kCols; ++v) w[s][v] = fn[s * D + v * kThreads];
  if (a.norm_weight.data == nullptr) {
#pragma unroll
    for (int v = 0; v < kCols; ++v) nw[v] = 1.0f;
  } else if (a.norm_weight.dtype == DType::kBF16) {
    const uint16_t* src = static_cast<const uint16_t*>(a.norm_weight.data) + tid;
#pragma unroll
    for (int v = 0; v < kCols; ++v) nw[v] = dev_bf16(src[v * kThreads]);
  } else {
    const float* src = static_cast<const float*>(a.norm_weight.data) + tid;
#pragma unroll
    for (int v = 0; v < kCols; ++v) nw[v] = src[v * kThreads];
  }
  HcS4Weights sinkhorn_w{};
  if (tid < 32) sinkhorn_w = hc_s4_weights(p);
  wait_previous_grid();
  float* X = const_cast<float*>(p.streams) + t * width + tid;  // (written: hc_post's in/out)
  float x[kCols][S];
#pragma unroll
  for (int v = 0; v < kCols; ++v)
#pragma unroll
    for (int j = 0; j < S; ++j) x[v][j] = X[j * D + v * kThreads];
  if (a.sublayer != nullptr) {
    float pk[S], c[S][S];
#pragma unroll
    for (int k = 0; k < S; ++k) pk[k] = a.post[t * S + k];
#pragma unroll
    for (int j = 0; j < S; ++j)
#pragma unroll
      for (int k = 0; k < S; ++k) c[j][k] = a.comb[t * S * S + j * S + k];
    const float* ys = a.sublayer + t * D + tid;
#pragma unroll
    for (int v = 0; v < kCols; ++v) {
      const float y = ys[v * kThreads];
      float xn[S];
#pragma unroll
      for (int k = 0; k < S; ++k) {
        float acc = pk[k] * y;
#pragma unroll
        for (int j = 0; j < S; ++j) acc += c[j][k] * x[v][j];
        xn[k] = round(acc);
      }
#pragma unroll
      for (int k = 0; k < S; ++k) x[v][k] = xn[k];
    }
  }
  float ss[1] = {0.0f}, acc[1][1] = {{0.0f}};
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int v = 0; v < kCols; ++v) {
      ss[0] += x[v][s] * x[v][s];
      acc[0][0] += w[s][v] * x[v][s];
    }
  hc_mix_tile_reduce<1, 1>(ss, acc, 1, t, m, width, nmix, p.norm_eps, p.mix);  // thread 0 writes the value
  __shared__ bool last;
  if (tid == 0) {
    __threadfence();  // the mix value visible before the count says it is there
    last = atomicAdd(a.arrivals + t, 1u) == nmix - 1;
    if (last) {
      __threadfence();
      atomicExch(a.arrivals + t, 0u);  // every block of the token has counted: ready for the next call
    }
  }
  __syncthreads();
  if (!last) return;

  // The mix values' load goes out first; every block of the token has read the streams (before it
  // counted), so X' goes out next, its stores under that load and the Sinkhorn warp, whose weights
  // were loaded before the wait (against the stores after the Sinkhorn and those loads after the
  // wait: the 8-layer step 0.5-2.0 % shorter, this kernel 12.6 -> 11.8 us in ncu, H100, 2026-12-07).
  __shared__ float mix[nmix];
  __shared__ float pre[S];
  const float mix_value = tid < nmix ? __ldcg(p.mix + t * nmix + tid) : 0.0f;
  if (a.sublayer != nullptr)
#pragma unroll
    for (int v = 0; v < kCols; ++v)
#pragma unroll
      for (int k = 0; k < S; ++k) X[k * D + v * kThreads] = x[v][k];
  if (tid < nmix) mix[tid] = mix_value;
  __syncthreads();
  float u[kCols];
  const auto make_u = [&] {
#pragma unroll
    for (int v = 0; v < kCols; ++v) {
      float acc2 = 0.0f;
#pragma unroll
      for (int j = 0; j < S; ++j) acc2 += pre[j] * x[v][j];
      u[v] = round(acc2);
    }
  };
  const auto write_out = [&](float sq) {
    const float inv = 1.0f / sqrtf(sq / static_cast<float>(D) + a.norm_eps);
    float* out = p.out_input + t * D + tid;
#pragma unroll
    for (int v = 0; v < kCols; ++v) {
      float o = u[v] * inv;
      if (a.norm_weight.data) o *= nw[v];
      out[v * kThreads] = round(o);
    }
  };
  if constexpr (D > kNormWarpGroup) {
    // u and its norm need pre, not comb: warp 0 takes pre and post, its columns' u and their
    // squares' warp sum, then the Sinkhorn (comb), and writes its outputs after it; warps 1-7 take
    // their columns' u and the norm meanwhile. The squares' sums are block_sum's (each warp's
    // warp_sum, then the 8 partials in warp order), handed over by named barriers: 1 (pre
    // written), 2 (every partial written), 3 (warps 1-7 past 2, for warp 0). Sequential, the
    // Sinkhorn and then the norm were both on the chain.
    __shared__ float partial[kThreads / 32];
    const int warp = tid / 32, lane = tid % 32;
    const auto my_partial = [&] {
      float sq = 0.0f;
#pragma unroll
      for (int v = 0; v < kCols; ++v) sq += u[v] * u[v];
      sq = warp_sum(sq);
      if (lane == 0) partial[warp] = sq;
    };
    const auto block_total = [&] {
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
      return total;
    };
    if (warp == 0) {
      hc_pre_post_s4(p, sinkhorn_w, mix, pre, t);
      __syncwarp();
      named_barrier_arrive(1, kThreads);
      make_u();
      my_partial();
      named_barrier_arrive(2, kThreads);
      hc_comb_s4(p, sinkhorn_w, mix, t);
      named_barrier_sync(3, kThreads);
    } else {
      named_barrier_sync(1, kThreads);
      make_u();
      my_partial();
      named_barrier_sync(2, kThreads);
      named_barrier_arrive(3, kThreads);
    }
    write_out(block_total());
  } else {
    if (tid < 32) hc_pre_weights_s4(p, sinkhorn_w, mix, pre, t);
    __syncthreads();
    make_u();
    // A warp's order: lane l's squares of elements l, l + 32, ... (rms_norm_warp_kernel).
    __shared__ float row[D];
    __shared__ float total;
#pragma unroll
    for (int v = 0; v < kCols; ++v) row[tid + v * kThreads] = u[v];
    __syncthreads();
    if (tid < 32) {
      float l2 = 0.0f;
      for (int i = tid; i < D; i += 32) l2 += row[i] * row[i];
      l2 = warp_sum(l2);
      if (tid == 0) total = l2;
    }
    __syncthreads();
    write_out(total);
  }
}

// grid (T): the final stream collapse (spec §3.6): no post, no comb, no Sinkhorn.
__global__ void hc_head_kernel(HcHeadArgs a) {
  wait_previous_grid();
  __shared__ float mix[kMaxStreams];
  __shared__ float pre[kMaxStreams];
  const int64_t t = blockIdx.x, S = a.S, D = a.D;
  const float* X = a.streams + t * S * D;
  hc_mix_or_load(X, S * D, a.fn, S, a.norm_eps, a.mix, mix);
  if (threadIdx.x < S) pre[threadIdx.x] = sigmoidf(hc_affine(mix[threadIdx.x], dev_load_call(a.scale, 0), dev_load_call(a.base, threadIdx.x))) + a.hc_eps;
  __syncthreads();
  if (S == 4) hc_collapse<4>(X, pre, S, D, a.out + t * D, a.round_bf16);
  else hc_collapse<0>(X, pre, S, D, a.out + t * D, a.round_bf16);
}

// y[i] = x[i] * inv [* w[i]] (bf16-rounded when asked) for i = first, first + step, ... < n: kRowUnroll
// elements' loads before their stores (y may alias x, so one at a time each store held back the next
// loads: 12 us for a batch-1 row of 4096).
__device__ inline void rms_norm_write(const RmsNormArgs& a, const float* x, float* y, float inv, int64_t first,
                                      int64_t step, int64_t n) {
  for (int64_t i0 = first; i0 < n; i0 += kRowUnroll * step) {
    float v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t i = i0 + u * step;
      v[u] = 0.0f;
      if (i < n) {
        v[u] = x[i] * inv;
        if (a.weight.data) v[u] *= dev_load_hot(a.weight, i);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (i0 + u * step < n) y[i0 + u * step] = a.round_bf16 ? dev_bf16_round(v[u]) : v[u];
  }
}

// A row of at most kPer * step elements held in registers: the values this thread owns (first,
// first + step, ...) and their weights all loaded at once, the squares added in that order (the
// loop kernels' order), and after `reduce` (the row's total from the thread's sum) every value
// written as rms_norm_write writes it.
template <int kPer, typename Reduce>
__device__ inline void rms_norm_row_regs(const RmsNormArgs& a, const float* x, float* y, int first, int step,
                                         Reduce reduce) {
  const int n = static_cast<int>(a.group);
  float xs[kPer], ws[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) xs[u] = first + u * step < n ? x[first + u * step] : 0.0f;
  dev_load_many(a.weight, first, step, n, 1.0f, ws);  // (the weights' loads all at once)
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (first + u * step < n) ss += xs[u] * xs[u];
  ss = reduce(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.group) + a.eps);
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int i = first + u * step;
    if (i >= n) break;
    float v = xs[u] * inv;
    if (a.weight.data) v *= ws[u];
    y[i] = a.round_bf16 ? dev_bf16_round(v) : v;
  }
}

// The norm's weight (one group's values) into L2 before the wait for the previous grid (a hint;
// device_common.cuh).
__device__ inline void prefetch_norm_weight(const RmsNormArgs& a, int thread, int threads) {
  if (a.weight.data) prefetch_l2(a.weight.data, a.group * dev_float_bytes(a.weight.dtype), thread, threads);
}

// grid (rows): y = x * rsqrt(mean(x^2) + eps) [* w] over one group, rounded to bf16 when asked.
// Every value is read before block_sum's barrier and written after it, so out may alias in.
// kPer > 0: the row in registers (rms_norm_row_regs; group <= kPer * blockDim.x).
template <int kPer>
__global__ void rms_norm_kernel(RmsNormArgs a) {
  prefetch_norm_weight(a, threadIdx.x, blockDim.x);
  wait_previous_grid();
  const int64_t r = blockIdx.x;
  const float* x = a.in + r * a.group;
  float* y = a.out + r * a.group;
  if constexpr (kPer > 0) {
    rms_norm_row_regs<kPer>(a, x, y, threadIdx.x, blockDim.x, [](float v) { return block_sum(v); });
    return;
  }
  // Each thread's squares in order, kMixUnroll loads ahead (one at a time, a batch-1 row of 4096
  // waited on 16 loads in turn).
  float ss = 0.0f;
  const int64_t step = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < a.group; i0 += kMixUnroll * step) {
    float xs[kMixUnroll];
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u) xs[u] = i0 + u * step < a.group ? x[i0 + u * step] : 0.0f;
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u)
      if (i0 + u * step < a.group) ss += xs[u] * xs[u];
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.group) + a.eps);
  rms_norm_write(a, x, y, inv, threadIdx.x, blockDim.x, a.group);
}

// Groups of at most kNormWarpGroup (the q heads' 512, the q_lora rank's 1024): a warp a row,
// kThreads / 32 rows a block (a 256-thread block a row left most threads idle on 2 values each of
// the 8K prefill's 524,288 q-head rows; rms_norm's 5 calls there went 2.48 -> 0.84 ms on the H200). Lane l sums the squares of elements l, l + 32, ...
// in order, then warp_sum; the row's arithmetic does not depend on how many rows there are.
// kPer > 0: the row in registers (rms_norm_row_regs; group <= 32 kPer).
template <int kPer>
__global__ void __launch_bounds__(kThreads, 2) rms_norm_warp_kernel(RmsNormArgs a) {
  prefetch_norm_weight(a, threadIdx.x, blockDim.x);
  wait_previous_grid();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (r >= a.rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const float* x = a.in + r * a.group;
  float* y = a.out + r * a.group;
  if constexpr (kPer > 0) {
    rms_norm_row_regs<kPer>(a, x, y, lane, 32, [](float v) { return warp_sum(v); });
    return;
  }
  const int group = static_cast<int>(a.group);
  float ss = 0.0f;
  for (int i0 = lane; i0 < group; i0 += kMixUnroll * 32) {
    float xs[kMixUnroll];
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u) xs[u] = i0 + 32 * u < group ? x[i0 + 32 * u] : 0.0f;
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u)
      if (i0 + 32 * u < group) ss += xs[u] * xs[u];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.group) + a.eps);
  rms_norm_write(a, x, y, inv, lane, 32, a.group);
}

// A block a token: the token's angles once (each pair's sincos in double, as rope_rotate_pair), then
// every (head, pair) of the token rotated with them: the same operations as one thread per (t, head,
// pair) computing its own sincos (which the 64 q heads repeated 64 times). The sincos was not the
// cost: rope's 3 calls in an 8K prefill went only 1.90 -> 1.86 ms on the H200.
//
// The angles come before the wait for the previous grid (device_common.cuh): the positions are the
// batch's, uploaded from the host, and the table is an argument; no kernel writes either.
//
// grid (T, head blocks): block y rotates heads [y * heads_per, (y + 1) * heads_per) of its token
// (launch_rope: one block a token for large T; at a decode batch's few tokens the heads spread over
// blocks of 8, each computing the token's angles itself: the same values).
__global__ void rope_kernel(RopeArgs a, int64_t heads_per) {
  __shared__ double cs[kMaxRopePairs], sn[kMaxRopePairs];
  const int64_t t = blockIdx.x;
  const int pairs = a.table.pairs;
  const double pos = static_cast<double>(a.positions[t]);
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) rope_angle(pos, a.table, i, a.inverse, cs[i], sn[i]);
  wait_previous_grid();
  __syncthreads();
  // kRowUnroll pairs a thread read before any is written (each write held back the next reads).
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * heads_per;
  const int64_t total = (a.n - h0 < heads_per ? a.n - h0 : heads_per) * pairs;
  for (int64_t j0 = threadIdx.x; j0 < total; j0 += kRowUnroll * blockDim.x) {
    float2 v[kRowUnroll];
    float* at[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t j = j0 + u * blockDim.x;
      at[u] = j < total ? a.x + (t * a.n + h0 + j / pairs) * a.width + (a.width - 2 * pairs) + 2 * (j % pairs) : nullptr;
      if (at[u]) v[u] = make_float2(at[u][0], at[u][1]);
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      if (!at[u]) continue;
      const int i = static_cast<int>((j0 + u * blockDim.x) % pairs);
      const float2 r = rope_rotated(v[u].x, v[u].y, cs[i], sn[i]);
      at[u][0] = a.round_bf16 ? dev_bf16_round(r.x) : r.x, at[u][1] = a.round_bf16 ? dev_bf16_round(r.y) : r.y;
    }
  }
}

__global__ void window_append_kernel(WindowAppendArgs a) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.T * a.Dh) return;
  const int64_t t = i / a.Dh, d = i % a.Dh;
  if (a.dst[t]) a.dst[t][d] = a.kv[i];
  if (a.dst_bf16 && a.dst_bf16[t]) a.dst_bf16[t][d] = __bfloat16_as_ushort(__float2bfloat16_rn(a.kv[i]));
}

__global__ void gather_rows_kernel(float* out, const float* in, const int64_t* rows, int64_t n, int64_t width) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t r = i / width;
  out[i] = in[rows[r] * width + i % width];
}

__global__ void copy_i32_kernel(int32_t* out, const int32_t* in, int64_t n) {
  wait_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// A captured step's fills and uploads as kernels (kernels.h launch_fill_bytes, launch_upload_pinned).
// The fill waits first: the bytes may be an arena block the kernel before still reads. The upload
// reads its pinned host bytes (a step's staging, which no kernel writes; __ldcv: fetched again on
// every replay, as the host rewrites the slot between steps) before the wait, so that the PCIe
// round trip overlaps the kernel before it, and writes after it.
constexpr int kCopyWords = 4;  // 16-byte words a thread of fill_bytes_kernel / upload_pinned_kernel

__global__ void fill_bytes_kernel(uint8_t* p, uint32_t byte, int64_t bytes) {
  wait_previous_grid();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kCopyWords + threadIdx.x;
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {  // byte by byte, over the block's share
    const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 16 * kCopyWords;
    const int64_t end = base + static_cast<int64_t>(blockDim.x) * 16 * kCopyWords;
    for (int64_t j = base + threadIdx.x; j < bytes && j < end; j += blockDim.x) p[j] = static_cast<uint8_t>(byte);
    return;
  }
  const uint32_t w = byte * 0x01010101u;
  const uint4 v = make_uint4(w, w, w, w);
  const int64_t words = bytes / 16;
#pragma unroll
  for (int u = 0; u < kCopyWords; ++u) {
    const int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (i < words) reinterpret_cast<uint4*>(p)[i] = v;
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes % 16) p[16 * words + threadIdx.x] = static_cast<uint8_t>(byte);
}

__global__ void upload_pinned_kernel(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kCopyWords + threadIdx.x;
  const bool aligned = reinterpret_cast<uintptr_t>(dst) % 16 == 0;  // (src is: launch_upload_pinned)
  const int64_t words = bytes / 16;
  uint4 v[kCopyWords];
#pragma unroll
  for (int u = 0; u < kCopyWords; ++u) {
    const int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (aligned && i < words) v[u] = __ldcv(reinterpret_cast<const uint4*>(src) + i);
  }
  wait_previous_grid();
  if (!aligned) {  // byte by byte, over the block's share
    const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 16 * kCopyWords;
    const int64_t end = base + static_cast<int64_t>(blockDim.x) * 16 * kCopyWords;
    for (int64_t j = base + threadIdx.x; j < bytes && j < end; j += blockDim.x)
      dst[j] = __ldcv(reinterpret_cast<const unsigned char*>(src) + j);
    return;
  }
#pragma unroll
  for (int u = 0; u < kCopyWords; ++u) {
    const int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (i < words) reinterpret_cast<uint4*>(dst)[i] = v[u];
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes % 16)
    dst[16 * words + threadIdx.x] = __ldcv(reinterpret_cast<const unsigned char*>(src) + 16 * words + threadIdx.x);
}

// Block per row: each thread walks its elements in index order (4 at a time where the row is
// whole 16-byte words) keeping the first best, then the block reduces (value, index) pairs by
// argmax_first's order (NaN above every number, then the lower index), which is a total order, so
// any reduction tree gives the host's answer.
__device__ inline bool argmax_better(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The warp's best (value, index) pair, in every lane.
__device__ inline void argmax_warp(float& best, int& bi) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (argmax_better(ob, oi, best, bi)) best = ob, bi = oi;
  }
}

constexpr int kArgmaxThreads = 512;

template <bool kVec4>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* in, int32_t* out, int64_t width) {
  wait_previous_grid();
  const float* row = in + static_cast<int64_t>(blockIdx.x) * width;
  float best = -INFINITY;
  int bi = INT_MAX;
  const int n = static_cast<int>(width);
  if constexpr (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int c = threadIdx.x; c < n / 4; c += kArgmaxThreads) {
      const float4 v = row4[c];
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (argmax_better(e[j], 4 * c + j, best, bi)) best = e[j], bi = 4 * c + j;
    }
  } else {
    for (int i = threadIdx.x; i < n; i += kArgmaxThreads)
      if (argmax_better(row[i], i, best, bi)) best = row[i], bi = i;
  }
  argmax_warp(best, bi);
  __shared__ float s_best[kArgmaxThreads / 32];
  __shared__ int s_bi[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_best[warp] = best, s_bi[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    best = lane < kArgmaxThreads / 32 ? s_best[lane] : -INFINITY;
    bi = lane < kArgmaxThreads / 32 ? s_bi[lane] : INT_MAX;
    argmax_warp(best, bi);
    if (lane == 0) out[blockIdx.x] = bi;
  }
}

}  // namespace

void launch_gather_rows(float* out, const float* in, const int64_t* rows, int64_t n, int64_t width) {
  if (n * width > 0) launch(gather_rows_kernel, blocks_for(n * width, kThreads), kThreads, 0, out, in, rows, n, width);
}

void launch_copy_i32(int32_t* out, const int32_t* in, int64_t n) {
  if (n > 0) launch(copy_i32_kernel, blocks_for(n, kThreads), kThreads, 0, out, in, n);
}

void launch_fill_bytes(void* p, uint8_t byte, int64_t bytes) {
  if (bytes > 0)
    launch(fill_bytes_kernel, blocks_for(bytes, 16 * kCopyWords * kThreads), kThreads, 0, static_cast<uint8_t*>(p),
           static_cast<uint32_t>(byte), bytes);
}

void launch_upload_pinned(void* dst, const void* src, int64_t bytes) {
  SPARROW_CHECK(reinterpret_cast<uintptr_t>(src) % 16 == 0);
  if (bytes > 0)
    launch(upload_pinned_kernel, blocks_for(bytes, 16 * kCopyWords * kThreads), kThreads, 0, static_cast<uint8_t*>(dst),
           static_cast<const uint8_t*>(src), bytes);
}

void launch_argmax_rows(int32_t* out, const float* in, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  if (width % 4 == 0 && aligned16(in))
    launch(argmax_rows_kernel<true>, static_cast<unsigned>(rows), kArgmaxThreads, 0, in, out, width);
  else
    launch(argmax_rows_kernel<false>, static_cast<unsigned>(rows), kArgmaxThreads, 0, in, out, width);
}

void launch_embed(const EmbedArgs& a) {
  if (a.T > 0) launch(embed_kernel, static_cast<unsigned>(a.T), kThreads, 0, a);
}

void launch_hc_pre_mix(const HcPreArgs& a) {
  if (a.T > 0 && a.mix) launch_hc_mix(a.streams, a.T, a.S * a.D, a.fn, (2 + a.S) * a.S, a.norm_eps, a.mix);
}

void launch_hc_pre(const HcPreArgs& a) {
  if (a.T <= 0) return;
  static const bool pre4_on = cuda_feature_on("hc_pre4");
  if (pre4_on && a.S == 4 && a.mix && a.D % 4 == 0 && aligned16(a.streams) && aligned16(a.out_input)) {
    // 8 tokens a block where that still gives every SM a few blocks (an 8K prefill), else fewer.
    const int per_block = a.T >= 4096 ? kPre4Tokens : a.T >= 2048 ? 4 : a.T >= 1024 ? 2 : 1;
    launch(hc_pre4_kernel, blocks_for(a.T, per_block), kThreads, 0, a, per_block);
  } else {
    launch(hc_pre_kernel, static_cast<unsigned>(a.T), kThreads, 0, a);
  }
}

void launch_hc_post(const HcPostArgs& a) {
  if (a.T * a.D <= 0) return;
  if (a.S == 4 && a.D % 4 == 0 && aligned16(a.streams) && aligned16(a.sublayer))
    launch(hc_post4_kernel<4>, blocks_for(a.T * a.D / 4, kThreads), kThreads, 0, a);
  else
    launch(hc_post_kernel, blocks_for(a.T * a.D, kThreads), kThreads, 0, a);
}

bool hc_boundary_fits(int64_t T, int64_t S, int64_t D, bool f32_mix_weights, DType norm_weight) {
  return S == 4 && T >= 1 && T <= kHcBoundaryMaxTokens && (D == 16 * kThreads || D == 2 * kThreads) &&
         f32_mix_weights && (norm_weight == DType::kF32 || norm_weight == DType::kBF16);
}

bool hc_boundary_fits(int64_t T, int64_t S, int64_t D, const DevView& fn, const DevView& base, const DevView& scale,
                      const DevView& norm_weight) {
  const bool f32 = fn.dtype == DType::kF32 && base.dtype == DType::kF32 && scale.dtype == DType::kF32;
  return hc_boundary_fits(T, S, D, f32, norm_weight.data ? norm_weight.dtype : DType::kF32);
}

void launch_hc_boundary(const HcBoundaryArgs& a) {
  SPARROW_CHECK(hc_boundary_fits(a.pre.T, a.pre.S, a.pre.D, a.pre.fn, a.pre.base, a.pre.scale, a.norm_weight) &&
                a.pre.mix != nullptr && a.arrivals != nullptr);
  const unsigned blocks = static_cast<unsigned>(a.pre.T * (2 + a.pre.S) * a.pre.S);
  if (a.pre.D == 16 * kThreads) {
    if (a.round_bf16) launch(hc_boundary_kernel<16, true>, blocks, kThreads, 0, a);
    else launch(hc_boundary_kernel<16, false>, blocks, kThreads, 0, a);
  } else {
    if (a.round_bf16) launch(hc_boundary_kernel<2, true>, blocks, kThreads, 0, a);
    else launch(hc_boundary_kernel<2, false>, blocks, kThreads, 0, a);
  }
}

void launch_hc_head(const HcHeadArgs& a) {
  if (a.T <= 0) return;
  if (a.mix) launch_hc_mix(a.streams, a.T, a.S * a.D, a.fn, a.S, a.norm_eps, a.mix);
  launch(hc_head_kernel, static_cast<unsigned>(a.T), kThreads, 0, a);
}

constexpr int64_t kNormRegsMaxValues = int64_t{1} << 23;  // 256 tokens' 64 q heads of 512
void launch_rms_norm(const RmsNormArgs& a) {
  if (a.rows <= 0) return;
  // Rows in registers when they fit and the call is small (decode batches: latency-bound), the loops
  // for a prefill's large calls. Both make the same sums in the same order and the same products (the
  // same bits; `norm_regs` off: always the loops), so the choice by size keeps a row's bits
  // independent of the batch. On the H200, 2026-12-02, layer 0: a batch-1 step's 5 norms 0.059 ->
  // 0.029 ms, batch 256 0.070 -> 0.044; an 8K prefill's 0.79 ms rose to 0.84 with every call in
  // registers, hence the bound.
  static const bool regs = cuda_feature_on("norm_regs");
  const unsigned warp_blocks = blocks_for(a.rows, kThreads / 32);
  if (!regs || a.rows * a.group > kNormRegsMaxValues) {
    if (a.group <= kNormWarpGroup) launch(rms_norm_warp_kernel<0>, warp_blocks, kThreads, 0, a);
    else launch(rms_norm_kernel<0>, static_cast<unsigned>(a.rows), kThreads, 0, a);
  } else if (a.group <= 32 * 16) launch(rms_norm_warp_kernel<16>, warp_blocks, kThreads, 0, a);
  else if (a.group <= 32 * 32) launch(rms_norm_warp_kernel<32>, warp_blocks, kThreads, 0, a);
  else if (a.group <= kNormWarpGroup) launch(rms_norm_warp_kernel<0>, warp_blocks, kThreads, 0, a);
  else if (a.group <= kThreads * 16) launch(rms_norm_kernel<16>, static_cast<unsigned>(a.rows), kThreads, 0, a);
  else launch(rms_norm_kernel<0>, static_cast<unsigned>(a.rows), kThreads, 0, a);
}

// Heads a block at a decode batch's token counts (below kRopeSpreadTokens; `rope_spread` off: all of
// a token's heads in one block): 8 (one pair a thread at V4's 32 pairs), so q's 64 heads take 8
// blocks; the batch-1 step's ropes held its chain 2-5.5 us each in one block (H200, 2026-12-03).
constexpr int64_t kRopeSpreadTokens = 32, kRopeSpreadHeads = 8;
void launch_rope(const RopeArgs& a) {
  if (a.T <= 0 || a.n * a.table.pairs <= 0) return;
  static const bool spread_on = cuda_feature_on("rope_spread");
  const int64_t per = spread_on && a.T < kRopeSpreadTokens ? kRopeSpreadHeads : a.n;
  launch(rope_kernel, dim3(static_cast<unsigned>(a.T), static_cast<unsigned>((a.n + per - 1) / per)), kThreads, 0, a, per);
}

void launch_window_append(const WindowAppendArgs& a) {
  if (a.T * a.Dh > 0) launch(window_append_kernel, blocks_for(a.T * a.Dh, kThreads), kThreads, 0, a);
}

cudaError_t set_kernel_trace_attention(KernelTraceSlot* region);
cudaError_t set_kernel_trace_fp8(KernelTraceSlot* region);
cudaError_t set_kernel_trace_linear(KernelTraceSlot* region);
cudaError_t set_kernel_trace_moe(KernelTraceSlot* region);
void set_kernel_trace(KernelTraceSlot* region) {
  for (cudaError_t e : {set_kernel_trace_here(region), set_kernel_trace_attention(region), set_kernel_trace_fp8(region),
                        set_kernel_trace_linear(region), set_kernel_trace_moe(region)})
    SPARROW_CUDA_CHECK(e);
}

}  // namespace sparrow::cuda
