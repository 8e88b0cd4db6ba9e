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

}  // namespace sparrow::cuda
