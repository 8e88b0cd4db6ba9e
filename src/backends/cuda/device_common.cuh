// Device helpers shared by the kernels: exact decoders of the stored formats (the device twins of
// src/core/dtype.h, bit for bit), weight-element access in every checkpoint format, and
// deterministic block reductions (fixed order, so a result never depends on timing).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp4_layout.h"
#include "backends/cuda/kernels.h"

namespace sparrow::cuda {

// ---- programmatic dependent launch ---------------------------------------------------------------
// Every kernel of the backend starts through launch() below, which marks it a programmatic dependent
// of the kernel before it in the stream: its blocks may be scheduled while that kernel still runs
// (its launch and block set-up then overlap the other's tail). Each kernel therefore calls
// wait_previous_grid() before it touches memory another kernel writes: the wait returns once the
// previous grid has finished and its writes are visible, so a kernel sees what it saw with plain
// launches. A kernel that skipped the wait could finish before its predecessor and let its own
// successor run early, so the call is unconditional, ahead of any early return. It then lets the
// next grid launch; so whatever the grid two launches back wrote is visible even before a kernel's
// wait. Without the launch attribute (SPARROW_CUDA_DISABLE=pdl, or a launch by other code) both
// instructions do nothing. Most kernels wait first; the few that read weights (or compute from the
// batch's uploads) before it are listed with their reasons in tests/backends/cuda/
// check_kernel_launches.py, which a CTest runs over every kernel.
//
// Kernel timestamps (kernels.h KernelTraceSlot; the step graphs' set_kernel_trace), compiled in
// only with -DSPARROW_KERNEL_TRACE=ON (a constant load and a branch in every wait cost the batch-1
// step 2 %): while this translation unit's g_kernel_trace points at a region, each block's first
// thread reads the global timer before and after the wait and folds the two into the slot of its
// launch (%gridid modulo kKernelTraceSlots).
#if defined(SPARROW_KERNEL_TRACE) && SPARROW_KERNEL_TRACE
namespace {
__constant__ KernelTraceSlot* g_kernel_trace = nullptr;

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void kernel_trace_record(KernelTraceSlot* region, uint64_t at_wait) {
  const uint64_t past_wait = global_timer_ns();
  uint64_t grid;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  KernelTraceSlot& s = region[1 + grid % (kKernelTraceSlots - 1)];  // slot 0: the region's header
  using ull = unsigned long long;
  const ull old = atomicCAS(reinterpret_cast<ull*>(&s.grid), ~0ull, static_cast<ull>(grid));
  if (old != ~0ull && old != grid) {  // another launch's slot: counted, not recorded
    atomicAdd(reinterpret_cast<ull*>(&region[0].blocks), 1ull);
    return;
  }
  atomicMin(reinterpret_cast<ull*>(&s.first_at_wait), static_cast<ull>(at_wait));
  atomicMin(reinterpret_cast<ull*>(&s.first_past_wait), static_cast<ull>(past_wait));
  atomicMin(reinterpret_cast<ull*>(&s.last_past_wait_inverted), ~static_cast<ull>(past_wait));
  atomicAdd(reinterpret_cast<ull*>(&s.blocks), 1ull);
}

// This translation unit's g_kernel_trace, in stream order on the calling thread's default stream.
inline cudaError_t set_kernel_trace_here(KernelTraceSlot* region) {
  return cudaMemcpyToSymbolAsync(g_kernel_trace, &region, sizeof region, 0, cudaMemcpyHostToDevice, cudaStreamPerThread);
}
}  // namespace

__device__ __forceinline__ void wait_previous_grid() {
  KernelTraceSlot* const trace = g_kernel_trace;
  const bool record = trace != nullptr && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  const uint64_t at_wait = record ? global_timer_ns() : 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (record) kernel_trace_record(trace, at_wait);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#else
namespace {
inline cudaError_t set_kernel_trace_here(KernelTraceSlot*) { return cudaSuccess; }
}  // namespace

__device__ __forceinline__ void wait_previous_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

// Asks L2 for the 128-byte lines of [p, p + bytes), the block's threads taking every
// threads-th line: a hint (no register, nothing waits on it) that is safe before the wait for any
// memory, since every write lands in L2 and the lines are read after the wait as usual.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes, int thread, int threads) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = static_cast<int64_t>(thread) * 128; off < bytes; off += static_cast<int64_t>(threads) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// cuda_feature_on("pdl"), read once.
bool pdl_launch_on();

// Clusters of `cluster` blocks along x, as a launch attribute.
inline cudaLaunchAttribute cluster_attribute(unsigned cluster) {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = cluster;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}
// kernel<<<grid, block, smem>>>(args...) on launch_stream() (the calling thread's default stream
// unless a LaunchStreamScope names another), as a programmatic
// dependent of the grid before it (above) unless the "pdl" switch is off, and (cluster > 1) in
// clusters of `cluster` blocks along x (grid.x a multiple of it). Errors show in launch_check as
// with <<<>>>.
template <typename... Params, typename... Args>
inline void launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster, Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned n = 0;
  if (pdl_launch_on()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) attr[n++] = cluster_attribute(cluster);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = launch_stream();  // the thread's default stream, or a LaunchStreamScope's
  cfg.attrs = attr;
  cfg.numAttrs = n;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  launch_clustered(kernel, grid, block, smem, 1u, std::forward<Args>(args)...);
}
// How many clusters of `cluster` blocks of kernel (block threads, smem bytes each) the device holds
// at once (cudaOccupancyMaxActiveClusters); 0 where it cannot say.
template <typename... Params>
inline int max_active_clusters(void (*kernel)(Params...), dim3 block, size_t smem, unsigned cluster) {
  cudaLaunchAttribute attr[1] = {cluster_attribute(cluster)};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster);
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Barrier `id` (1..15; 0 is __syncthreads') of `threads` threads, whole warps.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting (the waiters' named_barrier_sync counts these threads).
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ inline float dev_bf16(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ inline float dev_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// OCP e4m3fn: no infinities, 0x7F/0xFF NaN (core/dtype.cpp e4m3_to_f32).
__device__ inline float dev_e4m3(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
  if (exp == 15 && man == 7) return __uint_as_float(0x7fc00000u);
  // Subnormal man/8 * 2^-6, else (1 + man/8) * 2^(exp-7): both exact in fp32.
  const float v = exp == 0 ? static_cast<float>(man) * 0x1p-9f
                           : __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return (b & 0x80) ? -v : v;
}

// UE8M0: 2^(e-127); e = 0 is the fp32 subnormal 2^-127; 0xFF is NaN.
__device__ inline float dev_e8m0(uint8_t e) {
  if (e == 0xff) return __uint_as_float(0x7fc00000u);
  if (e == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<uint32_t>(e) << 23);
}

// Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 built from the bits (exponent e = bits 2..1, mantissa m =
// bit 0: (1 + m/2) * 2^(e-1), or m/2 when e = 0), all exact. A lookup table here lived in local
// memory: 32 local loads per 16 weight bytes made the FP4 experts 4x slower per byte than FP8.
__device__ inline float dev_e2m1(uint8_t nibble) {
  const uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
  const float v = e != 0 ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : 0.5f * static_cast<float>(m);
  return (nibble & 8) ? -v : v;
}

// ---- encoders: bit-exact twins of core/dtype.h f32_to_bf16 and core/quant.cpp ------------------
// Only integer operations, comparisons, exact scalings by powers of two and rintf (round half to
// even, the default mode std::nearbyint uses on the host), so they agree with the host bit for bit.

// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet, its payload's top bits kept).
__device__ inline uint16_t dev_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// bf16 round to nearest even, as an f32.
__device__ inline float dev_bf16_round(float f) { return dev_bf16(dev_f32_to_bf16(f)); }

// ---- division by a reciprocal taken once -------------------------------------------------------
// x / d for many x over one d, with d's correctly rounded reciprocal y = __frcp_rn(d) taken once:
// q = RN(x y), the remainder r = x - d q from one fma, then RN(q + r y) (Markstein's correction).
// Three dependent operations and no branch, where the IEEE division is a reciprocal's refinement, a
// range check and a branch to its slow path each time (a run of them cannot overlap). It gives the
// IEEE division's bits for every pair of significands (CudaElementwise.QuotientByReciprocal... runs
// every divisor significand against every dividend significand, 2^46 pairs, in its full form). The
// bounds below keep every step normal, so the pairs' result holds at each scale within them: d's
// exponent in [-40, 40] (y normal), x's e in [-79, 80] (a nonzero remainder is a multiple of
// 2^(e - 47), so normal; the quotient's exponent within [-120, 121]). Elsewhere (zeros, subnormals,
// infinities, NaNs, values far from 1) the caller divides.
__device__ inline bool dev_div_recip_divisor_fits(float d) {
  return ((__float_as_uint(d) >> 23) & 0xffu) - 87u <= 80u;  // biased exponent 87 .. 167
}
__device__ inline bool dev_div_recip_fits(float x) {
  return ((__float_as_uint(x) >> 23) & 0xffu) - 48u <= 159u;  // biased exponent 48 .. 207
}
__device__ inline float dev_div_recip(float x, float d, float y) {
  const float q = __fmul_rn(x, y);
  return __fmaf_rn(__fmaf_rn(-d, q, x), y, q);
}

// store(i, load(i)) for i = first, first + step, ... < n (n > 0), kN loads taken before any of their
// stores: where the stores may alias the loads' memory for all the compiler knows, one at a time
// each load waits for the stores before it. The loads are unconditional (i clamped to n - 1), so
// that ptxas issues them together; predicated, it issued each right before its use (docs/perf.md,
// sixty-third session). embed_kernel's bf16 rows and row_sim_kernel's bf16 rounding.
template <int kN, typename Load, typename Store>
__device__ inline void load_ahead_store(int64_t first, int64_t step, int64_t n, Load load, Store store) {
  for (int64_t i0 = first; i0 < n; i0 += kN * step) {
    decltype(load(i0)) v[kN];
#pragma unroll
    for (int u = 0; u < kN; ++u) v[u] = load(i0 + u * step < n ? i0 + u * step : n - 1);
#pragma unroll
    for (int u = 0; u < kN; ++u)
      if (i0 + u * step < n) store(i0 + u * step, v[u]);
  }
}

// Value i of a GEMM's output through its PartsView (kernels.h): the slices added in order and
// rounded (parts_sum_kernel's arithmetic, which it calls too), or the summed value itself.
// The parts are loaded kPartsAhead at a time before they are added (in order: the same sums), each
// load unconditional (the part clamped to the last): one at a time, a split GEMM's reader waited a
// memory latency per part (the loop's add used each load at once; bench/sass_ops.py --load-use).
constexpr int kPartsAhead = 4;
__device__ __forceinline__ float dev_parts_at(const PartsView& v, int64_t i) {
  float s = v.data[i];
  for (int p = 1; p < v.parts; p += kPartsAhead) {
    float t[kPartsAhead];
#pragma unroll
    for (int u = 0; u < kPartsAhead; ++u) t[u] = v.data[(p + u < v.parts ? p + u : v.parts - 1) * v.stride + i];
#pragma unroll
    for (int u = 0; u < kPartsAhead; ++u)
      if (p + u < v.parts) s += t[u];
  }
  return v.round ? dev_bf16_round(s) : s;
}
// Values i .. i + 3 (i a multiple of 4; data and stride allow 16-byte loads: parts_view_four_wide).
__device__ __forceinline__ float4 dev_parts_at4(const PartsView& v, int64_t i) {
  float4 s = *reinterpret_cast<const float4*>(v.data + i);
  for (int p = 1; p < v.parts; p += kPartsAhead) {
    float4 t[kPartsAhead];
#pragma unroll
    for (int u = 0; u < kPartsAhead; ++u)
      t[u] = *reinterpret_cast<const float4*>(v.data + (p + u < v.parts ? p + u : v.parts - 1) * v.stride + i);
#pragma unroll
    for (int u = 0; u < kPartsAhead; ++u)
      if (p + u < v.parts) s.x += t[u].x, s.y += t[u].y, s.z += t[u].z, s.w += t[u].w;
  }
  if (v.round) s = make_float4(dev_bf16_round(s.x), dev_bf16_round(s.y), dev_bf16_round(s.z), dev_bf16_round(s.w));
  return s;
}

// f32 -> OCP e4m3fn byte: |x| >= 448 and ±inf saturate to ±448, NaN gives 0x7F | sign.
__device__ inline uint8_t dev_f32_to_e4m3(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0x00;
  if (isnan(x)) return sign | 0x7F;
  const float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7E;
  // Subnormals are multiples of 2^-9: a * 512 is exact, rintf rounds half to even.
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  // Round the 23-bit mantissa to 3 bits, nearest even (a carry into the exponent is correct).
  uint32_t u = __float_as_uint(a);
  u += 0x7FFFFu + ((u >> 20) & 1u);
  const uint32_t exp_field = (u >> 23) - 127 + 7;
  return sign | static_cast<uint8_t>(exp_field << 3 | ((u >> 20) & 7u));
}

// f32 -> e2m1 nibble (sign in bit 3): |x| > 6 saturates; midpoints go to the even code; NaN gives +0.
__device__ inline uint8_t dev_f32_to_e2m1(float x) {
  if (isnan(x)) return 0;
  const uint8_t sign = signbit(x) ? 0x8 : 0x0;
  const float a = fabsf(x);
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

// k = ceil(log2(amax / qmax)) clamped to [-127, 127] (core/quant.cpp pow2_scale_exponent, whose
// REQUIRES amax >= 0 and finite the callers meet). amax / qmax is one IEEE division, as on the host.
__device__ inline int dev_pow2_scale_exponent(float amax, float qmax) {
  if (amax == 0.0f) return 0;
  const float q = amax / qmax;
  if (q == 0.0f) return -127;
  if (isinf(q)) return 127;
  int e = 0;
  const float m = frexpf(q, &e);  // exact: q = m * 2^e, m in [0.5, 1)
  const int k = m == 0.5f ? e - 1 : e;
  return k < -127 ? -127 : k > 127 ? 127 : k;
}

// Bytes an element of a float dtype takes (dev_load's dtypes; 4 for the others).
__device__ inline int64_t dev_float_bytes(DType t) {
  return t == DType::kBF16 || t == DType::kF16 ? 2 : t == DType::kF8E4M3 || t == DType::kF8E8M0 ? 1 : 4;
}

// Element i of a float tensor (F32/F16/BF16/E4M3/E8M0) by its stored dtype.
__device__ inline float dev_load(const DevView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kF32: return static_cast<const float*>(v.data)[i];
    case DType::kBF16: return dev_bf16(static_cast<const uint16_t*>(v.data)[i]);
    case DType::kF16: return dev_f16(static_cast<const uint16_t*>(v.data)[i]);
    case DType::kF8E4M3: return dev_e4m3(static_cast<const uint8_t*>(v.data)[i]);
    case DType::kF8E8M0: return dev_e8m0(static_cast<const uint8_t*>(v.data)[i]);
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return __uint_as_float(0x7fc00000u);  // the host refuses these dtypes before a launch
}

// dev_load behind a call: its switch over the dtypes once in a kernel's code, not inlined at each
// load. For the loads off a kernel's hot dtypes (which it reads inline): a small kernel runs once an
// SM a step and waits to fetch its code, and each inlined switch added about 0.5 KB (rms_norm_warp's
// 32 unrolled weight loads made it 56 KB; docs/perf.md, "twenty-first run"). The same values.
static __device__ __noinline__ float dev_load_call(DevView v, int64_t i) { return dev_load(v, i); }

// dev_load with bf16 and f32 (the weights' and activations' usual dtypes) inline, the rest through
// dev_load_call. The same values.
__device__ inline float dev_load_hot(const DevView& v, int64_t i) {
  if (v.dtype == DType::kBF16) return dev_bf16(static_cast<const uint16_t*>(v.data)[i]);
  if (v.dtype == DType::kF32) return static_cast<const float*>(v.data)[i];
  return dev_load_call(v, i);
}

// out[u] = element first + u * step of v for the u with first + u * step < n, `fill` for the rest
// (and for all of them when v is empty). dev_load in a loop converts each value right after its
// load behind the dtype's switch, so the loads go out one at a time; here the switch is taken once
// and all kN loads go out before any conversion (a batch-1 norm row of 1024 weights: 15 us that
// way in ncu on the H200). The same values as dev_load. The bf16 loads are unconditional, their
// index clamped into [0, n): predicated, ptxas issued each right before its conversion, one
// memory latency after another (rms_norm_warp_kernel<32>, q_lora's one-row norm: 12.1 us in ncu,
// 73 % of its stall samples waiting on those loads, H100, 2026-12-07).
template <int kN>
__device__ inline void dev_load_many(const DevView& v, int first, int step, int n, float fill, float (&out)[kN]) {
  if (v.data && v.dtype == DType::kBF16) {
    const auto* p = static_cast<const uint16_t*>(v.data);
    uint32_t raw[kN];
    const int last = n > 0 ? n - 1 : 0;
#pragma unroll
    for (int u = 0; u < kN; ++u) raw[u] = n > 0 ? static_cast<uint32_t>(__ldg(p + min(first + u * step, last))) : 0u;
#pragma unroll
    for (int u = 0; u < kN; ++u) out[u] = first + u * step < n ? __uint_as_float(raw[u] << 16) : fill;
  } else if (v.data && v.dtype == DType::kF32) {
#pragma unroll
    for (int u = 0; u < kN; ++u) out[u] = first + u * step < n ? static_cast<const float*>(v.data)[first + u * step] : fill;
  } else {
#pragma unroll
    for (int u = 0; u < kN; ++u) out[u] = v.data && first + u * step < n ? dev_load_call(v, first + u * step) : fill;
  }
}

__device__ inline int64_t dev_load_index(const DevView& v, int64_t i) {
  return v.dtype == DType::kI64 ? static_cast<const int64_t*>(v.data)[i] : static_cast<const int32_t*>(v.data)[i];
}

// W[row, col] of a weight matrix, dequantised as the CPU reader does (weight_reader.cpp):
// value * scale in fp32.
__device__ inline float weight_at(const DevWeight& w, int64_t row, int64_t col) {
  switch (w.format) {
    case WeightFormat::kFloat:
      return dev_load(DevView{w.data, w.dtype}, row * w.in + col);
    case WeightFormat::kFp8Block: {
      const float s = dev_load(DevView{w.scale, w.scale_dtype}, (row / w.block_out) * w.scale_cols + col / w.block_in);
      return dev_e4m3(static_cast<const uint8_t*>(w.data)[row * w.in + col]) * s;
    }
    case WeightFormat::kFp4Packed: {
      // The device layout (fp4_layout.h): word k of a row holds inputs 8k .. 8k + 7 (w.in % 8 == 0),
      // input j's magnitude in nibble j, its sign at fp4_device_sign_bit(j); the rows tiled where
      // w.fp4_tiled.
      const uint32_t word = static_cast<const uint32_t*>(w.data)[fp4_offset(w.fp4_tiled, w.in / 2, row, col / 2) / 4];
      const int j = static_cast<int>(col % 8);
      const uint32_t code = ((word >> (4 * j)) & 7u) | (((word >> fp4_device_sign_bit(j)) & 1u) << 3);
      const float s = dev_load(DevView{w.scale, w.scale_dtype}, row * w.scale_cols + col / w.block_in);
      return dev_e2m1(static_cast<uint8_t>(code)) * s;
    }
  }
  return __uint_as_float(0x7fc00000u);
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- act_quant's arithmetic: the FP8 block-scaled linear's activation codes (core/quant_sim.cpp
// fp8_pow2_quant_sim, block 128), bit for bit; act_quant_fp8_kernel and its kin (kernels_fp8.cu)
// and the FP8 wgmma linear's own quantisation (kernels_linear.cu GroupedW4A8Args::x_f32). ----

// The block's scale s = 2^k and its exact inverse from the block's amax (at least the 1e-4 floor).
// amax >= 1e-4 keeps k >= -22 (a normal float), so 1 / s = 2^-k is exact (byte 127 - k; 2^-127 is
// the subnormal byte 0) and x * (1 / s) is the correctly rounded x / s, the division's bits.
__device__ inline void act_quant_scale(float amax, float& s, float& inv) {
  const int k = dev_pow2_scale_exponent(amax, 448.0f);
  s = dev_e8m0(static_cast<uint8_t>(k + 127));
  inv = dev_e8m0(static_cast<uint8_t>(127 - k));
}

// Four values' e4m3 codes under the scale's inverse, packed (value i in byte i). The codes by the
// hardware's conversion (round to nearest even, e4m3 subnormals; the clamp keeps it off
// saturation), dev_f32_to_e4m3's bits for every value but NaN, whose code is then the encoder's
// (sign kept; the conversion's NaN output is not relied on). Inputs past K are 0 (the callers'
// contract), so their codes are 0. (With the integer encoder an 8192 x 4096 input took 101 us, with
// the conversion about 80: H200, 2026-12-04.)
__device__ inline uint32_t act_quant_codes4(const float* v, float inv) {
  float q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = v[i] * inv;
    q[i] = q[i] < -448.0f ? -448.0f : (448.0f < q[i] ? 448.0f : q[i]);  // std::clamp's order: NaN passes through
  }
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(q[1]), "f"(q[0]));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(q[3]), "f"(q[2]));
  uint32_t packed = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (isnan(q[i])) packed = (packed & ~(0xFFu << (8 * i))) | (static_cast<uint32_t>(dev_f32_to_e4m3(q[i])) << (8 * i));
  return packed;
}

// A 128-input block's codes and scale, lane l of the warp holding inputs 4l .. 4l + 3 (0 past K),
// all 32 lanes calling: returns the lane's 4 codes packed, s the block's scale. The reference's
// floor: an all-zero block still gets a finite scale. fmaxf skips NaN exactly as the host's
// std::max(amax, |x|) with amax first does; columns past K hold 0 and change nothing.
__device__ inline uint32_t act_quant_lane(const float (&v)[4], float& s) {
  float amax = 1e-4f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = warp_max(amax);
  float inv;
  act_quant_scale(amax, s, inv);
  return act_quant_codes4(v, inv);
}

// Sum of v over the block, returned to every thread. REQUIRES: blockDim.x a multiple of 32, at
// most 1024, and every thread of the block calls it.
__device__ inline float block_sum(float v) {
  __shared__ float partial[32];
  __syncthreads();  // `partial` may still be read by a previous call
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < nwarps; ++i) total += partial[i];
  return total;
}

__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  __syncthreads();
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = partial[0];
  for (int i = 1; i < nwarps; ++i) m = fmaxf(m, partial[i]);
  return m;
}

