// CUDA graphs for a step's work: see step_graph.h.
#include "backends/cuda/step_graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace sparrow::cuda {

namespace {

thread_local StepGraphs* t_capturing = nullptr;
thread_local int t_long_lived = 0;

// The memory device_free may be handed that is not the pool's, under one mutex: every StepGraphs
// (its arena slots), the slots of destroyed ones whose tensors are still alive, and what captures
// took with cudaMalloc (side_alloc).
struct Orphan {
  char* dev;
  size_t cap;
  int64_t live;
};
struct StepMemory {
  std::mutex mu;
  std::vector<StepGraphs*> graphs;
  std::vector<Orphan> orphans;
  std::unordered_set<void*> side;
};
StepMemory& step_memory() {
  static StepMemory m;
  return m;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void mix(uint64_t& h, uint64_t v) { h = (h ^ v) * 1099511628211ull; }

// What a kept executable graph must share with a new capture for an in-place update: the nodes in
// order with their types, each kernel's function, grid, block and shared memory, each copy's and
// fill's extent. An update then changes only addresses and kernel arguments (an update across
// other changes is allowed by the API, but a step of another shape is rare enough to get its own).
std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  size_t n = 0;
  SPARROW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) SPARROW_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}
cudaGraphNodeType node_type(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  SPARROW_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  return type;
}
// A kernel node's parameters; false for a kernel launched through the driver API, as cuBLASLt's
// are, which has no runtime function to report (the query's error is cleared).
bool kernel_node_params(cudaGraphNode_t node, cudaKernelNodeParams& k) {
  if (cudaGraphKernelNodeGetParams(node, &k) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

uint64_t graph_signature(cudaGraph_t graph) {
  const std::vector<cudaGraphNode_t> nodes = graph_nodes(graph);
  uint64_t h = 1469598103934665603ull ^ nodes.size();
  for (cudaGraphNode_t node : nodes) {
    const cudaGraphNodeType type = node_type(node);
    mix(h, static_cast<uint64_t>(type));
    // (A driver-launched kernel is known by its type alone.)
    if (cudaKernelNodeParams k{}; type == cudaGraphNodeTypeKernel) {
      if (kernel_node_params(node, k)) {
        mix(h, reinterpret_cast<uintptr_t>(k.func));
        for (unsigned v : {k.gridDim.x, k.gridDim.y, k.gridDim.z, k.blockDim.x, k.blockDim.y, k.blockDim.z,
                           k.sharedMemBytes})
          mix(h, v);
      }
    } else if (cudaMemcpy3DParms c{}; type == cudaGraphNodeTypeMemcpy) {
      if (cudaGraphMemcpyNodeGetParams(node, &c) == cudaSuccess)
        for (size_t v : {c.extent.width, c.extent.height, c.extent.depth, static_cast<size_t>(c.kind)}) mix(h, v);
      else
        cudaGetLastError();
    } else if (cudaMemsetParams m{}; type == cudaGraphNodeTypeMemset) {
      if (cudaGraphMemsetNodeGetParams(node, &m) == cudaSuccess)
        for (size_t v : {m.width, m.height, m.pitch, static_cast<size_t>(m.elementSize), static_cast<size_t>(m.value)})
          mix(h, v);
      else
        cudaGetLastError();
    }
  }
  return h;
}

// A graph's nodes, its kernel nodes, those of them launched through the driver API (whose function
// the runtime cannot report: cuBLASLt's), its fill (memset) nodes and host-to-device copies.
StepSegmentTime node_counts(cudaGraph_t graph) {
  StepSegmentTime t;
  const std::vector<cudaGraphNode_t> nodes = graph_nodes(graph);
  t.nodes = static_cast<int>(nodes.size());
  for (cudaGraphNode_t node : nodes) {
    const cudaGraphNodeType type = node_type(node);
    if (type == cudaGraphNodeTypeMemset) ++t.fills;
    if (cudaMemcpy3DParms c{}; type == cudaGraphNodeTypeMemcpy) {
      if (cudaGraphMemcpyNodeGetParams(node, &c) == cudaSuccess && c.kind == cudaMemcpyHostToDevice) ++t.uploads;
      cudaGetLastError();
    }
    if (type != cudaGraphNodeTypeKernel) continue;
    ++t.kernels;
    if (cudaKernelNodeParams k{}; !kernel_node_params(node, k)) ++t.driver_kernels;
  }
  return t;
}

// SPARROW_CUDA_GRAPH_NODES=N: the first N captured segments' nodes on stderr, in the capture's
// order: the type, a kernel's name and grid, a copy's or fill's bytes, and the incoming edges (p: a
// programmatic one, programmatic dependent launch's; f: full completion). What a segment is made of.
void dump_nodes(cudaGraph_t graph, int segment) {
  const std::vector<cudaGraphNode_t> nodes = graph_nodes(graph);
  std::fprintf(stderr, "sparrow: segment %d, %zu nodes\n", segment, nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    size_t n_deps = 0;
    std::string edges;
    if (cudaGraphNodeGetDependencies(nodes[i], nullptr, nullptr, &n_deps) == cudaSuccess && n_deps > 0) {
      std::vector<cudaGraphNode_t> deps(n_deps);
      std::vector<cudaGraphEdgeData> data(n_deps);
      if (cudaGraphNodeGetDependencies(nodes[i], deps.data(), data.data(), &n_deps) == cudaSuccess)
        for (size_t d = 0; d < n_deps; ++d) {
          const auto at = std::find(nodes.begin(), nodes.end(), deps[d]) - nodes.begin();
          edges += " " + std::to_string(at) + (data[d].type == cudaGraphDependencyTypeProgrammatic ? "p" : "f");
        }
    }
    cudaGetLastError();
    const cudaGraphNodeType type = node_type(nodes[i]);
    char what[256] = "other";
    if (cudaKernelNodeParams k{}; type == cudaGraphNodeTypeKernel) {
      const char* name = "(driver kernel)";
      if (kernel_node_params(nodes[i], k) && cudaFuncGetName(&name, k.func) != cudaSuccess) name = "?";
      cudaGetLastError();
      std::snprintf(what, sizeof what, "kernel %s grid (%u,%u,%u)", name, k.gridDim.x, k.gridDim.y, k.gridDim.z);
    } else if (cudaMemcpy3DParms c{}; type == cudaGraphNodeTypeMemcpy) {
      if (cudaGraphMemcpyNodeGetParams(nodes[i], &c) == cudaSuccess)
        std::snprintf(what, sizeof what, "memcpy %zu bytes kind %d", c.extent.width * c.extent.height * c.extent.depth,
                      static_cast<int>(c.kind));
      cudaGetLastError();
    } else if (cudaMemsetParams m{}; type == cudaGraphNodeTypeMemset) {
      if (cudaGraphMemsetNodeGetParams(nodes[i], &m) == cudaSuccess)
        std::snprintf(what, sizeof what, "memset %zu bytes", m.width * m.height * m.elementSize);
      cudaGetLastError();
    } else {
      std::snprintf(what, sizeof what, "type %d", static_cast<int>(type));
    }
    std::fprintf(stderr, "  %3zu %s <-%s\n", i, what, edges.c_str());
  }
}

}  // namespace

void StepGraphs::set_kernel_trace(bool on) {
  if (on && trace_dev_ == nullptr) {
    const size_t bytes = sizeof(KernelTraceSlot) * kKernelTraceSlots * kTraceRegions;
    SPARROW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&trace_dev_), bytes));
    SPARROW_CUDA_CHECK(cudaMemsetAsync(trace_dev_, 0xff, bytes, cudaStreamPerThread));
  }
  trace_ = on;
}

