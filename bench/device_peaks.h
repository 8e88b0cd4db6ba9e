// The device's ceilings, measured at the start of `sparrow bench` (/work/.library/device/METHOD.md:
// datasheet rates are leads; measure a large device-to-device copy and large matrix products).
//
//   HBM bandwidth: cudaMemcpyAsync device to device and a 16-byte-per-thread copy kernel over
//     buffers of `copy_bytes`, bytes read plus bytes written counted; the faster of the two.
//   bf16 GEMM: cuBLASLt, bf16 A/B/D, fp32 accumulate, square-ish shapes up to 8192^3.
//   FP8 GEMM: cuBLASLt, e4m3 A/B, bf16 D, fp32 accumulate, per-tensor fp32 scales ("TN", the
//     layout Hopper's FP8 kernels take); and the block-scaled form DeepSeek's weights use (A
//     scaled per 1x128 along K, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; B per 128x128 tile,
//     BLK128x128_32F), reported "unsupported: ..." when cuBLASLt refuses it.
// Each figure: cudaEvents around one operation, after warm-up, median of `reps`, rotating among
// several sets of buffers each larger than L2 so that caches do not flatter the numbers; inputs
// random (never zeros: a bf16 product ran 13% faster on zeros on an H200 here).
//
// cuBLASLt is loaded at run time (dlopen "libcublasLt.so.13", or $SPARROW_CUBLASLT), so the
// sparrow binary needs no cuBLAS to start; without it the GEMM peaks are "unavailable: ..." and
// the caller falls back to datasheet figures, saying so.
//
// REQUIRES: a CUDA device is selected (make_cuda_backend succeeded). Errors are Statuses.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparrow/status.h"

namespace sparrow::bench {

struct PeakOptions {
  int64_t copy_bytes = int64_t{2} << 30;  // per buffer; two source/destination pairs
  int64_t gemm_max_dim = 8192;
  int warmup = 3;
  int reps = 20;
};

// One measured figure. `ok` false: `note` says why ("unsupported: ...", "unavailable: ...").
struct PeakFigure {
  bool ok = false;
  double value = 0;     // bytes/s or FLOP/s
  double median_ms = 0; // of the best shape
  std::string shape;    // "8192x8192x8192", "2 GiB"
  std::string method;   // "cudaMemcpyAsync D2D", "cublasLt bf16", ...
  std::string note;
  std::vector<double> all_values;  // one per method/shape tried
};

struct DevicePeaks {
  PeakFigure hbm;            // best of the copy methods
  PeakFigure hbm_memcpy, hbm_kernel;
  PeakFigure bf16_gemm;
  PeakFigure fp8_gemm;       // per-tensor scales
  PeakFigure fp8_gemm_block; // VEC128 x BLK128x128 scales
  std::string cublaslt;      // library path and version, or why it is missing
};

Expected<DevicePeaks> measure_device_peaks(const PeakOptions& options);

// What the report says about the device and its software (GPU 0).
struct DeviceInfo {
  std::string name;                  // cudaGetDeviceProperties
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  int64_t l2_bytes = 0;
  int64_t memory_bytes = 0;
  std::string cuda_driver_version;   // cudaDriverGetVersion, "13.0"
  std::string cuda_runtime_version;  // cudaRuntimeGetVersion (the statically linked runtime)
  std::string nvidia_driver;         // first line of /proc/driver/nvidia/version, or ""
};
Expected<DeviceInfo> device_info();

// Median of `v` (the mean of the middle two for an even count). REQUIRES !v.empty().
double median_of(std::vector<double> v);

// Times `op(rep)` with cudaEvents on the default stream: `warmup` untimed calls, then `reps` timed
// ones; milliseconds each.
Expected<std::vector<double>> time_events(const std::function<Status(int)>& op, int warmup, int reps);

}  // namespace sparrow::bench