// RoPE (spec §3.0.3): the angle pos * inv_freq[i] and the rotation are fp64, as on the CPU: fp32
// positions lose the angle at long contexts. rope_angle gives pair i's cosine and sine (the sine
// negated for the inverse), rope_rotated a pair rotated by them, rope_rotate_pair both in place.
__device__ inline void rope_angle(double pos, const RopeTableArg& table, int i, bool inverse, double& c, double& s) {
  sincos(pos * table.inv_freq[i], &s, &c);
  if (inverse) s = -s;
}
__device__ inline float2 rope_rotated(double x0, double x1, double c, double s) {
  return make_float2(static_cast<float>(x0 * c - x1 * s), static_cast<float>(x0 * s + x1 * c));
}
__device__ inline void rope_rotate_pair(float* rope_part, int i, double pos, const RopeTableArg& table, bool inverse) {
  double c, s;
  rope_angle(pos, table, i, inverse, c, s);
  const float2 r = rope_rotated(rope_part[2 * i], rope_part[2 * i + 1], c, s);
  rope_part[2 * i] = r.x;
  rope_part[2 * i + 1] = r.y;
}

// The routed experts' activation h = silu(min(x, L)) * clamp(y, -L, L) (no clamp when L <= 0), and
// the reference numerics' routing-weight step bf16(g h) (g in double, rounded once to float): one
// definition for the separate kernels and the fused one (kernels_fp8.cu), so their bits agree.
__device__ inline float dev_swiglu(float x, float y, float limit) {
  if (limit > 0.0f) {
    x = fminf(x, limit);
    y = fminf(fmaxf(y, -limit), limit);
  }
  return x / (1.0f + expf(-x)) * y;
}
__device__ inline float dev_route_scale_bf16(float h, double g) {
  return dev_bf16_round(__double2float_rn(g * static_cast<double>(h)));
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// cp.async of `bytes` (4, 8 or 16) from global to shared memory, zero-filled when !ok (the source is
// then not read); commit and wait on the thread's groups of copies.
__device__ inline void cp_async(void* dst, const void* src, bool ok, int bytes) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int n = ok ? bytes : 0;
  if (bytes == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  else if (bytes == 8) asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(n));
  else asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

}  // namespace sparrow::cuda
