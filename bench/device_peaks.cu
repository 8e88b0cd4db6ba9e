// Measured ceilings: HBM copy bandwidth, bf16 and FP8 GEMM rates through cuBLASLt (loaded with
// dlopen, so the binary starts without it). See device_peaks.h.
#include "bench/device_peaks.h"

#include "backends/cuda/cublaslt_api.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparrow::bench {

namespace {

#define PEAK_CUDA(expr)                                                                                 \
  do {                                                                                                  \
    const cudaError_t _e = (expr);                                                                      \
    if (_e != cudaSuccess) return Status::internal(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
  } while (0)

// A cudaMalloc'd buffer freed on scope exit (errors at free ignored).
struct DevMem {
  void* p = nullptr;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  DevMem(DevMem&& o) noexcept : p(o.p) { o.p = nullptr; }
  ~DevMem() {
    if (p) cudaFree(p);
  }
};

Status dev_alloc(DevMem& m, size_t bytes) {
  PEAK_CUDA(cudaMalloc(&m.p, bytes));
  return Status::ok();
}

__device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) from (seed, index).
__device__ inline float uniform_pm1(uint64_t seed, uint64_t i) {
  const uint64_t r = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(uniform_pm1(seed, i));
}

__global__ void fill_e4m3_kernel(__nv_fp8_e4m3* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __nv_fp8_e4m3(4.0f * uniform_pm1(seed, i));
}

__global__ void fill_f32_kernel(float* p, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void fill_bytes_kernel(uint32_t* p, int64_t n_words, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<uint32_t>(mix64(seed + i));
}

// 16 bytes per thread per iteration, grid-stride, coalesced. REQUIRES n16 16-byte words.
__global__ void copy16_kernel(int4* __restrict__ dst, const int4* __restrict__ src, int64_t n16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

constexpr int kFillThreads = 256;
constexpr unsigned kFillBlocks = 4096;

// ---- cuBLASLt, loaded at run time ----------------------------------------------------------------

// cuBLASLt comes from the loader the FP8 linear uses (backends/cuda/cublaslt_api.h).
using Lt = cuda::CublasLtApi;

enum class GemmKind { kBf16, kFp8Tensor, kFp8Block };

const char* gemm_kind_name(GemmKind k) {
  switch (k) {
    case GemmKind::kBf16: return "cublasLt bf16 (fp32 accumulate)";
    case GemmKind::kFp8Tensor: return "cublasLt fp8 e4m3, per-tensor scales (fp32 accumulate, bf16 out)";
    case GemmKind::kFp8Block: return "cublasLt fp8 e4m3, A 1x128 (VEC128_32F) x B 128x128 (BLK128x128_32F) scales";
  }
  return "?";
}

#define LT_OK(expr, what)                                                                        \
  do {                                                                                           \
    const cublasStatus_t _s = (expr);                                                            \
    if (_s != CUBLAS_STATUS_SUCCESS) return Status::unsupported(std::string(what) + ": status " + \
                                                                std::to_string(static_cast<int>(_s))); \
  } while (0)

// D[m, n] = A^T B with A stored [k, m] and B [k, n], column-major ("TN", what Hopper's FP8 kernels
// take), D bf16. Buffers rotate among `sets` so each call reads operands that are not in L2.
Status time_gemm(const Lt& lt, cublasLtHandle_t handle, GemmKind kind, int64_t m, int64_t n, int64_t k,
                 int64_t l2_bytes, const PeakOptions& o, PeakFigure& fig) {
  const bool fp8 = kind != GemmKind::kBf16;
  const size_t in_elem = fp8 ? 1 : 2;
  const size_t a_bytes = m * k * in_elem, b_bytes = k * n * in_elem, d_bytes = m * n * 2;
  const int64_t set_bytes = static_cast<int64_t>(a_bytes + b_bytes + d_bytes);
  const int sets = static_cast<int>(std::clamp<int64_t>((4 * l2_bytes + set_bytes - 1) / set_bytes, 3, 8));
  std::vector<DevMem> a(sets), b(sets), d(sets);
  for (int s = 0; s < sets; ++s) {
    SPARROW_RETURN_IF_ERROR(dev_alloc(a[s], a_bytes));
    SPARROW_RETURN_IF_ERROR(dev_alloc(b[s], b_bytes));
    SPARROW_RETURN_IF_ERROR(dev_alloc(d[s], d_bytes));
    if (fp8) {
      fill_e4m3_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<__nv_fp8_e4m3*>(a[s].p), m * k, 11 + s);
      fill_e4m3_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<__nv_fp8_e4m3*>(b[s].p), k * n, 101 + s);
    } else {
      fill_bf16_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<__nv_bfloat16*>(a[s].p), m * k, 11 + s);
      fill_bf16_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<__nv_bfloat16*>(b[s].p), k * n, 101 + s);
    }
    PEAK_CUDA(cudaGetLastError());
  }
  // Scales: all ones (the values do not change the work). Sized for the largest mode used.
  const int64_t kb = (k + 127) / 128;
  DevMem a_scale, b_scale, workspace;
  const int64_t a_scales = std::max<int64_t>(1, kb * m), b_scales = std::max<int64_t>(1, kb * ((n + 127) / 128) * 128);
  SPARROW_RETURN_IF_ERROR(dev_alloc(a_scale, a_scales * sizeof(float)));
  SPARROW_RETURN_IF_ERROR(dev_alloc(b_scale, b_scales * sizeof(float)));
  fill_f32_kernel<<<256, kFillThreads>>>(static_cast<float*>(a_scale.p), a_scales, 1.0f);
  fill_f32_kernel<<<256, kFillThreads>>>(static_cast<float*>(b_scale.p), b_scales, 1.0f);
  PEAK_CUDA(cudaGetLastError());
  const size_t workspace_bytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
  SPARROW_RETURN_IF_ERROR(dev_alloc(workspace, workspace_bytes));
  PEAK_CUDA(cudaDeviceSynchronize());

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  // Releases the descriptors whatever path leaves the function.
  struct Release {
    const Lt& lt;
    cublasLtMatmulDesc_t& desc;
    cublasLtMatrixLayout_t &la, &lb, &ld;
    cublasLtMatmulPreference_t& pref;
    ~Release() {
      if (pref) lt.pref_destroy(pref);
      if (ld) lt.layout_destroy(ld);
      if (lb) lt.layout_destroy(lb);
      if (la) lt.layout_destroy(la);
      if (desc) lt.desc_destroy(desc);
    }
  } release{lt, desc, la, lb, ld, pref};

  LT_OK(lt.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)), "TRANSA");
  LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)), "TRANSB");
  if (fp8) {
    const void* sa = a_scale.p;
    const void* sb = b_scale.p;
    LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "A_SCALE_POINTER");
    LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "B_SCALE_POINTER");
    if (kind == GemmKind::kFp8Block) {
      const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)), "A_SCALE_MODE VEC128_32F");
      LT_OK(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)), "B_SCALE_MODE BLK128x128_32F");
    }
  }
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  LT_OK(lt.layout_create(&la, in_type, k, m, k), "layout A");
  LT_OK(lt.layout_create(&lb, in_type, k, n, k), "layout B");
  LT_OK(lt.layout_create(&ld, CUDA_R_16BF, m, n, m), "layout D");
  LT_OK(lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t ws = workspace_bytes;
  LT_OK(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "MAX_WORKSPACE_BYTES");
  constexpr int kAlgos = 3;
  cublasLtMatmulHeuristicResult_t results[kAlgos] = {};
  int found = 0;
  LT_OK(lt.heuristic(handle, desc, la, lb, ld, ld, pref, kAlgos, results, &found), "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) return Status::unsupported("cublasLtMatmulAlgoGetHeuristic found no algorithm");

  const float alpha = 1.0f, beta = 0.0f;
  const double flops = 2.0 * m * n * k;
  bool any = false;
  std::string last_error;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t* algo = &results[i].algo;
    auto op = [&](int rep) -> Status {
      const int s = rep % sets;
      LT_OK(lt.matmul(handle, desc, &alpha, a[s].p, la, b[s].p, lb, &beta, d[s].p, ld, d[s].p, ld, algo, workspace.p,
                      workspace_bytes, cudaStreamPerThread),
            "cublasLtMatmul");
      return Status::ok();
    };
    auto ms = time_events(op, o.warmup, o.reps);
    if (!ms.is_ok()) {
      last_error = ms.status().message();
      cudaGetLastError();
      continue;
    }
    const double med = median_of(*ms);
    const double rate = flops / (med * 1e-3);
    fig.all_values.push_back(rate);
    if (!fig.ok || rate > fig.value) {
      fig.ok = true;
      fig.value = rate;
      fig.median_ms = med;
      fig.shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
      fig.method = gemm_kind_name(kind);
    }
    any = true;
  }
  if (!any) return Status::unsupported(last_error.empty() ? "no algorithm ran" : last_error);
  return Status::ok();
}

