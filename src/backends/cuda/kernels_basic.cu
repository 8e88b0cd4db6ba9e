// Embedding, mHC (pre with Sinkhorn, post, head), RMS norms, RoPE and window appends.
// One block per token (or per normalised group) where a reduction is needed, one thread per
// element otherwise. Formulas: spec §3.0-§3.2, §3.6; they mirror src/backends/cpu/cpu_backend.cpp.
#include "backends/cuda/device_common.cuh"

namespace sparrow::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxMix = (2 + kMaxStreams) * kMaxStreams;

__device__ inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (T), block over D: every stream a copy of the embedding row.
__global__ void embed_kernel(EmbedArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t id = a.ids[t];
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

// grid (T, nmix): one mix value per block, into mix_out[t * nmix + m]: the sums hc_mix makes, each
// thread accumulating the same elements in the same order and the block reducing with the same
// block_sum, so the values are hc_mix's bit for bit. hc_mix runs the nmix dot products of a token
// one after another in one block (one SM reading 24 x 64 KB for V4-Flash's 4 x 4096 streams: 0.67 ms
// a call on the H200 at batch 1); here they run in nmix blocks side by side, and each thread loads
// kMixUnroll of its elements before adding them in order (0.09 ms a call with one load at a time:
// at batch 1 the 24 blocks wait on memory latency).
constexpr int kMixUnroll = 8;
// Tokens a block: each weight load serves kMixTokens tokens (one token a block read the 1.5 MB of
// weights once per token: 8 ms of an 8K prefill). Each token's sums are the one-token block's, in
// the same order and through the same block_sum.
constexpr int kMixTokens = 4;

// grid (ceil(T / kMixTokens), nmix).
__global__ void hc_mix_rows_kernel(const float* streams, int64_t T, int64_t width, DevView fn, int64_t nmix,
                                   float norm_eps, float* mix_out) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kMixTokens, m = blockIdx.y;
  const int nt = T - t0 < kMixTokens ? static_cast<int>(T - t0) : kMixTokens;
  const int64_t step = blockDim.x;
  float ss[kMixTokens] = {}, acc[kMixTokens] = {};
  for (int64_t i0 = threadIdx.x; i0 < width; i0 += kMixUnroll * step) {
    float ws[kMixUnroll], xs[kMixTokens][kMixUnroll];
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u) {
      const int64_t i = i0 + u * step;
      ws[u] = i < width ? (fn.dtype == DType::kF32 ? static_cast<const float*>(fn.data)[m * width + i]
                                                   : dev_load(fn, m * width + i))
                        : 0.0f;
#pragma unroll
      for (int k = 0; k < kMixTokens; ++k) xs[k][u] = i < width && k < nt ? streams[(t0 + k) * width + i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kMixUnroll; ++u) {
      if (i0 + u * step >= width) break;
#pragma unroll
      for (int k = 0; k < kMixTokens; ++k) {
        ss[k] += xs[k][u] * xs[k][u];
        acc[k] += ws[u] * xs[k][u];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kMixTokens; ++k) {
    const float s2 = block_sum(ss[k]);
    const float a2 = block_sum(acc[k]);
    const float r = 1.0f / sqrtf(s2 / static_cast<float>(width) + norm_eps);
    if (threadIdx.x == 0 && k < nt) mix_out[(t0 + k) * nmix + m] = a2 * r;
  }
}

// The token's nmix mix values into shared `mix`: computed here (hc_mix) or read from
// hc_mix_rows_kernel's output when `mix_in` is set.
__device__ void hc_mix_or_load(const float* X, int64_t width, const DevView& fn, int64_t nmix, float norm_eps,
                               const float* mix_in, float* mix) {
  if (mix_in == nullptr) return hc_mix(X, width, fn, nmix, norm_eps, mix);
  const int64_t t = blockIdx.x;
  for (int64_t m = threadIdx.x; m < nmix; m += blockDim.x) mix[m] = mix_in[t * nmix + m];
  __syncthreads();
}

// pre, post and comb of token t from its mix values, Sinkhorn with eps in every denominator (one
// thread). kS > 0: the stream count known at compile time (V4's 4), so the loops unroll and comb
// lives in registers; 0: a.S at run time, comb in local memory (whose dependent accesses made this
// 60 us a call on the H200). The same operations in the same order either way.
template <int kS>
__device__ void hc_pre_weights(const HcPreArgs& a, const float* mix, float* pre, int64_t t) {
  const int64_t S = kS > 0 ? kS : a.S;
  const float eps = a.hc_eps;
  const float scale_pre = dev_load(a.scale, 0), scale_post = dev_load(a.scale, 1), scale_comb = dev_load(a.scale, 2);
  float comb[kS > 0 ? kS * kS : kMaxStreams * kMaxStreams];
#pragma unroll
  for (int64_t j = 0; j < S; ++j) {
    pre[j] = sigmoidf(mix[j] * scale_pre + dev_load(a.base, j)) + eps;
    a.out_post[t * S + j] = 2.0f * sigmoidf(mix[S + j] * scale_post + dev_load(a.base, S + j));
  }
#pragma unroll
  for (int64_t j = 0; j < S; ++j) {
    // Row j: softmax over k, then + eps.
    float mx = -INFINITY;
#pragma unroll
    for (int64_t k = 0; k < S; ++k) {
      comb[j * S + k] = mix[2 * S + j * S + k] * scale_comb + dev_load(a.base, 2 * S + j * S + k);
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
    if (it > 0) {
#pragma unroll
      for (int64_t j = 0; j < S; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int64_t k = 0; k < S; ++k) sum += comb[j * S + k];
#pragma unroll
        for (int64_t k = 0; k < S; ++k) comb[j * S + k] /= sum + eps;
      }
    }
#pragma unroll
    for (int64_t k = 0; k < S; ++k) {
      float sum = 0.0f;
#pragma unroll
      for (int64_t j = 0; j < S; ++j) sum += comb[j * S + k];
#pragma unroll
      for (int64_t j = 0; j < S; ++j) comb[j * S + k] /= sum + eps;
    }
  }
#pragma unroll
  for (int64_t i = 0; i < S * S; ++i) a.out_comb[t * S * S + i] = comb[i];
}

// grid (T): pre/post/comb of one token (hc_pre_weights), u = sum_j pre_j X[j].
__global__ void hc_pre_kernel(HcPreArgs a) {
  __shared__ float mix[kMaxMix];
  __shared__ float pre[kMaxStreams];
  const int64_t t = blockIdx.x, S = a.S, D = a.D;
  const float* X = a.streams + t * S * D;
  hc_mix_or_load(X, S * D, a.fn, (2 + S) * S, a.norm_eps, a.mix, mix);
  if (threadIdx.x == 0) {
    if (S == 4) hc_pre_weights<4>(a, mix, pre, t);
    else hc_pre_weights<0>(a, mix, pre, t);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < S; ++j) acc += pre[j] * X[j * D + d];
    a.out_input[t * D + d] = acc;
  }
}

// One thread per (t, d): X'[k] = post_k y + sum_j comb[j][k] X[j] (comb applied transposed). The
// thread owns column d of all streams of token t, so the update is in place without a race.
__global__ void hc_post_kernel(HcPostArgs a) {
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
    X[k * a.D + d] = acc;
  }
}

