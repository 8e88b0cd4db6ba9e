#include "bench/device_fill.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace sparrow::bench {

namespace {

__device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Irwin-Hall: four 16-bit uniforms have mean 2^17 - 2 and variance 4 (2^32 - 1) / 12 in those
// units; rescaled to unit variance (as tools/synth.cpp draws its weights).
__global__ void fill_normal_kernel(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed * 0xD1B54A32D192ED03ull + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull);
    const float sum = static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    p[i] = (sum - 131070.0f) * (1.7320508f / 65536.0f) * scale;
  }
}

__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sparrow bench: %s kernel failed: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

}  // namespace

void device_spin(uint64_t ns) {
  spin_kernel<<<1, 1>>>(ns);
  check_launch("spin");
}

void device_fill_normal(float* p, int64_t n, uint64_t seed, float scale) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  fill_normal_kernel<<<static_cast<unsigned>(blocks < 8192 ? blocks : 8192), 256>>>(p, n, seed, scale);
  check_launch("fill");
}

}  // namespace sparrow::bench