std::vector<KernelTraceLaunch> StepGraphs::take_kernel_trace() {
  std::vector<KernelTraceLaunch> out;
  if (trace_dev_ == nullptr || traced_.empty()) return out;
  const size_t region_slots = kKernelTraceSlots;
  std::vector<KernelTraceSlot> host(region_slots * traced_.size());
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  SPARROW_CUDA_CHECK(cudaMemcpy(host.data(), trace_dev_, host.size() * sizeof(KernelTraceSlot), cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < traced_.size(); ++r) {
    const KernelTraceSlot* region = host.data() + r * region_slots;
    KernelTraceLaunch l{.segment = traced_[r].segment, .kernels = std::move(traced_[r].kernels)};
    l.collisions = static_cast<int64_t>(region[0].blocks + 1);  // (the fill wraps to 0 at the first)
    for (size_t i = 1; i < region_slots; ++i) {
      const KernelTraceSlot& s = region[i];
      if (s.grid == ~uint64_t{0}) continue;
      l.records.push_back({.grid = s.grid, .first_at_wait = s.first_at_wait, .first_past_wait = s.first_past_wait,
                           .last_past_wait = ~s.last_past_wait_inverted, .blocks = static_cast<int64_t>(s.blocks + 1)});
    }
    std::sort(l.records.begin(), l.records.end(),
              [](const KernelTraceRecord& a, const KernelTraceRecord& b) { return a.grid < b.grid; });
    out.push_back(std::move(l));
  }
  SPARROW_CUDA_CHECK(cudaMemset(trace_dev_, 0xff, host.size() * sizeof(KernelTraceSlot)));
  traced_.clear();
  return out;
}

std::vector<StepSegmentTime> StepGraphs::take_times() {
  std::vector<StepSegmentTime> out;
  out.reserve(timed_.size());
  for (Timed& t : timed_) {
    SPARROW_CUDA_CHECK(cudaEventSynchronize(t.stop));
    SPARROW_CUDA_CHECK(cudaEventElapsedTime(&t.t.ms, t.start, t.stop));
    SPARROW_CUDA_CHECK(cudaEventDestroy(t.start));
    SPARROW_CUDA_CHECK(cudaEventDestroy(t.stop));
    out.push_back(t.t);
  }
  timed_.clear();
  return out;
}

StepGraphs* capturing_step() { return t_capturing; }
LongLived::LongLived() { ++t_long_lived; }
LongLived::~LongLived() { --t_long_lived; }
bool long_lived_now() { return t_long_lived > 0; }

bool release_step_memory(void* p) {
  StepMemory& m = step_memory();
  std::unique_lock<std::mutex> lock(m.mu);
  for (StepGraphs* g : m.graphs)
    if (g->arena_release(p)) return true;
  for (auto it = m.orphans.begin(); it != m.orphans.end(); ++it) {
    if (p < it->dev || p >= it->dev + it->cap) continue;
    if (--it->live == 0) {
      cudaFree(it->dev);  // (errors ignored: at process exit the runtime may be unloading)
      m.orphans.erase(it);
    }
    return true;
  }
  if (m.side.erase(p) == 0) return false;
  lock.unlock();
  if (StepGraphs* g = t_capturing) g->defer_side_free(p);
  else SPARROW_CUDA_CHECK(cudaFree(p));  // (waits for the device: these are rare)
  return true;
}

StepGraphs::StepGraphs() {
  StepMemory& m = step_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.graphs.push_back(this);
}

StepGraphs::~StepGraphs() {
  // Errors are ignored: at process exit the runtime may already be unloading.
  for (auto& kept : kept_)
    for (Kept& k : kept) cudaGraphExecDestroy(k.exec);
  cudaStreamSynchronize(cudaStreamPerThread);
  if (trace_dev_ != nullptr) cudaFree(trace_dev_);
  {
    StepMemory& m = step_memory();
    std::lock_guard<std::mutex> lock(m.mu);
    m.graphs.erase(std::remove(m.graphs.begin(), m.graphs.end(), this), m.graphs.end());
    // A slot whose tensors outlive the backend stays allocated until the last of them is freed.
    for (Slot& s : slots_)
      if (s.blocks.live() > 0) m.orphans.push_back({s.dev, s.dev_cap, static_cast<int64_t>(s.blocks.live())});
  }
  for (Slot& s : slots_) {
    if (s.blocks.live() == 0 && s.dev) cudaFree(s.dev);
    if (s.pinned) cudaFreeHost(s.pinned);
    for (void* p : s.extra_pinned) cudaFreeHost(p);
    if (s.done) cudaEventDestroy(s.done);
  }
  for (const Timed& t : timed_) {  // segment times never taken
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
  }
}

bool StepGraphs::begin() {
  SPARROW_CHECK(!capturing_);
  // The slot after the last one used, else the last one itself, if no tensor of it is alive.
  int s = 1 - cur_;
  if (slots_[s].blocks.live() > 0) s = cur_;
  if (slots_[s].blocks.live() > 0) return false;
  Slot& slot = slots_[s];
  // The staging memory may still be read by the slot's last graph.
  if (slot.launched) SPARROW_CUDA_CHECK(cudaEventSynchronize(slot.done));
  slot.launched = false;
  for (void* p : slot.extra_pinned) SPARROW_CUDA_CHECK(cudaFreeHost(p));
  slot.extra_pinned.clear();
  if (!slot.done) SPARROW_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  if (slot.dev_cap < want_dev_) {
    if (slot.dev) SPARROW_CUDA_CHECK(cudaFree(slot.dev));
    slot.dev = nullptr;
    SPARROW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slot.dev), want_dev_));
    slot.dev_cap = want_dev_;
  }
  if (slot.pinned_cap < want_pinned_) {
    if (slot.pinned) SPARROW_CUDA_CHECK(cudaFreeHost(slot.pinned));
    slot.pinned = nullptr;
    SPARROW_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&slot.pinned), want_pinned_, cudaHostAllocMapped));
    slot.pinned_cap = want_pinned_;
  }
  slot.blocks.reset(slot.dev_cap);
  slot.pinned_used = 0;
  demand_dev_ = demand_pinned_ = 0;
  cur_ = s;
  segment_ = 0;
  start_capture();
  return true;
}

