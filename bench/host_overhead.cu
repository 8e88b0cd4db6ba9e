// sparrow_host_overhead: what the CUDA runtime's calls cost the host on this machine, the figures
// behind the decision how a decode step is enqueued (launch by launch, or as a CUDA graph).
//
// For each call it times N calls back to back on the host (steady_clock, median of R rounds) and
// prints microseconds a call: empty-kernel launches on the legacy default stream and on a stream of
// its own, a launch with 1 KB of arguments, stream-ordered alloc/free pairs, small host-to-device
// copies from pageable and from pinned memory, event records; then the same N launches recorded by
// stream capture (a call's host cost while capturing), the graph's instantiation, an update of the
// instantiated graph from a fresh capture (cudaGraphExecUpdate), and a launch of the whole graph;
// and the GPU's time for N empty kernels as launches and as one graph (events). Then programmatic
// dependent launch (PDL) in a graph: a chain of 64 memory-bound kernels, each streaming 4 MB of its
// own weights and reading the previous kernel's output, as plain launches, as PDL launches that
// wait for the previous kernel first, and as PDL launches that load their first weights, let the
// next kernel launch, and only then wait: the GPU time a kernel of each (what a kernel boundary
// costs a decode step, and what PDL would take off it). Usage:
//   sparrow_host_overhead [--n N] [--rounds R]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "sparrow_host_overhead: %s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

__global__ void empty_kernel() {}

struct Big {
  unsigned char bytes[1024];
};
__global__ void big_args_kernel(Big b, int* out) {
  if (threadIdx.x == 0 && b.bytes[1023] == 255) *out = 1;
}

