// sparrow_host_overhead: what the CUDA runtime's calls cost the host on this machine, the figures
// behind the decision how a decode step is enqueued (launch by launch, or as a CUDA graph).
//
// For each call it times N calls back to back on the host (steady_clock, median of R rounds) and
// prints microseconds a call: empty-kernel launches on the legacy default stream and on a stream of
// its own, a launch with 1 KB of arguments, stream-ordered alloc/free pairs, small host-to-device
// copies from pageable and from pinned memory, event records; then the same N launches recorded by
// stream capture (a call's host cost while capturing), the graph's instantiation, an update of the
// instantiated graph from a fresh capture (cudaGraphExecUpdate), and a launch of the whole graph;
// and the GPU's time for N empty kernels as launches and as one graph (events). Usage:
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
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(d_out));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