void StepGraphs::start_capture() {
  clean_ = true;
  // Relaxed: a one-off staging buffer (cudaHostAlloc) may be made during the capture.
  SPARROW_CUDA_CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  t_capturing = this;
}

void StepGraphs::segment() {
  SPARROW_CHECK(capturing_);
  finish_capture();
  ++segment_;
  start_capture();
}

void* StepGraphs::side_alloc(size_t bytes) {
  clean_ = false;
  void* p = nullptr;
  SPARROW_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  StepMemory& m = step_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.side.insert(p);
  return p;
}

void* StepGraphs::arena_alloc(size_t bytes, bool long_lived) {
  if (long_lived) return side_alloc(bytes);
  Slot& slot = slots_[cur_];
  const size_t off = slot.blocks.take(bytes);
  if (off == ArenaBlocks::kNone) {
    demand_dev_ += ArenaBlocks::rounded(bytes);  // (beyond the arena's high water: what it lacked)
    return side_alloc(bytes);
  }
  return slot.dev + off;
}

const void* StepGraphs::stage(const void* src, size_t bytes) {
  const size_t b = round_up(std::max<size_t>(bytes, 1), 16);
  demand_pinned_ += b;
  Slot& slot = slots_[cur_];
  void* dst;
  if (slot.pinned_used + b <= slot.pinned_cap) {
    dst = slot.pinned + slot.pinned_used;
    slot.pinned_used += b;
  } else {
    clean_ = false;
    SPARROW_CUDA_CHECK(cudaHostAlloc(&dst, bytes, cudaHostAllocMapped));
    slot.extra_pinned.push_back(dst);
  }
  std::memcpy(dst, src, bytes);
  return dst;
}