// One link of the PDL chain: the grid streams w (n4 float4 values; each thread 4 in registers
// first, then the rest grid-stride), scaled by the previous link's in[0], and writes its blocks'
// sums to out. kMode 0: no PDL instruction (a plain launch); 1: wait for the previous grid first;
// 2: the first loads, then let the next grid launch, then wait (the previous grid's output is read
// only after the wait).
template <int kMode>
__global__ void __launch_bounds__(256) chain_kernel(const float4* __restrict__ w, long long n4, const float* in,
                                                    float* out) {
  if constexpr (kMode == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  float4 r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const long long i = first + j * stride;
    r[j] = i < n4 ? __ldg(w + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if constexpr (kMode == 2) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const float x = in[0];
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) acc += (r[j].x + r[j].y + r[j].z + r[j].w) * x;
  for (long long i = first + 4 * stride; i < n4; i += stride) {
    const float4 v = __ldg(w + i);
    acc += (v.x + v.y + v.z + v.w) * x;
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float part[8];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < 8; ++k) s += part[k];
    out[blockIdx.x] = 1.0f + 1e-9f * s;
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `rounds` of the host time of body() divided by `per`, in microseconds; `after` runs
// untimed after each round (a synchronisation, a cleanup).
double time_host(int rounds, int per, const std::function<void()>& body,
                 const std::function<void()>& after = [] { CHECK(cudaDeviceSynchronize()); }) {
  std::vector<double> v;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now_us();
    body();
    v.push_back((now_us() - t0) / per);
    after();
  }
  return median(v);
}

void row(const char* what, double us, const char* note = "") {
  std::printf("%-58s %9.3f us  %s\n", what, us, note);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2000, rounds = 7;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: sparrow_host_overhead [--n N] [--rounds R]\n"
                  "Times the CUDA runtime calls a decode step makes (host microseconds a call, median of R rounds of N).\n");
      return 0;
    } else {
      std::fprintf(stderr, "sparrow_host_overhead: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  if (n < 1 || rounds < 1) {
    std::fprintf(stderr, "sparrow_host_overhead: --n and --rounds must be >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; %d calls a round, median of %d rounds\n", prop.name, prop.multiProcessorCount, n,
              rounds);
  CHECK(cudaFree(nullptr));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* d_out = nullptr;
  CHECK(cudaMalloc(&d_out, sizeof(int)));
  // Warm up the launches and the pool.
  for (int i = 0; i < 100; ++i) empty_kernel<<<1, 32, 0, s>>>();
  CHECK(cudaDeviceSynchronize());

  row("launch, empty kernel, legacy default stream",
      time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, cudaStreamLegacy>>>(); }));
  row("launch, empty kernel, own stream",
      time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, s>>>(); }));
  row("launch, empty kernel, per-thread default stream",
      time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, cudaStreamPerThread>>>(); }));
  Big big{};
  row("launch, 1 KB of arguments, own stream",
      time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) big_args_kernel<<<1, 32, 0, s>>>(big, d_out); }));
  row("launch, 132 blocks x 256 threads, own stream",
      time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) empty_kernel<<<132, 256, 0, s>>>(); }));
  {
    std::vector<void*> ptrs(n);
    row("cudaMallocAsync 64 KB (pool warm)", time_host(rounds, n, [&] {
          for (int i = 0; i < n; ++i) CHECK(cudaMallocAsync(&ptrs[i], 65536, s));
        }, [&] { for (void* p : ptrs) CHECK(cudaFreeAsync(p, s)); CHECK(cudaDeviceSynchronize()); }));
    row("cudaMallocAsync + cudaFreeAsync 64 KB pair", time_host(rounds, n, [&] {
          for (int i = 0; i < n; ++i) {
            CHECK(cudaMallocAsync(&ptrs[0], 65536, s));
            CHECK(cudaFreeAsync(ptrs[0], s));
          }
        }));
  }
  {
    std::vector<unsigned char> pageable(256, 1);
    unsigned char* pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, 256));
    void* dst = nullptr;
    CHECK(cudaMalloc(&dst, 256));
    row("cudaMemcpyAsync H2D 256 B from pageable memory",
        time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) CHECK(cudaMemcpyAsync(dst, pageable.data(), 256, cudaMemcpyHostToDevice, s)); }));
    row("cudaMemcpyAsync H2D 256 B from pinned memory",
        time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) CHECK(cudaMemcpyAsync(dst, pinned, 256, cudaMemcpyHostToDevice, s)); }));
    row("cudaMemcpy (sync) D2D 256 B",
        time_host(rounds, std::max(1, n / 10), [&] { for (int i = 0; i < std::max(1, n / 10); ++i) CHECK(cudaMemcpy(dst, d_out, 4, cudaMemcpyDeviceToDevice)); }));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dst));
  }
  {
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    row("cudaEventRecord", time_host(rounds, n, [&] { for (int i = 0; i < n; ++i) CHECK(cudaEventRecord(ev, s)); }));
    CHECK(cudaEventDestroy(ev));
  }

  // Graphs: capture n launches, instantiate, launch; a fresh capture applied by cudaGraphExecUpdate.
  auto capture = [&](cudaGraph_t* g) {
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, s>>>();
    CHECK(cudaStreamEndCapture(s, g));
  };
  std::vector<double> cap, inst, upd, launch;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now_us();
    cudaGraph_t gr;
    capture(&gr);
    cap.push_back((now_us() - t0) / n);
    if (!exec) {
      t0 = now_us();
      CHECK(cudaGraphInstantiate(&exec, gr, 0));
      inst.push_back(now_us() - t0);
      g = gr;
    } else {
      t0 = now_us();
      cudaGraphExecUpdateResultInfo info{};
      CHECK(cudaGraphExecUpdate(exec, gr, &info));
      upd.push_back((now_us() - t0) / n);
      CHECK(cudaGraphDestroy(gr));
    }
    t0 = now_us();
    CHECK(cudaGraphLaunch(exec, s));
    launch.push_back(now_us() - t0);
    CHECK(cudaStreamSynchronize(s));
  }
  row("stream capture of a launch (host, a launch)", median(cap));
  row("cudaGraphInstantiate, whole graph (once)", inst[0]);
  row("cudaGraphExecUpdate from a fresh capture (a node)", median(upd));
  row("cudaGraphLaunch, whole graph (host)", median(launch));

  // GPU time of n empty kernels: launched one by one with the work queued behind a spin, and as one graph.
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> gpu_launch, gpu_graph;
  for (int r = 0; r < rounds; ++r) {
    CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, s>>>();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    gpu_launch.push_back(1000.0 * ms / n);
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    gpu_graph.push_back(1000.0 * ms / n);
  }
  row("GPU time a kernel, launched one by one (events)", median(gpu_launch), "(host-bound if = the launch row)");
  row("GPU time a kernel node, one graph (events)", median(gpu_graph));

  // PDL: a chain of kLinks kernels of 4 MB each, captured as one graph per mode.
  {
    constexpr int kLinks = 64, kBlocks = 528, kThreads = 256;
    constexpr long long kN4 = (4ll << 20) / 16;
    float4* w = nullptr;
    float* io = nullptr;
    CHECK(cudaMalloc(&w, kLinks * kN4 * 16));
    CHECK(cudaMemset(w, 0, kLinks * kN4 * 16));
    CHECK(cudaMalloc(&io, (kLinks + 1) * kBlocks * sizeof(float)));
    CHECK(cudaMemset(io, 0, (kLinks + 1) * kBlocks * sizeof(float)));
    const char* names[3] = {"GPU time a 4 MB link, plain launches in a graph", "the same with PDL, waiting first",
                            "the same with PDL, first loads before the wait"};
    for (int mode = 0; mode < 3; ++mode) {
      cudaGraph_t cg;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < kLinks; ++l) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(kBlocks);
        cfg.blockDim = dim3(kThreads);
        cfg.stream = s;
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = mode == 0 ? 0 : 1;
        const float4* wl = w + l * kN4;
        const float* in = io + l * kBlocks;
        float* out = io + (l + 1) * kBlocks;
        if (mode == 0) CHECK(cudaLaunchKernelEx(&cfg, chain_kernel<0>, wl, kN4, in, out));
        else if (mode == 1) CHECK(cudaLaunchKernelEx(&cfg, chain_kernel<1>, wl, kN4, in, out));
        else CHECK(cudaLaunchKernelEx(&cfg, chain_kernel<2>, wl, kN4, in, out));
      }
      CHECK(cudaStreamEndCapture(s, &cg));
      cudaGraphExec_t ce;
      CHECK(cudaGraphInstantiate(&ce, cg, 0));
      CHECK(cudaGraphLaunch(ce, s));  // warm-up
      CHECK(cudaStreamSynchronize(s));
      std::vector<double> t;
      for (int r = 0; r < rounds; ++r) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(ce, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(1000.0 * ms / kLinks);
      }
      char note[64];
      std::snprintf(note, sizeof note, "(%.0f GB/s)", 4.0 * 1048576.0 / (median(t) * 1e3));
      row(names[mode], median(t), note);
      CHECK(cudaGraphExecDestroy(ce));
      CHECK(cudaGraphDestroy(cg));
    }
    CHECK(cudaFree(w));
    CHECK(cudaFree(io));
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(d_out));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