void measure_gemm(const Lt* lt, cublasLtHandle_t handle, GemmKind kind, int64_t l2_bytes, const PeakOptions& o,
                  const std::string& missing, PeakFigure& fig) {
  fig.method = gemm_kind_name(kind);
  if (!lt) {
    fig.note = "unavailable: " + missing;
    return;
  }
  std::vector<int64_t> dims;
  for (int64_t d = 4096; d <= o.gemm_max_dim; d *= 2) dims.push_back(d);
  if (dims.empty()) dims.push_back(o.gemm_max_dim);
  std::string errors;
  for (int64_t d : dims) {
    const Status st = time_gemm(*lt, handle, kind, d, d, d, l2_bytes, o, fig);
    if (!st.is_ok()) errors += (errors.empty() ? "" : "; ") + std::to_string(d) + "^3: " + st.message();
    cudaGetLastError();  // a refused configuration must not poison the next one
  }
  if (!fig.ok) fig.note = (kind == GemmKind::kFp8Block ? "unsupported: " : "failed: ") + errors;
  else if (!errors.empty()) fig.note = "some shapes failed: " + errors;
}

Status measure_copy(const PeakOptions& o, DevicePeaks& out) {
  const size_t bytes = static_cast<size_t>(o.copy_bytes) / 16 * 16;
  constexpr int kPairs = 2;
  DevMem src[kPairs], dst[kPairs];
  for (int i = 0; i < kPairs; ++i) {
    SPARROW_RETURN_IF_ERROR(dev_alloc(src[i], bytes));
    SPARROW_RETURN_IF_ERROR(dev_alloc(dst[i], bytes));
    fill_bytes_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<uint32_t*>(src[i].p), bytes / 4, 7 + i);
    fill_bytes_kernel<<<kFillBlocks, kFillThreads>>>(static_cast<uint32_t*>(dst[i].p), bytes / 4, 17 + i);
    PEAK_CUDA(cudaGetLastError());
  }
  PEAK_CUDA(cudaDeviceSynchronize());
  const double moved = 2.0 * static_cast<double>(bytes);  // read + write
  const std::string shape = std::to_string(bytes >> 20) + " MiB x " + std::to_string(kPairs) + " pairs";

  auto memcpy_op = [&](int rep) -> Status {
    PEAK_CUDA(cudaMemcpyAsync(dst[rep % kPairs].p, src[rep % kPairs].p, bytes, cudaMemcpyDeviceToDevice, 0));
    return Status::ok();
  };
  // Bytes per second from the median of the timed copies.
  auto record = [&](PeakFigure& f, const std::vector<double>& ms, const char* method) {
    f.ok = true;
    f.median_ms = median_of(ms);
    f.value = moved / (f.median_ms * 1e-3);
    f.shape = shape;
    f.method = method;
  };
  SPARROW_ASSIGN_OR_RETURN(std::vector<double> ms1, time_events(memcpy_op, o.warmup, o.reps));
  PeakFigure& a = out.hbm_memcpy;
  record(a, ms1, "cudaMemcpyAsync device to device (bytes read + written)");

  int device = 0, sms = 0;
  PEAK_CUDA(cudaGetDevice(&device));
  PEAK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  auto kernel_op = [&](int rep) -> Status {
    copy16_kernel<<<sms * 8, 512>>>(static_cast<int4*>(dst[rep % kPairs].p), static_cast<const int4*>(src[rep % kPairs].p),
                                    static_cast<int64_t>(bytes / 16));
    PEAK_CUDA(cudaGetLastError());
    return Status::ok();
  };
  SPARROW_ASSIGN_OR_RETURN(std::vector<double> ms2, time_events(kernel_op, o.warmup, o.reps));
  PeakFigure& b = out.hbm_kernel;
  record(b, ms2, "copy kernel, 16 B per thread, grid-stride (bytes read + written)");

  out.hbm = a.value >= b.value ? a : b;
  out.hbm.all_values = {a.value, b.value};
  return Status::ok();
}

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

