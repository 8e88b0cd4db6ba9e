// The bench's CUDA runtime check: a failed call aborts with its text (the bench measures; it has no
// way to go on without the device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define BENCH_CUDA(expr)                                                                       \
  do {                                                                                         \
    const cudaError_t _e = (expr);                                                             \
    if (_e != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "sparrow bench: %s failed: %s\n", #expr, cudaGetErrorString(_e));   \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