// grid (T): the final stream collapse (spec §3.6): no post, no comb, no Sinkhorn.
__global__ void hc_head_kernel(HcHeadArgs a) {
  __shared__ float mix[kMaxStreams];
  __shared__ float pre[kMaxStreams];
  const int64_t t = blockIdx.x, S = a.S, D = a.D;
  const float* X = a.streams + t * S * D;
  hc_mix_or_load(X, S * D, a.fn, S, a.norm_eps, a.mix, mix);
  if (threadIdx.x < S) pre[threadIdx.x] = sigmoidf(mix[threadIdx.x] * dev_load(a.scale, 0) + dev_load(a.base, threadIdx.x)) + a.hc_eps;
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < S; ++j) acc += pre[j] * X[j * D + d];
    a.out[t * D + d] = acc;
  }
}

// grid (rows): y = x * rsqrt(mean(x^2) + eps) [* w] over one group. Every value is read before
// block_sum's barrier and written after it, so out may alias in.
__global__ void rms_norm_kernel(RmsNormArgs a) {
  const int64_t r = blockIdx.x;
  const float* x = a.in + r * a.group;
  float* y = a.out + r * a.group;
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
  for (int64_t i = threadIdx.x; i < a.group; i += blockDim.x) {
    float v = x[i] * inv;
    if (a.weight.data) v *= dev_load(a.weight, i);
    y[i] = v;
  }
}

// One thread per (t, head, pair).
__global__ void rope_kernel(RopeArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pairs = a.table.pairs;
  if (i >= a.T * a.n * pairs) return;
  const int64_t th = i / pairs;  // t * n + head
  const int pair = static_cast<int>(i % pairs);
  const int64_t t = th / a.n;
  float* rope_part = a.x + th * a.width + (a.width - 2 * pairs);
  rope_rotate_pair(rope_part, pair, static_cast<double>(a.positions[t]), a.table, a.inverse);
}

__global__ void window_append_kernel(WindowAppendArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.T * a.Dh) return;
  const int64_t t = i / a.Dh, d = i % a.Dh;
  if (a.dst[t]) a.dst[t][d] = a.kv[i];
}

}  // namespace

void launch_embed(const EmbedArgs& a) {
  if (a.T > 0) embed_kernel<<<static_cast<unsigned>(a.T), kThreads>>>(a);
}

void launch_hc_pre(const HcPreArgs& a) {
  if (a.T <= 0) return;
  if (a.mix)
    hc_mix_rows_kernel<<<dim3(blocks_for(a.T, kMixTokens), static_cast<unsigned>((2 + a.S) * a.S)), kThreads>>>(
        a.streams, a.T, a.S * a.D, a.fn, (2 + a.S) * a.S, a.norm_eps, a.mix);
  hc_pre_kernel<<<static_cast<unsigned>(a.T), kThreads>>>(a);
}

void launch_hc_post(const HcPostArgs& a) {
  if (a.T * a.D > 0) hc_post_kernel<<<blocks_for(a.T * a.D, kThreads), kThreads>>>(a);
}

void launch_hc_head(const HcHeadArgs& a) {
  if (a.T <= 0) return;
  if (a.mix)
    hc_mix_rows_kernel<<<dim3(blocks_for(a.T, kMixTokens), static_cast<unsigned>(a.S)), kThreads>>>(
        a.streams, a.T, a.S * a.D, a.fn, a.S, a.norm_eps, a.mix);
  hc_head_kernel<<<static_cast<unsigned>(a.T), kThreads>>>(a);
}

void launch_rms_norm(const RmsNormArgs& a) {
  if (a.rows > 0) rms_norm_kernel<<<static_cast<unsigned>(a.rows), kThreads>>>(a);
}

void launch_rope(const RopeArgs& a) {
  const int64_t n = a.T * a.n * a.table.pairs;
  if (n > 0) rope_kernel<<<blocks_for(n, kThreads), kThreads>>>(a);
}

void launch_window_append(const WindowAppendArgs& a) {
  if (a.T * a.Dh > 0) window_append_kernel<<<blocks_for(a.T * a.Dh, kThreads), kThreads>>>(a);
}

}  // namespace sparrow::cuda