Expected<DeviceInfo> device_info() {
  DeviceInfo d;
  int device = 0;
  PEAK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  PEAK_CUDA(cudaGetDeviceProperties(&prop, device));
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sms = prop.multiProcessorCount;
  d.l2_bytes = prop.l2CacheSize;
  d.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  int v = 0;
  PEAK_CUDA(cudaDriverGetVersion(&v));
  d.cuda_driver_version = cuda_version_string(v);
  PEAK_CUDA(cudaRuntimeGetVersion(&v));
  d.cuda_runtime_version = cuda_version_string(v);
  std::ifstream f("/proc/driver/nvidia/version");
  if (f) std::getline(f, d.nvidia_driver);
  return d;
}

Expected<std::vector<double>> time_events(const std::function<Status(int)>& op, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) SPARROW_RETURN_IF_ERROR(op(i));
  PEAK_CUDA(cudaDeviceSynchronize());
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } ev;
  PEAK_CUDA(cudaEventCreate(&ev.start));
  PEAK_CUDA(cudaEventCreate(&ev.stop));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    PEAK_CUDA(cudaEventRecord(ev.start));
    SPARROW_RETURN_IF_ERROR(op(warmup + r));
    PEAK_CUDA(cudaEventRecord(ev.stop));
    PEAK_CUDA(cudaEventSynchronize(ev.stop));
    float t = 0;
    PEAK_CUDA(cudaEventElapsedTime(&t, ev.start, ev.stop));
    ms.push_back(t);
  }
  return ms;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Expected<DevicePeaks> measure_device_peaks(const PeakOptions& o) {
  if (o.reps < 1 || o.warmup < 0 || o.copy_bytes < (1 << 20)) return Status::invalid_argument("bad peak options");
  DevicePeaks out;
  SPARROW_RETURN_IF_ERROR(measure_copy(o, out));

  int device = 0, l2 = 0;
  PEAK_CUDA(cudaGetDevice(&device));
  PEAK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const Lt& lt = cuda::cublaslt_api();
  cublasLtHandle_t handle = nullptr;
  std::string missing;
  if (lt.error.empty()) {
    out.cublaslt = lt.library + " (cublasLt version " + std::to_string(lt.version) + ")";
    if (lt.create(&handle) != CUBLAS_STATUS_SUCCESS) {
      missing = "cublasLtCreate failed";
      handle = nullptr;
    }
  } else {
    missing = lt.error;
    out.cublaslt = missing;
  }
  const Lt* ltp = lt.error.empty() && handle ? &lt : nullptr;
  measure_gemm(ltp, handle, GemmKind::kBf16, l2, o, missing, out.bf16_gemm);
  measure_gemm(ltp, handle, GemmKind::kFp8Tensor, l2, o, missing, out.fp8_gemm);
  measure_gemm(ltp, handle, GemmKind::kFp8Block, l2, o, missing, out.fp8_gemm_block);
  if (handle) lt.destroy(handle);
  // The library stays loaded: its kernels may still be referenced by the runtime until exit.
  PEAK_CUDA(cudaDeviceSynchronize());
  return out;
}

}  // namespace sparrow::bench