bool StepGraphs::arena_release(void* p) {
  for (Slot& s : slots_) {
    if (s.dev && p >= s.dev && p < s.dev + s.dev_cap) {
      s.blocks.give(static_cast<size_t>(static_cast<char*>(p) - s.dev));
      return true;
    }
  }
  return false;
}

void StepGraphs::end() {
  SPARROW_CHECK(capturing_);
  finish_capture();
  // The next steps' slot sizes: this step's needs with a quarter to spare.
  const size_t need_dev = slots_[cur_].blocks.high_water() + demand_dev_;
  want_dev_ = std::max(want_dev_, round_up(need_dev + need_dev / 4, size_t{1} << 20));
  want_pinned_ = std::max(want_pinned_, round_up(demand_pinned_ + demand_pinned_ / 4, size_t{64} << 10));
  Slot& slot = slots_[cur_];
  SPARROW_CUDA_CHECK(cudaEventRecord(slot.done, cudaStreamPerThread));
  slot.launched = true;
  ++stats_.captured;
}

void StepGraphs::finish_capture() {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(cudaStreamPerThread, &graph);
  capturing_ = false;
  t_capturing = nullptr;
  if (err != cudaSuccess) {
    std::fprintf(stderr,
                 "sparrow: a step's CUDA graph capture failed: %s (an op synchronised or used the legacy stream "
                 "inside the step; SPARROW_CUDA_DISABLE=graphs runs steps without graphs)\n",
                 cudaGetErrorString(err));
    std::abort();
  }
  static int64_t dumps_left = cuda_env_int(
      "SPARROW_CUDA_GRAPH_NODES", 0, [](int64_t n) { return n >= 0 && n <= (int64_t{1} << 30); },
      "the captured segments whose nodes are printed must be a count from 0 to 2^30");
  if (dumps_left > 0) {
    --dumps_left;
    dump_nodes(graph, segment_);
  }
  cudaGraphExec_t exec = nullptr;
  // SPARROW_CUDA_DISABLE=graph_update: every capture instantiated anew and dropped (to bisect).
  static const bool update_on = cuda_feature_on("graph_update");
  const bool keep = clean_ && update_on;
  if (keep) {
    if (kept_.size() <= static_cast<size_t>(segment_)) kept_.resize(segment_ + 1);
    std::vector<Kept>& kept = kept_[segment_];
    const uint64_t signature = graph_signature(graph);
    auto it = std::find_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.signature == signature; });
    if (it != kept.end()) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(it->exec, graph, &info) == cudaSuccess) {
        exec = it->exec;
        it->last_use = ++tick_;
        ++stats_.updated;
      } else {
        cudaGetLastError();  // (the refusal is not an error of the step)
        SPARROW_CUDA_CHECK(cudaGraphExecDestroy(it->exec));  // freed once any launch of it has finished
        kept.erase(it);
      }
    }
    if (!exec) {
      SPARROW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      if (static_cast<int>(kept.size()) >= kKept) {
        auto lru = std::min_element(kept.begin(), kept.end(),
                                    [](const Kept& a, const Kept& b) { return a.last_use < b.last_use; });
        SPARROW_CUDA_CHECK(cudaGraphExecDestroy(lru->exec));
        kept.erase(lru);
      }
      kept.push_back({exec, signature, ++tick_});
      ++stats_.instantiated;
    }
  } else {
    SPARROW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ++stats_.one_off;
  }
  Timed timed;
  if (timing_) {
    timed.t = node_counts(graph);
    timed.t.segment = segment_;
    SPARROW_CUDA_CHECK(cudaEventCreate(&timed.start));
    SPARROW_CUDA_CHECK(cudaEventCreate(&timed.stop));
    SPARROW_CUDA_CHECK(cudaEventRecord(timed.start, cudaStreamPerThread));
  }
  // Traced: this launch's kernels record into region traced_.size() (set in stream order before
  // the launch, cleared after it, so nothing else records there).
  const bool traced = trace_ && trace_dev_ != nullptr && static_cast<int>(traced_.size()) < kTraceRegions;
  if (traced) {
    Traced t{.segment = segment_};
    for (cudaGraphNode_t node : graph_nodes(graph)) {
      if (node_type(node) != cudaGraphNodeTypeKernel) continue;
      const char* name = "(driver kernel)";
      if (cudaKernelNodeParams k{}; kernel_node_params(node, k) && cudaFuncGetName(&name, k.func) != cudaSuccess) name = "?";
      cudaGetLastError();
      t.kernels.emplace_back(name);
    }
    cuda::set_kernel_trace(trace_dev_ + traced_.size() * kKernelTraceSlots);
    traced_.push_back(std::move(t));
  }
  SPARROW_CUDA_CHECK(cudaGraphLaunch(exec, cudaStreamPerThread));
  if (traced) cuda::set_kernel_trace(static_cast<KernelTraceSlot*>(nullptr));
  if (timing_) {
    SPARROW_CUDA_CHECK(cudaEventRecord(timed.stop, cudaStreamPerThread));
    timed_.push_back(timed);
  }
  if (!keep) SPARROW_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SPARROW_CUDA_CHECK(cudaGraphDestroy(graph));
  ++stats_.segments;
  for (void* p : deferred_frees_) SPARROW_CUDA_CHECK(cudaFreeAsync(p, cudaStreamPerThread));
  deferred_frees_.clear();
  for (void* p : deferred_side_frees_) SPARROW_CUDA_CHECK(cudaFree(p));  // (after the launch: waits for it)
  deferred_side_frees_.clear();
}

}  // namespace sparrow::cuda
