// CUDA runtime error checks for the host side. A failing CUDA call inside an op is an internal
// error (the device was checked when the backend was created), so it aborts like SPARROW_CHECK,
// printing the call and the runtime's message. Set SPARROW_CUDA_SYNC=1 to synchronise after every
// launch, so that an asynchronous fault is reported at the kernel that caused it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define SPARROW_CUDA_CHECK(expr)                                                                   \
  do {                                                                                             \
    const cudaError_t _err = (expr);                                                               \
    if (_err != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", __FILE__, __LINE__, #expr,         \
                   cudaGetErrorString(_err));                                                      \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace sparrow::cuda {

// Checks the last launch (and, with SPARROW_CUDA_SYNC=1, its completion). `what` names the op.
void launch_check(const char* what);
// SPARROW_CUDA_SYNC set (and not 0): launch_check synchronises after every launch.
bool sync_every_launch();

// The stream this thread's backend work goes to: its own default stream (cudaStreamPerThread)
// unless a LaunchStreamScope names another. Every kernel launch (device_common.cuh launch()), and
// every copy, fill, stream-ordered allocation and cuBLASLt call an op makes, takes it; the step
// graphs' own calls (capture, launch, the kernel trace's region) stay on the default stream.
cudaStream_t launch_stream();
// While it lives, this thread's backend work goes to `stream` (CudaBackend::moe's shared expert on
// a stream of its own, beside the routed experts).
class LaunchStreamScope {
 public:
  explicit LaunchStreamScope(cudaStream_t stream);
  ~LaunchStreamScope();
  LaunchStreamScope(const LaunchStreamScope&) = delete;
  LaunchStreamScope& operator=(const LaunchStreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace sparrow::cuda
