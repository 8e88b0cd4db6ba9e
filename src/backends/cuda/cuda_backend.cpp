// The CUDA backend's host side: validates each op's arguments, uploads what the kernels need
// (weights once, the batch's positions and ids once per batch, small per-op plans), tracks the
// per-sequence counters, and launches the kernels declared in kernels.h.
//
// It mirrors src/backends/cpu/cpu_backend.cpp op for op; where the CPU walks a sequence's tokens in
// order (compressor), the host plans the same walk (which windows complete, where entries go) and
// the kernel replays it.
#include "backends/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "backends/cuda/bf16_linear.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_state.h"
#include "backends/cuda/fp4_layout.h"
#include "backends/cuda/fp8_linear.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/step_graph.h"
#include "core/check.h"

namespace sparrow {
namespace cuda {

bool sync_every_launch() {
  static const bool sync = [] {
    const char* v = std::getenv("SPARROW_CUDA_SYNC");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return sync;
}

namespace {
thread_local cudaStream_t t_launch_stream = cudaStreamPerThread;
// (SideStream) Where set, device_free keeps the pointers here instead of freeing them.
thread_local std::vector<void*>* t_held_frees = nullptr;
}  // namespace

cudaStream_t launch_stream() { return t_launch_stream; }
LaunchStreamScope::LaunchStreamScope(cudaStream_t stream) : previous_(t_launch_stream) { t_launch_stream = stream; }
LaunchStreamScope::~LaunchStreamScope() { t_launch_stream = previous_; }

void launch_check(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "sparrow: CUDA launch failed in %s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
  if (sync_every_launch() && (err = cudaDeviceSynchronize()) != cudaSuccess) {
    std::fprintf(stderr, "sparrow: CUDA kernel failed in %s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
}

namespace {

// The comma-separated names in `list` (null: none).
std::vector<std::string> split_names(const char* list) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* c = list ? list : ""; ; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*c == '\0') break;
    } else {
      cur += *c;
    }
  }
  return out;
}
std::vector<std::string> env_names(const char* var) { return split_names(std::getenv(var)); }

// Every name cuda_feature_on and cuda_feature_enabled are asked about (kernels.h says what each
// switches). CTest cuda_feature_names checks these lists against the names the sources ask about.
constexpr std::string_view kCudaSwitches[] = {  // SPARROW_CUDA_DISABLE
    "act_quant_half", "act_quant_shared", "alloc_nofill", "argmax", "async_upload", "attn_bf16_kv", "attn_dims",
    "attn_mma", "attn_narrow", "attn_o_fold", "attn_overlap", "attn_q_fold", "attn_split", "attn_warp", "attn_wg_pair", "attn_wgmma", "bf16_f32_in",
    "bf16_fp8_w", "bf16_gemm", "bf16_tma", "bf16_wgmma", "compressor_parallel", "copy_kernels", "fp8_gemm", "fp8_stack",
    "fp8_quant_in", "fp8_tma", "fp8_wgmma", "fused_round", "graph_update", "graphs", "grouped_moe", "hc_fused", "hc_pre4", "hc_split",
    "hc_staged", "indexer_fast", "indexer_mma", "indexer_tiled", "moe_device_plan", "moe_fused_act", "moe_scatter_store", "moe_shared_beside",
    "moe_x_lazy", "norm_regs", "parts_in_readers", "pdl", "pool", "rope_spread", "router_warp", "scratch_nofill",
    "select_rank", "sim_warp", "swiglu_sim", "vec_linear", "w4a8", "w4a8_early", "w4a8_pair", "w4a8_producer",
    "w4a8_persistent", "w4a8_ring", "w4a8_ring_bulk", "w4a8_tiled", "w4a8_wgmma"};
constexpr std::string_view kCudaOptIns[] = {"attn_wg_ahead", "fp8_pair", "kv_record", "w4a8_expand"};  // SPARROW_CUDA_ENABLE

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}
template <size_t N>
std::string joined(const std::string_view (&names)[N]) {
  std::string out;
  for (std::string_view n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// set_attention_scratch_cap's bytes; 0: the default, 256 MB.
std::atomic<int64_t> g_attention_scratch_cap{0};
int64_t attention_scratch_cap_bytes() {
  const int64_t v = g_attention_scratch_cap.load();
  return v > 0 ? v : int64_t{256} << 20;
}

}  // namespace

bool cuda_feature_on(const char* name) {
  static const std::vector<std::string> disabled = env_names("SPARROW_CUDA_DISABLE");
  return std::find(disabled.begin(), disabled.end(), name) == disabled.end();
}
bool cuda_feature_enabled(const char* name) {
  static const std::vector<std::string> enabled = env_names("SPARROW_CUDA_ENABLE");
  return std::find(enabled.begin(), enabled.end(), name) != enabled.end();
}
Status check_feature_names(const char* disable, const char* enable) {
  // Every name of `names` (variable `var`) in `own` (its `kinds`); one in `other` is a path that is
  // `by_default`, which `other_var` turns `to`.
  const auto check = [](const char* names, const std::string& var, const auto& own, const char* kinds, const auto& other,
                        const std::string& other_var, const char* by_default, const char* to) -> Status {
    for (const std::string& n : split_names(names)) {
      if (listed(own, n)) continue;
      if (listed(other, n))
        return Status::invalid_argument(var + " names '" + n + "', a path that is " + by_default + " by default: " + other_var + "=" +
                                        n + " turns it " + to);
      return Status::invalid_argument(var + " names '" + n + "', which is none of this build's " + kinds + " (docs/cuda.md): " +
                                      joined(own));
    }
    return Status::ok();
  };
  if (Status st = check(disable, "SPARROW_CUDA_DISABLE", kCudaSwitches, "switches", kCudaOptIns, "SPARROW_CUDA_ENABLE", "off", "on");
      !st.is_ok())
    return st;
  return check(enable, "SPARROW_CUDA_ENABLE", kCudaOptIns, "opt-in paths", kCudaSwitches, "SPARROW_CUDA_DISABLE", "on", "off");
}
int64_t cuda_env_int(const char* var, int64_t fallback, bool (*ok)(int64_t), const char* rule) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  const bool digits_first = (*v >= '0' && *v <= '9') || *v == '-';  // (strtoll skips spaces and takes '+')
  if (!digits_first || *end != '\0' || errno != 0 || !ok(static_cast<int64_t>(n)))
    throw std::runtime_error(std::string(var) + "=" + v + ": " + rule);
  return static_cast<int64_t>(n);
}

int cuda_probe_repeats(const char* var) {
  return static_cast<int>(cuda_env_int(var, 0, [](int64_t n) { return n >= 0 && n <= 8; },
                                       "a probe's extra launches must be 0 to 8"));
}

// Device memory comes from the stream-ordered allocator on the default stream (all of the backend's
// work runs there): a cudaFree would synchronise the whole device, and the forward allocates and
// frees its activations op by op. make_cuda_backend raises the default pool's release threshold so
// freed blocks stay cached for the next allocation instead of going back to the driver at every
// synchronisation (cudaMemGetInfo then counts them as used; trim_device_pool gives them back).
//
// While a step is captured into a CUDA graph (step_graph.h), memory comes from the capture's arena
// (cudaMalloc for LongLived memory and what does not fit), and pool memory freed in the step is
// freed after the graph's launch.
// A captured step's own fills and uploads (not those of long-lived memory: weights, sequence state)
// as kernels, fill_bytes / upload_pinned (kernels.h), instead of memset and copy nodes: a node that
// is not a kernel sits between two kernels without a programmatic edge, so the one after it starts
// only once the one before has finished and drained (SPARROW_CUDA_DISABLE=copy_kernels: the nodes).
// The upload kernel reads the staging memory through its device mapping (unified addressing).
bool step_copy_kernels() {
  static const bool on = [] {
    int device = 0, unified = 0;
    return cuda_feature_on("copy_kernels") && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device) == cudaSuccess && unified == 1;
  }();
  return on && capturing_step() != nullptr && !long_lived_now();
}

// bytes [p, p + bytes) set to `byte`, in stream order.
void fill_device(void* p, uint8_t byte, size_t bytes) {
  if (bytes == 0) return;
  if (step_copy_kernels()) {
    launch_fill_bytes(p, byte, static_cast<int64_t>(bytes));
    launch_check("fill (captured step)");
  } else {
    SPARROW_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, launch_stream()));
  }
}

void* device_alloc(size_t bytes, bool zero) {
  static const bool pool = cuda_feature_on("pool");
  void* p = nullptr;
  if (StepGraphs* g = capturing_step()) {
    p = g->arena_alloc(bytes, long_lived_now());
  } else if (pool) {
    SPARROW_CUDA_CHECK(cudaMallocAsync(&p, bytes, launch_stream()));
  } else {
    SPARROW_CUDA_CHECK(cudaMalloc(&p, bytes));
    if (zero) SPARROW_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
  }
  if (zero) fill_device(p, 0, bytes);
  return p;
}

// Errors are ignored here: at process exit the runtime may already be unloading.
void device_free(void* p) {
  static const bool pool = cuda_feature_on("pool");
  if (p && t_held_frees) return t_held_frees->push_back(p);
  if (!p || release_step_memory(p)) return;
  if (StepGraphs* g = capturing_step()) return g->defer_free(p);
  if (pool) cudaFreeAsync(p, launch_stream());
  else cudaFree(p);
}

void trim_device_pool() {
  cudaMemPool_t pool;
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  SPARROW_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  SPARROW_CUDA_CHECK(cudaDeviceSynchronize());
  SPARROW_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

bool poison_alloc() {
  static const bool on = [] {
    const char* v = std::getenv("SPARROW_CUDA_POISON_ALLOC");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

DeviceBuffer::DeviceBuffer(size_t bytes, bool zero) : bytes_(bytes) {
  if (bytes == 0) return;
  ptr_ = device_alloc(bytes, zero);
}

DeviceBuffer DeviceBuffer::scratch(size_t bytes) {
  static const bool nofill = cuda_feature_on("scratch_nofill");
  // Under SPARROW_CUDA_POISON_ALLOC=1 it starts as 0xff bytes, as tensors do (alloc), so that a read
  // of a byte no kernel wrote shows in the results. (Poisoning every unfilled buffer, uploads
  // included, put fills before the uploads' copies in the captured steps, and kept graphs were then
  // seldom updated in place: CudaModelParity.StepGraphsGiveTheSameBits, H200, 2026-12-02.)
  if (!poison_alloc()) return DeviceBuffer(bytes, !nofill);
  DeviceBuffer b(bytes, false);
  fill_device(b.get(), 0xff, bytes);
  return b;
}

DeviceBuffer::~DeviceBuffer() { device_free(ptr_); }

void DeviceBuffer::ensure(size_t bytes) {
  if (bytes_ >= bytes) return;
  const LongLived kept;  // scratch kept between calls, not a step's
  *this = DeviceBuffer(bytes);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    device_free(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void CompressorBuffer::init(int64_t r, int64_t d, bool ov) {
  const LongLived state;
  ratio = r;
  dim = d;
  overlap = ov;
  const int64_t width = overlap ? 2 * dim : dim;
  pending_kv = DeviceBuffer(ratio * width * sizeof(float));
  pending_gate = DeviceBuffer(ratio * width * sizeof(float));
  if (overlap) {
    prev_kv = DeviceBuffer(ratio * dim * sizeof(float));
    prev_gate = DeviceBuffer(ratio * dim * sizeof(float));
  }
}

void CompressorBuffer::reserve(int64_t n) {
  SPARROW_CHECK_LE(count, capacity);
  if (n <= capacity) return;
  const LongLived state;
  const int64_t cap = std::max<int64_t>({n, 2 * capacity, 16});
  if (records()) {
    DeviceBuffer grown_rec(cap * rec.bytes);
    if (count > 0)
      SPARROW_CUDA_CHECK(cudaMemcpyAsync(grown_rec.get(), entries_rec.get(), count * rec.bytes, cudaMemcpyDeviceToDevice,
                                         launch_stream()));
    entries_rec = std::move(grown_rec);
    capacity = cap;
    return;
  }
  DeviceBuffer grown(cap * dim * sizeof(float));
  if (count > 0)
    SPARROW_CUDA_CHECK(cudaMemcpyAsync(grown.get(), entries.get(), count * dim * sizeof(float),
                                       cudaMemcpyDeviceToDevice, launch_stream()));
  entries = std::move(grown);
  if (entries_bf16.get()) {
    DeviceBuffer grown16(cap * dim * sizeof(uint16_t));
    if (mirrored > 0)
      SPARROW_CUDA_CHECK(cudaMemcpyAsync(grown16.get(), entries_bf16.get(), mirrored * dim * sizeof(uint16_t),
                                         cudaMemcpyDeviceToDevice, launch_stream()));
    entries_bf16 = std::move(grown16);
  }
  capacity = cap;
}

// Whether the tensor-core attention (attention_mma_kernel) can take calls of H heads of Dh: its
// features on (`attn_mma`, `attn_split`) and the shapes it has forms for. What the KV records, the
// bf16 attention weights and CudaBackend::attention's own choice all rest on.
bool attention_tensor_cores_take(int64_t H, int64_t Dh) {
  static const bool on = cuda_feature_on("attn_mma") && cuda_feature_on("attn_split");
  return on && attention_mma_fits(H, Dh);
}

KvRecordLayout kv_records_layout(const ModelConfig& c) {
  const int64_t nope = c.head_dim - c.rope_dim;
  if (!attention_tensor_cores_take(c.num_heads, c.head_dim) || c.rope_dim < 0 || nope <= 0 || nope % kKvRecordBlock != 0)
    return {};
  const KvRecordLayout l = kv_record_layout(c.head_dim, c.rope_dim);
  if (l.bytes % 8 != 0 || l.rope_at % 8 != 0 || l.bytes > 2 * c.head_dim) return {};
  return l;
}

CudaSequenceState::CudaSequenceState(const ModelConfig& c, bool kv_records) : layers_(c.num_layers) {
  const LongLived state;
  const KvRecordLayout rec = kv_records ? kv_records_layout(c) : KvRecordLayout{};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerState& s = layers_[l];
    s.window = c.sliding_window;
    s.rec = rec;
    s.ring = DeviceBuffer(c.sliding_window * c.head_dim * sizeof(float));
    if (cuda_feature_on("attn_bf16_kv")) s.ring_bf16 = DeviceBuffer(c.sliding_window * c.head_dim * sizeof(uint16_t));
    if (rec.bytes > 0) s.ring_rec = DeviceBuffer(c.sliding_window * rec.bytes);
    const int64_t m = c.compress_ratio[l];
    if (c.attention[l] == AttentionKind::kCsa) {
      s.main.init(m, c.head_dim, /*overlap=*/true);
      s.indexer.init(m, c.index_head_dim, /*overlap=*/true);
    } else if (c.attention[l] == AttentionKind::kHca) {
      s.main.init(m, c.head_dim, /*overlap=*/false);
    }
  }
}

LayerState& CudaSequenceState::layer(int64_t l) {
  SPARROW_CHECK(l >= 0 && l < static_cast<int64_t>(layers_.size()));
  return layers_[l];
}

// Small host-to-device copies (per-op plans, uploads of activations): cudaMemcpyAsync on the
// default stream. A synchronous cudaMemcpy from pageable memory first waits for all queued GPU work,
// so every op with a plan drained the device; the asynchronous form stages the pageable bytes
// before it returns (the source may be freed at once) and keeps the stream's order. Off with
// SPARROW_CUDA_DISABLE=async_upload.
void host_to_device(void* dst, const void* src, size_t bytes) {
  static const bool async = cuda_feature_on("async_upload");
  if (bytes == 0) return;
  if (StepGraphs* g = capturing_step()) {  // a captured copy reads pinned bytes when the graph runs
    const void* staged = g->stage(src, bytes);
    // SPARROW_CUDA_REPEAT_UPLOAD=n (0 to 8, default 0): n more copies of each, writing the same
    // bytes: a probe of what one upload node costs in the captured step (docs/cuda.md).
    static const int repeat = cuda_probe_repeats("SPARROW_CUDA_REPEAT_UPLOAD");
    for (int r = 0; r <= repeat; ++r) {
      if (step_copy_kernels()) {
        launch_upload_pinned(dst, staged, static_cast<int64_t>(bytes));
        launch_check("upload (captured step)");
      } else {
        SPARROW_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, launch_stream()));
      }
    }
  } else if (async) SPARROW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, launch_stream()));
  else SPARROW_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

namespace {

CudaSequenceState& cuda_state(SequenceState* s) {
  auto* cs = dynamic_cast<CudaSequenceState*>(s);
  SPARROW_CHECK(cs != nullptr && "a SequenceState from another backend was passed to the CUDA backend");
  return *cs;
}

template <class T>
DeviceBuffer upload_vector(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T), false);  // (every byte copied over)
  host_to_device(b.get(), v.data(), b.bytes());
  return b;
}

// An op's small host vectors uploaded as one copy: one node of a captured step (an upload_pinned
// kernel) where each vector was one. Each section starts 16-byte aligned; at(section) is its device
// address after upload(), null for an empty section.
class UploadPack {
 public:
  template <class T>
  size_t add(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    sizes_.push_back({at, v.size() * sizeof(T)});
    return sizes_.size() - 1;
  }
  void upload() { buf_ = upload_vector(bytes_); }  // (the gaps' zeros too)
  template <class T>
  const T* at(size_t section) const {
    const auto [offset, bytes] = sizes_.at(section);
    return bytes == 0 ? nullptr : reinterpret_cast<const T*>(static_cast<const uint8_t*>(buf_.get()) + offset);
  }

 private:
  std::vector<uint8_t> bytes_;
  std::vector<std::pair<size_t, size_t>> sizes_;  // (offset, bytes) a section
  DeviceBuffer buf_;
};

RopeTableArg rope_arg(const RopeTable& table) {
  RopeTableArg a;
  SPARROW_CHECK_LE(static_cast<int64_t>(table.inv_freq.size()), kMaxRopePairs);
  a.pairs = static_cast<int>(table.inv_freq.size());
  for (size_t i = 0; i < table.inv_freq.size(); ++i) a.inv_freq[i] = table.inv_freq[i];
  return a;
}

bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 || t == DType::kF8E8M0;
}

// The round_bf16 flags: an op's fp32 output rounded once to bf16, as the CPU does after computing it.
void round_bf16_if(bool round, const Tensor& t, const char* what) {
  if (!round) return;
  launch_bf16_round(t.f32(), t.numel());
  launch_check(what);
}

// fp8_pow2_quant_sim(row, dims, block) of each of n rows of `stride` values, in place.
void fp8_rows(float* x, int64_t n, int64_t stride, int64_t dims, int64_t block, const char* what) {
  launch_row_sim({.x = x, .rows = nullptr, .n = n, .row_stride = stride, .dims = dims, .kind = RowSimKind::kFp8Pow2,
                  .block = block});
  launch_check(what);
}

RowSimArgs row_sim_of(QuantSimKind kind, int64_t dims) {
  switch (kind) {
    case QuantSimKind::kFp8Pow2Block64:
      return {.kind = RowSimKind::kFp8Pow2, .block = 64};
    case QuantSimKind::kFp4Pow2Block32:
      return {.kind = RowSimKind::kFp4Pow2Block32, .block = 32};
    case QuantSimKind::kHadamardBf16:
      SPARROW_CHECK(dims > 0 && (dims & (dims - 1)) == 0 && dims <= kMaxHadamard);
      return {.kind = RowSimKind::kHadamardBf16, .block = 0};
    case QuantSimKind::kBf16:
      return {.kind = RowSimKind::kBf16, .block = 0};
  }
  SPARROW_CHECK(false && "unknown QuantSimKind");
  return {};
}

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFloat: return "float";
    case WeightFormat::kFp8Block: return "fp8";
    case WeightFormat::kFp4Packed: return "fp4";
  }
  return "?";
}

// Per-op timing for `sparrow bench --breakdown` (cuda_backend.h, set_op_profiling): when on, every
// op records a cudaEvent pair around its work on the default stream and its host wall time; take()
// synchronises and sums them per key. Off (the default), an op pays one branch.
class OpProfiler {
 public:
  struct Pending {
    std::string key;
    cudaEvent_t start, stop;
    double host_ms;
  };

  class Scope {
   public:
    // The key is `op`, or for a linear op "op format NxK"; it is built only while profiling.
    Scope(OpProfiler& p, const char* op, const WeightMatrix* w = nullptr) : p_(p.enabled_ ? &p : nullptr) {
      if (!p_) return;
      key_ = op;
      if (w) key_ += std::string(" ") + format_name(w->format) + " " + std::to_string(w->out) + "x" + std::to_string(w->in);
      SPARROW_CUDA_CHECK(cudaEventCreate(&start_));
      SPARROW_CUDA_CHECK(cudaEventCreate(&stop_));
      SPARROW_CUDA_CHECK(cudaEventRecord(start_));
      t0_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (!p_) return;
      cudaEventRecord(stop_);
      const double host = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
      p_->pending_.push_back({std::move(key_), start_, stop_, host});
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler* p_;
    std::string key_;
    cudaEvent_t start_{}, stop_{};
    std::chrono::steady_clock::time_point t0_;
  };

  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  std::vector<cuda::OpTime> take() {
    SPARROW_CUDA_CHECK(cudaDeviceSynchronize());
    std::map<std::string, cuda::OpTime> sums;
    for (Pending& q : pending_) {
      float ms = 0;
      SPARROW_CUDA_CHECK(cudaEventElapsedTime(&ms, q.start, q.stop));
      cuda::OpTime& t = sums[q.key];
      t.op = q.key;
      t.part = q.key.find('/') != std::string::npos;
      t.calls += 1;
      t.gpu_ms += ms;
      t.host_ms += q.host_ms;
      cudaEventDestroy(q.start);
      cudaEventDestroy(q.stop);
    }
    pending_.clear();
    std::vector<cuda::OpTime> out;
    for (auto& [k, t] : sums) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const cuda::OpTime& a, const cuda::OpTime& b) { return a.gpu_ms > b.gpu_ms; });
    return out;
  }

  ~OpProfiler() {
    for (Pending& q : pending_) {
      cudaEventDestroy(q.start);
      cudaEventDestroy(q.stop);
    }
  }


 private:
  bool enabled_ = false;
  std::vector<Pending> pending_;
};

// Work on a second stream beside this thread's default one (CudaBackend::moe: the shared expert
// beside the routed experts). fork() records an event on the default stream that the side stream
// waits for (the side work starts after everything enqueued before it) and holds every device_free
// from then on; inside a LaunchStreamScope on stream() the backend's work goes to the side stream.
// join() records an event on the side stream that the default stream waits for, then frees what
// was held, in the default stream's order after the join: no later work reuses memory the side work
// may still read. Captured into a step's graph, the events become a fork and a join of its nodes.
// The same kernels on the same inputs: the same bits.
class SideStream {
 public:
  SideStream() = default;
  ~SideStream() {
    if (mark_) cudaEventDestroy(mark_);
    if (join_) cudaEventDestroy(join_);
    if (fork_) cudaEventDestroy(fork_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t stream() const { return stream_; }
  bool forked() const { return forked_; }
  void fork() {
    SPARROW_CHECK(!forked_ && t_held_frees == nullptr);
    if (!stream_) {
      SPARROW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      SPARROW_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
      SPARROW_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
      SPARROW_CUDA_CHECK(cudaEventCreateWithFlags(&mark_, cudaEventDisableTiming));
    }
    SPARROW_CUDA_CHECK(cudaEventRecord(fork_, cudaStreamPerThread));
    SPARROW_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
    t_held_frees = &held_;
    forked_ = true;
  }
  // (Forked) An event after the side work enqueued so far, which wait_mark makes the default
  // stream wait for: a buffer made there and read here before the join.
  void mark() {
    SPARROW_CHECK(forked_);
    SPARROW_CUDA_CHECK(cudaEventRecord(mark_, stream_));
  }
  void wait_mark() {
    SPARROW_CHECK(forked_);
    SPARROW_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamPerThread, mark_, 0));
  }
  void join() {
    SPARROW_CHECK(forked_);
    SPARROW_CUDA_CHECK(cudaEventRecord(join_, stream_));
    SPARROW_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamPerThread, join_, 0));
    t_held_frees = nullptr;
    forked_ = false;
    std::vector<void*> held;
    held.swap(held_);
    for (void* p : held) device_free(p);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr, mark_ = nullptr;
  std::vector<void*> held_;
  bool forked_ = false;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() { set_fp8_gemm_in_linear(cuda_feature_on("fp8_gemm")); }
  const char* name() const override { return "cuda"; }

  // A tensor's memory is not initialised (Backend::alloc): every op writes all of its outputs.
  // SPARROW_CUDA_POISON_ALLOC=1 fills it with 0xff bytes instead (NaN floats, -1 integers), so that
  // a read of anything no op wrote shows in the results (the GPU checks run with it);
  // SPARROW_CUDA_DISABLE=alloc_nofill zero-fills it.
  Tensor alloc(ElemType type, std::vector<int64_t> shape) override {
    OpProfiler::Scope op_scope(profiler_, "alloc");
    static const bool nofill = cuda_feature_on("alloc_nofill");
    const bool poison = poison_alloc();
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
    void* p = device_alloc(bytes, !nofill && !poison);
    if (poison) fill_device(p, 0xff, bytes);
    std::shared_ptr<void> storage(p, [](void* q) { device_free(q); });
    return Tensor(storage, p, type, std::move(shape));
  }

  Tensor upload_f32(const std::vector<float>& values, std::vector<int64_t> shape) override {
    OpProfiler::Scope op_scope(profiler_, "upload");
    Tensor t = alloc(ElemType::kF32, std::move(shape));
    SPARROW_CHECK_EQ(t.numel(), static_cast<int64_t>(values.size()));
    host_to_device(t.f32(), values.data(), values.size() * sizeof(float));
    return t;
  }

  Tensor upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> shape) override {
    OpProfiler::Scope op_scope(profiler_, "upload");
    Tensor t = alloc(ElemType::kI32, std::move(shape));
    SPARROW_CHECK_EQ(t.numel(), static_cast<int64_t>(values.size()));
    host_to_device(t.i32(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }

  std::vector<float> download_f32(const Tensor& t) override {
    OpProfiler::Scope op_scope(profiler_, "download");
    SPARROW_CHECK(t.type() == ElemType::kF32);
    std::vector<float> v(t.numel());
    if (!v.empty()) SPARROW_CUDA_CHECK(cudaMemcpy(v.data(), t.f32(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }

  std::vector<int32_t> download_i32(const Tensor& t) override {
    OpProfiler::Scope op_scope(profiler_, "download");
    SPARROW_CHECK(t.type() == ElemType::kI32);
    std::vector<int32_t> v(t.numel());
    if (!v.empty()) SPARROW_CUDA_CHECK(cudaMemcpy(v.data(), t.i32(), v.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return v;
  }

  std::unique_ptr<SequenceState> create_sequence_state(const ModelConfig& config) override {
    return std::make_unique<CudaSequenceState>(config, kv_records_);
  }

  // The CPU layout, except that compressed entries grow by doubling from 16 (CompressorBuffer::
  // reserve): room for up to max(16, 2C) of C entries. The copy made while one buffer grows is
  // transient and one sequence at a time; cudaMalloc's rounding of each buffer is not counted.
  int64_t sequence_state_bytes(const ModelConfig& config, int64_t context) const override {
    int64_t bytes = sequence_state_bytes_reference(config, context);
    for (int64_t l = 0; l < config.num_layers; ++l) {
      if (config.attention[l] == AttentionKind::kSliding) continue;
      const int64_t c = context / config.compress_ratio[l];
      const int64_t spare = c == 0 ? 0 : std::max<int64_t>(16, 2 * c) - c;
      bytes += spare * config.head_dim * 4;
      if (config.attention[l] == AttentionKind::kCsa) bytes += spare * config.index_head_dim * 4;
    }
    return bytes;
  }

  void embed(const EmbedParams& p, const BatchInfo& batch) override {
    OpProfiler::Scope op_scope(profiler_, "embed");
    // out is (T, S, D)
    const int64_t T = p.out.dim(0), S = p.out.dim(1), D = p.out.dim(2);
    SPARROW_CHECK_EQ(batch.num_tokens(), T);
    SPARROW_CHECK_EQ(p.table->in, D);
    launch_embed({.out = p.out.f32(), .ids = device_batch(batch).ids, .table = dev_weight(*p.table), .T = T, .S = S, .D = D});
    launch_check("embed");
  }

  // hc_pre's kernel arguments (shapes checked), the mix values into `mix` (HcPreArgs::mix).
  HcPreArgs hc_pre_args(const HcPreParams& p, float* mix) {
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    SPARROW_CHECK_LE(S, kMaxStreams);
    SPARROW_CHECK_EQ(p.weights->fn.numel(), (2 + S) * S * S * D);
    return {.out_input = p.out_input.f32(), .out_post = p.out_post.f32(), .out_comb = p.out_comb.f32(),
            .streams = p.streams.f32(), .fn = dev_view(p.weights->fn), .base = dev_view(p.weights->base),
            .scale = dev_view(p.weights->scale), .T = T, .S = S, .D = D, .sinkhorn_iters = p.sinkhorn_iters,
            .hc_eps = static_cast<float>(p.hc_eps), .norm_eps = static_cast<float>(p.norm_eps), .mix = mix,
            .round_bf16 = p.round_bf16};
  }

  void hc_pre(const HcPreParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "hc_pre");
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1);
    const DeviceBuffer mix = hc_mix_scratch(T * (2 + S) * S);
    const HcPreArgs args = hc_pre_args(p, mix.f32());
    {
      OpProfiler::Scope part(profiler_, "hc_pre/mix");
      launch_hc_pre_mix(args);
    }
    launch_hc_pre(args);
    launch_check("hc_pre");
  }

  void hc_post(const HcPostParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "hc_post");
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    SPARROW_CHECK_LE(S, kMaxStreams);
    SPARROW_CHECK_EQ(p.sublayer.numel(), T * D);
    launch_hc_post({.streams = p.streams.f32(), .sublayer = p.sublayer.f32(), .post = p.post.f32(), .comb = p.comb.f32(),
                    .T = T, .S = S, .D = D, .round_bf16 = p.round_bf16});
    launch_check("hc_post");
  }

  // One kernel at decode sizes when hc_fused_ is set (launch_hc_boundary; the three ops' bits,
  // CudaOps.HcBoundaryIsItsThreeOpsBitForBit), else the three.
  void hc_boundary(const HcBoundaryParams& p) override {
    last_hc_boundary_fused_ = false;
    const int64_t T = p.pre.streams.dim(0), S = p.pre.streams.dim(1), D = p.pre.streams.dim(2);
    const HcWeights& hw = *p.pre.weights;
    const bool has_post = !p.post.sublayer.empty();
    const bool one_rounding =
        p.pre.round_bf16 == p.norm_round_bf16 && (!has_post || p.post.round_bf16 == p.pre.round_bf16);
    if (!hc_fused_ || !one_rounding ||
        !hc_boundary_fits(T, S, D, dev_view(hw.fn), dev_view(hw.base), dev_view(hw.scale), dev_view(p.norm_weight)))
      return Backend::hc_boundary(p);
    last_hc_boundary_fused_ = true;
    OpProfiler::Scope op_scope(profiler_, "hc_boundary");
    SPARROW_CHECK_EQ(p.pre.out_input.numel(), T * D);
    if (p.norm_weight.data) SPARROW_CHECK_EQ(p.norm_weight.numel(), D);
    if (has_post) {
      SPARROW_CHECK(p.post.streams.f32() == p.pre.streams.f32());
      SPARROW_CHECK_EQ(p.post.sublayer.numel(), T * D);
      SPARROW_CHECK_EQ(p.post.post.numel(), T * S);
      SPARROW_CHECK_EQ(p.post.comb.numel(), T * S * S);
    }
    hc_arrivals_.ensure(kHcBoundaryMaxTokens * sizeof(unsigned));  // zeroed once; each call leaves them zero
    const DeviceBuffer mix = DeviceBuffer::scratch(static_cast<size_t>(T * (2 + S) * S) * sizeof(float));
    launch_hc_boundary({.pre = hc_pre_args(p.pre, mix.f32()), .sublayer = has_post ? p.post.sublayer.f32() : nullptr,
                        .post = has_post ? p.post.post.f32() : nullptr, .comb = has_post ? p.post.comb.f32() : nullptr,
                        .norm_weight = dev_view(p.norm_weight), .norm_eps = static_cast<float>(p.norm_eps),
                        .round_bf16 = p.pre.round_bf16, .arrivals = static_cast<unsigned*>(hc_arrivals_.get())});
    launch_check("hc_boundary");
  }

  void hc_head(const HcHeadParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "hc_head");
    const int64_t T = p.streams.dim(0), S = p.streams.dim(1), D = p.streams.dim(2);
    SPARROW_CHECK_LE(S, kMaxStreams);
    SPARROW_CHECK_EQ(p.weights->fn.numel(), S * S * D);
    const DeviceBuffer mix = hc_mix_scratch(T * S);
    launch_hc_head({.out = p.out.f32(), .streams = p.streams.f32(), .fn = dev_view(p.weights->fn),
                    .base = dev_view(p.weights->base), .scale = dev_view(p.weights->scale), .T = T, .S = S, .D = D,
                    .hc_eps = static_cast<float>(p.hc_eps), .norm_eps = static_cast<float>(p.norm_eps),
                    .mix = mix.f32(), .round_bf16 = p.round_bf16});
    launch_check("hc_head");
  }

  void rms_norm(const RmsNormParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "rms_norm");
    const int64_t n = p.in.numel();
    SPARROW_CHECK(p.group > 0 && n % p.group == 0);
    SPARROW_CHECK_EQ(p.out.numel(), n);
    if (p.weight.data) SPARROW_CHECK_EQ(p.weight.numel(), p.group);
    launch_rms_norm({.out = p.out.f32(), .in = p.in.f32(), .weight = dev_view(p.weight), .rows = n / p.group,
                     .group = p.group, .eps = static_cast<float>(p.eps), .round_bf16 = p.round_bf16});
    launch_check("rms_norm");
  }

  void linear(const LinearParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "linear", p.weight);
    const WeightMatrix& w = *p.weight;
    const int64_t T = p.in.dim(0);
    SPARROW_CHECK_EQ(p.in.numel(), T * w.in);
    SPARROW_CHECK_EQ(p.out.numel(), T * w.out);
    // The tensor-core GEMMs round their outputs themselves (in the split kernels' sum of parts).
    if (p.act_quant_fp8 && fp8_gemm_rows(p.out.f32(), p.in.f32(), T, w, p.round_bf16)) {
      // The tensor-core GEMM (SPARROW_CUDA_DISABLE=fp8_gemm: the CUDA-core kernel below).
      last_linear_ = fp8_.last_path() == Fp8GemmPath::kTensorCores ? LinearPath::kTensorCores : LinearPath::kElementWise;
      return;
    }
    if (p.input_bf16 && bf16_gemm(p.out.f32(), p.in.f32(), T, 1, w, p.round_bf16)) {
      last_linear_ = LinearPath::kTensorCores;
      return;
    }
    const float* in = p.in.f32();
    DeviceBuffer quantised;
    if (p.act_quant_fp8 && T * w.in > 0) {
      // The CPU's act_quant_fp8: a copy of the input, each token's row in blocks of 128.
      quantised = DeviceBuffer(static_cast<size_t>(T * w.in) * sizeof(float));
      SPARROW_CUDA_CHECK(cudaMemcpyAsync(quantised.get(), in, quantised.bytes(), cudaMemcpyDeviceToDevice, launch_stream()));
      fp8_rows(quantised.f32(), T, w.in, w.in, kFp8ActBlock, "linear act_quant_fp8");
      in = quantised.f32();
    }
    last_linear_ = launch_linear({.out = p.out.f32(), .in = in, .in_rows = nullptr, .w = dev_weight(w), .T = T,
                                  .in_stride = w.in, .rows_per_group = std::max<int64_t>(w.out, 1),
                                  .vectorized = p.act_quant_fp8})
                       ? LinearPath::kVectorized
                       : LinearPath::kElementWise;
    launch_check("linear");
    round_bf16_if(p.round_bf16, p.out, "linear bf16");
  }

  // Linears of one input as one GEMM over their weights stacked row-wise (`fp8_stack`), its columns
  // handed out to the outputs and rounded in one pass: the fast profiles' FP8 linears (wq_a and
  // wkv: Fp8Linear::run_stacked) and bf16 GEMMs of bf16-valued inputs (a compressor's wkv and
  // wgate: Bf16GroupedLinear::run_stacked). Else, or where the stack cannot run, linear() of each.
  void linears(std::span<const LinearParams> ps) override {
    static const bool bf16_on = cuda_feature_on("bf16_gemm");
    if (ps.empty()) return;
    const LinearParams& p0 = ps[0];
    // FP8 linears are stacked where their outputs are together no wider than the input (wq_a with
    // wkv): split_cols' copy of the product then costs less than the input's read. A rule of the
    // shapes alone, never of the rows, since a stack's bits may differ from the separate linears'
    // (cuBLASLt) and a sequence must get the same bits in chunks as one-shot. A CSA layer's wq_b and
    // indexer wq_b (40960 outputs of 1024 inputs: an 8K prefill's split would copy 1.3 GB) run as
    // separate linears sharing one quantisation of their input below.
    int64_t n_all = 0;
    for (const LinearParams& p : ps) n_all += p.weight->out;
    const auto reads_p0_input = [&](const LinearParams& p) { return p.in.f32() == p0.in.f32() && p.in.numel() == p0.in.numel(); };
    const bool stack = fp8_stack_ && ps.size() >= 2 && ps.size() <= kSplitColsParts;
    bool fp8 = stack && fp8_gemm_in_linear_ && n_all <= p0.weight->in, bf16 = stack && bf16_on;
    std::vector<const WeightMatrix*> ws;
    for (const LinearParams& p : ps) {
      const bool same = reads_p0_input(p) && p.round_bf16 == p0.round_bf16;
      fp8 = fp8 && same && p.act_quant_fp8 && p.weight->format == WeightFormat::kFp8Block;
      bf16 = bf16 && same && !p.act_quant_fp8 && p.input_bf16;
      ws.push_back(p.weight);
    }
    if (fp8 || bf16) {
      OpProfiler::Scope op_scope(profiler_, "linears (stacked)", p0.weight);
      const int64_t T = p0.in.dim(0), N = n_all;
      for (const LinearParams& p : ps) SPARROW_CHECK_EQ(p.out.numel(), T * p.weight->out);
      const float* d = nullptr;
      DeviceBuffer scratch;
      // The stacked product's view: split_cols adds a split GEMM's parts itself (parts_in_readers);
      // d itself where none were left.
      PartsView view;
      PartsView* const leave = parts_in_readers_ ? &view : nullptr;
      if (fp8) {
        d = fp8_.run_stacked(p0.in, ws, leave);
      } else {
        // (Unfilled: the GEMM writes every element, or leaves its parts for split_cols, and a fill is
        // a graph node of its own that cuts the step's chain of programmatic dependent launches:
        // DeviceBuffer::scratch.)
        scratch = DeviceBuffer::scratch(static_cast<size_t>(T * N) * sizeof(float));
        if (bf16_.run_stacked(scratch.f32(), p0.in.f32(), T, ws, [&](const WeightMatrix& w) { return dev_weight(w); },
                              leave))
          d = scratch.f32();
      }
      if (d) {
        if (view.data == nullptr) view = d;
        count_left(view);
        SplitColsArgs a{.src = view, .rows = T, .parts = static_cast<int>(ps.size()), .dst = {}, .cols = {},
                        .round_bf16 = p0.round_bf16};
        for (size_t i = 0; i < ps.size(); ++i) {
          a.dst[i] = ps[i].out.f32();
          a.cols[i] = ps[i].weight->out;
        }
        launch_split_cols(a);
        launch_check("linears (stacked) split");
        last_linear_ = LinearPath::kTensorCores;
        return;
      }
    }
    // One act_quant for FP8 linears of one input (`act_quant_shared`): the same codes and scales
    // each would make, so the same bits.
    static const bool share = cuda_feature_on("act_quant_shared");
    bool one_input = share && ps.size() >= 2;
    for (const LinearParams& p : ps)
      one_input = one_input && reads_p0_input(p) && p.act_quant_fp8 && p.weight->in == p0.weight->in &&
                  p.out.f32() != p0.in.f32();  // (no output over the input)
    // (Off again however the runs end.)
    struct Keep {
      Fp8Linear& f;
      ~Keep() { f.keep_quantised(false); }
    } keep{fp8_};
    fp8_.keep_quantised(one_input);
    for (const LinearParams& p : ps) linear(p);
  }

  void grouped_linear(const GroupedLinearParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "grouped_linear", p.weight);
    const WeightMatrix& w = *p.weight;
    const int64_t T = p.in.dim(0), G = p.groups;
    SPARROW_CHECK(G > 0 && w.out % G == 0);
    SPARROW_CHECK_EQ(p.in.numel(), T * G * w.in);
    SPARROW_CHECK_EQ(p.out.numel(), T * w.out);
    // The reduced-precision profiles (round_bf16: the input holds bf16 values) run it as the reference
    // does, a bf16 GEMM with fp32 sums, on the tensor cores (bf16_linear.h; SPARROW_CUDA_DISABLE=bf16_gemm
    // or a weight it cannot take: the vectorized kernel where the weight allows it, as `linear` does
    // under act_quant_fp8); fp32 keeps the element-wise one.
    if (p.round_bf16 && bf16_gemm(p.out.f32(), p.in.f32(), T, G, w, true)) {
      last_linear_ = LinearPath::kTensorCores;
      return;
    }
    last_linear_ = launch_linear({.out = p.out.f32(), .in = p.in.f32(), .in_rows = nullptr, .w = dev_weight(w), .T = T,
                                  .in_stride = G * w.in, .rows_per_group = w.out / G, .vectorized = p.round_bf16})
                       ? LinearPath::kVectorized
                       : LinearPath::kElementWise;
    launch_check("grouped_linear");
    round_bf16_if(p.round_bf16, p.out, "grouped_linear bf16");
  }

  void quant_sim(const QuantSimParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "quant_sim");
    SPARROW_CHECK(p.row > 0);
    const int64_t rows = p.x.numel() / p.row;
    SPARROW_CHECK_EQ(rows * p.row, p.x.numel());
    SPARROW_CHECK(p.dims >= 0 && p.dims <= p.row);
    RowSimArgs sim = row_sim_of(p.kind, p.dims);
    sim.x = p.x.f32();
    sim.n = rows;
    sim.row_stride = p.row;
    sim.dims = p.dims;
    launch_row_sim(sim);
    launch_check("quant_sim");
  }

  // Every flag of the fast and deepseek-ref profiles is simulated on the device (docs/cuda.md).
  bool supports_reference_numerics() const override { return true; }
  // AttentionArgs::weights_bf16: the tensor-core attention's one-term weights, or attention_kernel's
  // rounding where a call cannot take the tensor cores (fp32 operands, heads or Dh they do not take,
  // attn_mma or attn_split off).
  bool supports_attention_weights_bf16(bool, int64_t, int64_t) const override { return true; }

  // On the device: the default goes through the host, which a captured step cannot.
  Tensor gather_rows(const Tensor& in, const std::vector<int64_t>& rows) override {
    OpProfiler::Scope op_scope(profiler_, "gather_rows");
    SPARROW_CHECK(in.type() == ElemType::kF32 && in.rank() >= 1);
    const int64_t T = in.dim(0), width = T == 0 ? 0 : in.numel() / T, n = static_cast<int64_t>(rows.size());
    for (int64_t r : rows) SPARROW_CHECK(r >= 0 && r < T);
    Tensor out = alloc(ElemType::kF32, {n, width});
    const DeviceBuffer d_rows = upload_vector(rows);
    launch_gather_rows(out.f32(), in.f32(), static_cast<const int64_t*>(d_rows.get()), n, width);
    launch_check("gather_rows");
    return out;
  }

  // One block a row on the device; `argmax` off: the default through the host (a row's logits
  // downloaded), the same ids.
  Tensor argmax_rows(const Tensor& in) override {
    static const bool on = cuda_feature_on("argmax");
    if (!on) return Backend::argmax_rows(in);
    OpProfiler::Scope op_scope(profiler_, "argmax_rows");
    SPARROW_CHECK(in.type() == ElemType::kF32 && in.rank() >= 1);
    const int64_t T = in.dim(0), width = T == 0 ? 0 : in.numel() / T;
    SPARROW_CHECK(T == 0 || (width > 0 && width <= INT32_MAX));
    Tensor out = alloc(ElemType::kI32, {T});
    launch_argmax_rows(out.i32(), in.f32(), T, width);
    launch_check("argmax_rows");
    return out;
  }

  // A step is captured into a CUDA graph (step_graph.h) when graphs are on (SPARROW_CUDA_DISABLE=graphs
  // or set_step_graphs turn them off), the caller reads nothing back within it, no per-op profiling
  // or SPARROW_CUDA_SYNC asks for ops one at a time, the MoE plans on the device and groups its
  // experts (a host plan downloads the choices: SPARROW_CUDA_DISABLE=moe_device_plan or
  // grouped_moe, whose one-expert-at-a-time path plans on the host), allocations and uploads are
  // stream-ordered (`pool`, `async_upload`; step_capture_allowed), it has at most kMaxGraphTokens
  // tokens, and a step of that many tokens has run op by op before (so the weights and the kept
  // scratch are on the device already).
  void begin_step(int64_t tokens, bool capturable) override {
    if (step_depth_++ > 0) return;
    ++step_serial_;
    batch_.in_step = false;
    // A token count seen before: its weights and kept scratch are on the device (only counts that
    // can be captured are remembered).
    bool warm = false;
    if (tokens > 0 && tokens <= kMaxGraphTokens) {
      warm = warm_steps_[tokens];
      warm_steps_[tokens] = true;
    }
    if (step_graphs_on_ && capturable && step_capture_allowed() && warm && !profiler_.enabled() && step_graphs_.begin()) return;
    if (!step_graphs_.capturing()) step_graphs_.count_eager();
  }
  void step_segment() override {
    if (step_depth_ == 1 && step_graphs_.capturing()) step_graphs_.segment();
  }
  void end_step() override {
    SPARROW_CHECK(step_depth_ > 0);
    if (--step_depth_ > 0) return;
    if (step_graphs_.capturing()) step_graphs_.end();
  }

  void linear_fp8_block(const LinearFp8BlockParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "linear_fp8_block");
    fp8_.run(p, [&] { return dev_weight(*p.weight); });
  }

  Fp8Linear& fp8() { return fp8_; }

  void rope(const RopeParams& p, const BatchInfo& batch) override {
    OpProfiler::Scope op_scope(profiler_, "rope");
    const int64_t T = p.x.dim(0);
    SPARROW_CHECK_EQ(batch.num_tokens(), T);
    SPARROW_CHECK_LE(p.table->rope_dim(), p.x.dim(2));
    launch_rope({.x = p.x.f32(), .positions = device_batch(batch).positions, .T = T, .n = p.x.dim(1),
                 .width = p.x.dim(2), .table = rope_arg(*p.table), .inverse = p.direction == RopeDirection::kInverse,
                 .round_bf16 = p.round_bf16});
    launch_check("rope");
  }

  // Plans each sequence's walk on the host (where its rows go, how many entries it emits), makes
  // room for the entries, advances the host counters, and lets one block per sequence replay it.
  void compressor(const CompressorParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "compressor");
    const BatchInfo& batch = *p.batch;
    const int64_t width = p.overlap ? 2 * p.dim : p.dim, m = p.ratio;
    SPARROW_CHECK_EQ(p.kv.numel(), batch.num_tokens() * width);
    SPARROW_CHECK_EQ(p.gate.numel(), batch.num_tokens() * width);
    SPARROW_CHECK_EQ(p.ape.numel(), m * width);
    SPARROW_CHECK_EQ(p.norm_weight.numel(), p.dim);
    std::vector<CompressorSeqArgs> seqs;
    std::vector<float*> emitted_rows;  // where this batch's entries go, for the entry_sim and key precision passes
    std::vector<int64_t> jobs;         // {sequence index, e} of every entry the batch emits
    const bool post_pass = p.key_precision != KeyPrecision::kF32 || !p.entry_sim.empty();
    const bool mirror_keys = compressor_keeps_bf16_copies(p.slot, p.key_precision, p.round_bf16);
    std::vector<const float*> mirror_src;  // the emitted rows whose sequences keep bf16 copies
    std::vector<uint16_t*> mirror_rows;    // and where their copies go
    // The entries as FP8 KV records (CompressorBuffer::entries_rec): this call's are record values
    // (the fast profiles' compressed KV: bf16, then FP8 in blocks of 64 on the nope dims), so
    // encoding the compressor's output is the rounding entry_sim makes, stored as bytes.
    const bool record_values = p.slot == CompressorSlot::kMain && p.round_bf16 && p.key_precision == KeyPrecision::kF32 &&
                               p.entry_sim.size() == 1 && p.entry_sim[0] == QuantSimKind::kFp8Pow2Block64;
    std::vector<int64_t> record_rows;       // per sequence in records: its first row in `fresh`
    std::vector<uint8_t*> record_dst;       // the records of `fresh`'s rows
    int64_t fresh_rows = 0;
    KvRecordLayout fresh_layout{};
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      LayerState& state = cuda_state(batch.seqs[s]).layer(p.layer);
      CompressorBuffer& buf = p.slot == CompressorSlot::kMain ? state.main : state.indexer;
      SPARROW_CHECK(buf.ratio == m && buf.dim == p.dim && buf.overlap == p.overlap);
      const int64_t begin = batch.seq_begin[s], end = batch.seq_end[s], n = end - begin;
      if (n == 0) continue;
      for (int64_t t = begin; t < end; ++t) SPARROW_CHECK_EQ(batch.positions[t], buf.count * m + buf.pending + (t - begin));
      const int64_t emitted = (buf.pending + n) / m;
      // A fresh buffer of a layer whose KV can be records, given record values: records from now on.
      if (record_values && buf.count == 0 && buf.capacity == 0 && state.rec.bytes > 0 && !buf.records() &&
          state.rec.dim == p.dim && state.rec.rope_dim == p.rope->rope_dim())
        buf.rec = state.rec;
      if (buf.records() && !record_values)
        throw std::runtime_error("compressor: layer " + std::to_string(p.layer) +
                                 "'s compressed KV is stored as FP8 KV records, but this call's entries are not "
                                 "record values (CompressorParams round_bf16 with entry_sim {fp8 pow2 block 64})");
      // A sequence's bf16 copy starts with its first entry and continues while every batch has
      // made one (CompressorBuffer::entries_bf16); records have none.
      const bool mirror = !buf.records() && mirror_keys && (buf.count == 0 || buf.mirror_complete());
      if (mirror && !buf.entries_bf16.get()) {
        const LongLived state;
        buf.entries_bf16 = DeviceBuffer(std::max<int64_t>(buf.capacity, 1) * p.dim * sizeof(uint16_t));
      }
      buf.reserve(buf.count + emitted);
      record_rows.push_back(buf.records() ? fresh_rows : -1);
      if (buf.records()) {
        for (int64_t j = 0; j < emitted; ++j)
          record_dst.push_back(static_cast<uint8_t*>(buf.entries_rec.get()) + (buf.count + j) * buf.rec.bytes);
        fresh_layout = buf.rec;
        fresh_rows += emitted;
      } else if (post_pass) {
        for (int64_t j = 0; j < emitted; ++j) emitted_rows.push_back(buf.entries.f32() + (buf.count + j) * p.dim);
      }
      if (mirror) {
        for (int64_t j = 0; j < emitted; ++j) {
          mirror_src.push_back(buf.entries.f32() + (buf.count + j) * p.dim);
          mirror_rows.push_back(static_cast<uint16_t*>(buf.entries_bf16.get()) + (buf.count + j) * p.dim);
        }
        buf.mirrored = buf.count + emitted;
      }
      for (int64_t j = 0; j < emitted; ++j) {
        jobs.push_back(static_cast<int64_t>(seqs.size()));
        jobs.push_back(j);
      }
      seqs.push_back({.pending_kv = buf.pending_kv.f32(), .pending_gate = buf.pending_gate.f32(),
                      .prev_kv = buf.prev_kv.f32(), .prev_gate = buf.prev_gate.f32(),
                      .entries = buf.records() ? nullptr : buf.entries.f32(), .entries_first = buf.records() ? buf.count : 0,
                      .t_begin = begin, .t_end = end, .pending = buf.pending, .count = buf.count,
                      .has_prev = buf.has_prev ? 1 : 0});
      buf.count += emitted;
      buf.pending = (buf.pending + n) % m;
      if (emitted > 0 && p.overlap) buf.has_prev = true;
    }
    if (seqs.empty()) return;
    // The records' sequences write their new entries into `fresh` (in fp32), encoded below.
    const DeviceBuffer fresh =
        fresh_rows > 0 ? DeviceBuffer::scratch(static_cast<size_t>(fresh_rows * p.dim) * sizeof(float)) : DeviceBuffer();
    for (size_t i = 0; i < seqs.size(); ++i)
      if (record_rows[i] >= 0) seqs[i].entries = fresh.f32() + record_rows[i] * p.dim;
    // The call's plan, jobs and row lists in one upload (one node of a captured step, not up to five).
    static const bool parallel = cuda_feature_on("compressor_parallel");
    if (!parallel) jobs.clear();
    UploadPack up;
    const size_t plan = up.add(seqs), d_jobs = up.add(jobs), rows = up.add(emitted_rows), dst = up.add(record_dst),
                 src = up.add(mirror_src), mirror_dst = up.add(mirror_rows);
    up.upload();
    launch_compressor({.seqs = up.at<CompressorSeqArgs>(plan), .nseq = static_cast<int64_t>(seqs.size()),
                       .kv = p.kv.f32(), .gate = p.gate.f32(), .positions = device_batch(batch).positions,
                       .ape = dev_view(p.ape), .norm_weight = dev_view(p.norm_weight), .rope = rope_arg(*p.rope),
                       .ratio = m, .dim = p.dim, .overlap = p.overlap, .norm_eps = static_cast<float>(p.norm_eps),
                       .round_bf16 = p.round_bf16,
                       .parallel = parallel, .jobs = up.at<int64_t>(d_jobs),
                       .n_jobs = parallel ? static_cast<int64_t>(jobs.size() / 2) : 0});
    launch_check("compressor");
    // entry_sim (the stored record), then `--index-keys`: each new entry rounded as stored, after its
    // rotation, in emit_entry's order. The kernel never reads an entry back once it is emitted.
    if (!emitted_rows.empty()) {
      for (QuantSimKind kind : p.entry_sim) {
        const int64_t dims = kind == QuantSimKind::kFp8Pow2Block64 ? p.dim - p.rope->rope_dim() : p.dim;
        SPARROW_CHECK(dims >= 0 && dims <= p.dim);
        RowSimArgs sim = row_sim_of(kind, dims);
        sim.rows = up.at<float*>(rows);
        sim.n = static_cast<int64_t>(emitted_rows.size());
        sim.dims = dims;
        launch_row_sim(sim);
        launch_check("compressor entry_sim");
      }
      launch_key_sim({.rows = up.at<float*>(rows), .n = static_cast<int64_t>(emitted_rows.size()),
                      .dim = p.dim, .precision = p.key_precision});
      launch_check("compressor key precision");
    }
    if (fresh_rows > 0) {
      launch_kv_record_encode({.in = fresh.f32(), .rec_rows = up.at<uint8_t*>(dst), .rows = fresh_rows,
                               .in_stride = p.dim, .layout = fresh_layout});
      launch_check("compressor records");
    }
    // The bf16 copies, after the roundings (a sequence whose copy broke off gets none).
    if (!mirror_rows.empty()) {
      launch_rows_to_bf16(up.at<const float*>(src), up.at<uint16_t*>(mirror_dst), static_cast<int64_t>(mirror_rows.size()),
                          p.dim);
      launch_check("compressor bf16 copies");
    }
  }

  void indexer_topk(const IndexerTopkParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "indexer_topk");
    const BatchInfo& batch = *p.batch;
    const int64_t T = batch.num_tokens(), Hi = p.q.dim(1), di = p.q.dim(2);
    SPARROW_CHECK_EQ(p.out_indices.numel(), T * p.k);
    std::vector<const float*> keys(T);
    std::vector<const uint16_t*> keys_bf16(T);
    // The tensor-core scorer: q and the keys bf16 values, and every token's keys copied as bf16.
    static const bool mma_on = cuda_feature_on("indexer_mma");
    bool mma = mma_on && p.bf16_operands && !p.bf16_scores && indexer_mma_fits(Hi, di);
    std::vector<int64_t> visible(T);
    int64_t C = p.out_scores.empty() ? 0 : p.out_scores.dim(1);
    const int64_t out_C = C;
    for (int64_t t = 0; t < T; ++t) {
      const CompressorBuffer& buf = cuda_state(batch.seqs[batch.seq_of_token[t]]).layer(p.layer).indexer;
      SPARROW_CHECK_EQ(buf.dim, di);
      visible[t] = (batch.positions[t] + 1) / p.ratio;
      SPARROW_CHECK_LE(visible[t], buf.count);
      keys[t] = buf.entries.f32();
      keys_bf16[t] = static_cast<const uint16_t*>(buf.entries_bf16.get());
      mma = mma && buf.mirror_complete();
      C = std::max(C, visible[t]);
    }
    if (T == 0 || C == 0) {  // (no entry visible: every slot -1; else the launch writes them all)
      if (T * p.k > 0) fill_device(p.out_indices.i32(), 0xff, T * p.k * sizeof(int32_t));
      return;
    }
    // The per-token arguments in one upload: key pointers, bf16 key pointers, visible counts.
    std::vector<uint64_t> plan(3 * T);
    for (int64_t t = 0; t < T; ++t) {
      plan[t] = reinterpret_cast<uintptr_t>(keys[t]);
      plan[T + t] = reinterpret_cast<uintptr_t>(keys_bf16[t]);
      plan[2 * T + t] = static_cast<uint64_t>(visible[t]);
    }
    const DeviceBuffer d_plan = upload_vector(plan);
    const auto* d_words = static_cast<const uint64_t*>(d_plan.get());
    last_indexer_mma_ = mma;
    const DeviceBuffer scores(T * C * sizeof(float), false);  // (the scorers write every [T, C] score)
    launch_indexer_topk({.out_indices = p.out_indices.i32(), .scores = scores.f32(), .q = p.q.f32(),
                         .head_weights = p.head_weights.f32(), .keys = reinterpret_cast<const float* const*>(d_words),
                         .visible = reinterpret_cast<const int64_t*>(d_words + 2 * T), .T = T, .Hi = Hi, .di = di, .k = p.k,
                         .C = C, .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)) /
                                                             std::sqrt(static_cast<double>(Hi))),
                         .bf16_scores = p.bf16_scores,
                         .scale_f64 = 1.0 / std::sqrt(static_cast<double>(di)) / std::sqrt(static_cast<double>(Hi)),
                         .keys_bf16 = mma ? reinterpret_cast<const uint16_t* const*>(d_words + T) : nullptr,
                         .mma_tiles = indexer_mma_tiles_});
    launch_check("indexer_topk");
    if (out_C > 0)
      SPARROW_CUDA_CHECK(cudaMemcpy2DAsync(p.out_scores.f32(), out_C * sizeof(float), scores.get(), C * sizeof(float),
                                           out_C * sizeof(float), T, cudaMemcpyDeviceToDevice, launch_stream()));
  }

  void attention(const AttentionParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "attention");
    const BatchInfo& batch = *p.batch;
    const int64_t T = batch.num_tokens(), H = p.q.dim(1), Dh = p.q.dim(2);
    const bool csa = p.kind == AttentionKind::kCsa;
    const int64_t k = csa ? p.selected.dim(1) : 0;
    SPARROW_CHECK_EQ(p.kv.numel(), T * Dh);
    SPARROW_CHECK_EQ(p.out.numel(), T * H * Dh);
    SPARROW_CHECK_EQ(p.sinks.numel(), H);
    std::vector<AttnTokenArgs> tokens(T);
    int64_t max_candidates = 1;
    // The bf16 copies of the KV state (the ring's, written with it; the entries', complete from the
    // sequence's first entry), read by the tensor-core attention instead of the fp32 state.
    bool copies = true;
    // The KV records (LayerState::ring_rec, CompressorBuffer::entries_rec): read when every token's
    // state keeps them; needed when one keeps nothing else.
    bool records = p.kv_record, records_only = false;
    KvRecordLayout rec{};
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = batch.seq_of_token[t];
      LayerState& state = cuda_state(batch.seqs[s]).layer(p.layer);
      const int64_t pos = batch.positions[t];
      AttnTokenArgs& tk = tokens[t];
      tk.ring = state.ring.f32();
      tk.entries = state.main.entries.f32();
      tk.batch_kv = p.kv.f32() + batch.seq_begin[s] * Dh;
      tk.ring_bf16 = static_cast<const uint16_t*>(state.ring_bf16.get());
      tk.entries_bf16 = static_cast<const uint16_t*>(state.main.entries_bf16.get());
      tk.ring_rec = static_cast<const uint8_t*>(state.ring_rec.get());
      tk.entries_rec = static_cast<const uint8_t*>(state.main.entries_rec.get());
      copies = copies && tk.ring_bf16 && (p.kind == AttentionKind::kSliding || state.main.mirror_complete());
      const bool sliding = p.kind == AttentionKind::kSliding;
      records = records && state.rec.bytes > 0 && state.ring_form != RingForm::kValues && (sliding || state.main.records());
      records_only = records_only || state.ring_form == RingForm::kRecords || (!sliding && state.main.records());
      rec = state.rec;
      tk.pos = pos;
      tk.first_pos = batch.positions[batch.seq_begin[s]];
      tk.n_window = std::clamp<int64_t>(p.window, 0, pos + 1);
      // Window keys older than the batch come from the ring, which holds the state's W.
      if (tk.n_window > pos - tk.first_pos + 1) SPARROW_CHECK_EQ(state.window, p.window);
      tk.n_entries = state.main.count;
      if (p.kind == AttentionKind::kHca) {
        tk.n_compressed = (pos + 1) / p.ratio;
        SPARROW_CHECK_LE(tk.n_compressed, state.main.count);
      } else {
        tk.n_compressed = k;
      }
      max_candidates = std::max(max_candidates, tk.n_window + tk.n_compressed);
    }
    if (T == 0) return;
    // The split kernel (flash-decoding; SPARROW_CUDA_DISABLE=attn_split: one block per (token, head)), unless
    // the candidates would need more than 8192 splits (its combine keeps one weight per split in
    // shared memory); its scratch is bounded by running the tokens in passes, which changes no
    // token's arithmetic.
    static const bool split_on = cuda_feature_on("attn_split");
    // The tensor-core splits (fast profiles: q and keys bf16 values), whatever the batch.
    const bool mma = p.bf16_operands && attention_tensor_cores_take(H, Dh) && attention_splits(max_candidates, true) <= 8192;
    last_attention_mma_ = mma;
    // q's norm and rotation (AttentionParams::q_rope) folded into the tensor-core kernel's staging of
    // q (AttentionArgs::q_prep; `attn_q_fold` off: the rms_norm and rope kernels first, the same bits).
    static const bool q_fold_on = cuda_feature_on("attn_q_fold");
    const bool q_fold = p.q_rope != nullptr && mma && q_fold_on && p.q_rope->rope_dim() <= Dh;
    if (p.q_rope != nullptr && !q_fold) attention_q_prep(p);
    last_attention_q_fold_ = q_fold;
    // Its keys from the records where every token's state keeps them, this batch's kv encoded once;
    // else from the bf16 copies when every token's are complete, this batch's kv converted once
    // (the same values as the kernel's own conversion: the same bits).
    records = records && mma;
    if (records_only && !records)
      throw std::runtime_error(
          "attention: layer " + std::to_string(p.layer) +
          " stores its KV as FP8 KV records only, but this call cannot read them (it needs AttentionParams::kv_record, "
          "bf16 operands and the tensor-core kernel for every token)");
    last_attention_records_ = records;
    const bool bf16_keys = !records && mma && copies && attention_bf16_kv_;
    last_attention_bf16_kv_ = bf16_keys;
    DeviceBuffer kv_rec;
    if (records) {
      kv_rec = DeviceBuffer::scratch(static_cast<size_t>(T * rec.bytes));  // (every record written)
      launch_kv_record_encode({.in = p.kv.f32(), .rec = static_cast<uint8_t*>(kv_rec.get()), .rows = T, .in_stride = Dh,
                               .rec_stride = rec.bytes, .layout = rec});
      launch_check("attention kv records");
      for (int64_t t = 0; t < T; ++t)
        tokens[t].batch_kv_rec = static_cast<const uint8_t*>(kv_rec.get()) + batch.seq_begin[batch.seq_of_token[t]] * rec.bytes;
    }
    DeviceBuffer kv_bf16;
    if (bf16_keys) {
      kv_bf16 = DeviceBuffer::scratch(static_cast<size_t>(T * Dh) * sizeof(uint16_t));  // (all converted)
      launch_f32_to_bf16(p.kv.f32(), static_cast<uint16_t*>(kv_bf16.get()), T * Dh);
      launch_check("attention kv bf16");
      for (int64_t t = 0; t < T; ++t)
        tokens[t].batch_kv_bf16 =
            static_cast<const uint16_t*>(kv_bf16.get()) + batch.seq_begin[batch.seq_of_token[t]] * Dh;
    }
    const DeviceBuffer d_tokens = upload_vector(tokens);
    // (Off the tensor cores, bf16 weights take attention_kernel: one running max a token, as the CPU's.)
    const bool split = split_on && attention_splits(max_candidates, mma) <= 8192 && (mma || !p.weights_bf16);
    // With one split a token the tensor-core kernel finishes every token itself: no scratch, one pass.
    const bool one_split = mma && attention_splits(max_candidates, true) == 1;
    const int64_t split_floats = H * attention_splits(max_candidates, mma) * (Dh + 2);  // per token
    // Either scratch (the splits' parts, or attention_kernel's logits and weights: H max_candidates
    // floats a token, 1.3 GB for an 8K V4 CSA prefill in one) stays within this, the tokens in passes.
    const int64_t scratch_cap = attention_scratch_cap_bytes();
    // (mma implies split: the tensor cores need `attn_split` on, attention_tensor_cores_take.)
    const bool parts = mma || split;
    const int64_t token_floats = parts ? split_floats : H * max_candidates;
    const int64_t per_pass =
        one_split ? T : std::clamp<int64_t>(scratch_cap / (token_floats * int64_t{sizeof(float)}), 1, T);
    last_attention_passes_ = one_split ? 1 : (T + per_pass - 1) / per_pass;
    // (Unfilled: a split's kernel writes its part before the combine reads it, and the combine reads
    // only the splits a token has; attention_kernel writes a candidate's logit before it reads it.)
    DeviceBuffer scratch =
        DeviceBuffer::scratch(one_split ? 0 : static_cast<size_t>(per_pass * token_floats) * sizeof(float));
    // The output's inverse rope (AttentionParams::o_rope) in the tensor-core kernel's stores where it
    // finishes every token (launch_attention decides and says; `attn_o_fold` off: the rope kernel
    // after, the same bits).
    static const bool o_fold_on = cuda_feature_on("attn_o_fold");
    const bool o_fold = p.o_rope != nullptr && o_fold_on;
    const bool o_done = launch_attention({.out = p.out.f32(), .scratch = parts ? nullptr : scratch.f32(), .q = p.q.f32(),
                      .tokens = static_cast<const AttnTokenArgs*>(d_tokens.get()),
                      .selected = csa ? p.selected.i32() : nullptr, .sinks = dev_view(p.sinks), .T = T, .H = H, .Dh = Dh,
                      .window = p.window, .k = k, .max_candidates = max_candidates, .csa = csa,
                      .scale = static_cast<float>(p.scale), .split_scratch = parts && !one_split ? scratch.f32() : nullptr,
                      .split_tokens_per_pass = per_pass, .kernel_tokens_per_pass = parts ? 0 : per_pass, .mma = mma, .bf16_keys = bf16_keys, .records = records,
                      .rec = rec, .block_heads = attention_block_heads_, .round_bf16 = p.round_bf16,
                      .q_prep = q_fold, .q_eps = static_cast<float>(p.q_norm_eps),
                      .q_rope = q_fold ? rope_arg(*p.q_rope) : RopeTableArg{},
                      .o_rope = o_fold ? rope_arg(*p.o_rope) : RopeTableArg{}, .weights_bf16 = p.weights_bf16, .scale_f64 = p.scale});
    launch_check("attention");
    last_attention_o_fold_ = o_done;
    if (p.o_rope != nullptr && !last_attention_o_fold_) attention_o_finish(p);
  }

  // A token whose ring slot a later token of the same sequence in this batch overwrites is
  // skipped, so the result is that of the CPU's in-order writes without a race.
  void window_append(const WindowAppendParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "window_append");
    const BatchInfo& batch = *p.batch;
    const int64_t T = batch.num_tokens(), Dh = p.kv.dim(1);
    // Each token's ring slot, then its slot in the ring's bf16 copy (LayerState::ring_bf16) where
    // kept, in one upload (a copy is a node of a captured step of its own, and one between two
    // kernels cuts their programmatic dependent launch); null: skipped.
    // A ring of records (RingForm::kRecords, chosen at a sequence's first append of record values
    // where the layer's KV can be records) gets each token's record instead, in the third T.
    std::vector<void*> dst(3 * T, nullptr);
    bool any_values = false, any_bf16 = false, any_rec = false;
    KvRecordLayout rec{};
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = batch.seq_of_token[t];
      LayerState& state = cuda_state(batch.seqs[s]).layer(p.layer);
      if (state.ring_form == RingForm::kUnset)
        state.ring_form = p.kv_record && state.rec.bytes > 0 ? RingForm::kRecords : RingForm::kValues;
      if (state.ring_form == RingForm::kRecords && !p.kv_record)
        throw std::runtime_error("window_append: layer " + std::to_string(p.layer) +
                                 "'s window ring stores FP8 KV records, but this call's rows are not record values "
                                 "(WindowAppendParams::kv_record)");
      const int64_t W = state.window, pos = batch.positions[t], last = batch.positions[batch.seq_end[s] - 1];
      if (W == 0 || pos <= last - W) continue;
      if (state.ring_form == RingForm::kRecords) {
        dst[2 * T + t] = static_cast<uint8_t*>(state.ring_rec.get()) + (pos % W) * state.rec.bytes;
        rec = state.rec;
        any_rec = true;
        continue;
      }
      SPARROW_CHECK_EQ(static_cast<int64_t>(state.ring.bytes()), W * Dh * static_cast<int64_t>(sizeof(float)));
      dst[t] = state.ring.f32() + (pos % W) * Dh;
      any_values = true;
      if (state.ring_bf16.get()) {
        dst[T + t] = static_cast<uint16_t*>(state.ring_bf16.get()) + (pos % W) * Dh;
        any_bf16 = true;
      }
    }
    if (T == 0 || !(any_values || any_rec)) return;
    if (!any_rec) dst.resize(any_bf16 ? 2 * T : T);
    const DeviceBuffer d_dst = upload_vector(dst);
    void* const* d = static_cast<void* const*>(d_dst.get());
    if (any_values) {
      launch_window_append({.dst = reinterpret_cast<float* const*>(d), .kv = p.kv.f32(), .T = T, .Dh = Dh,
                            .dst_bf16 = any_bf16 ? reinterpret_cast<uint16_t* const*>(d + T) : nullptr});
      launch_check("window_append");
    }
    if (any_rec) {
      launch_kv_record_encode({.in = p.kv.f32(), .rec_rows = reinterpret_cast<uint8_t* const*>(d + 2 * T), .rows = T,
                               .in_stride = Dh, .layout = rec});
      launch_check("window_append records");
    }
  }

  void router(const RouterParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "router");
    const BatchInfo& batch = *p.batch;
    const WeightMatrix& gate = *p.gate;
    const int64_t T = p.x.dim(0), E = gate.out, K = p.k;
    SPARROW_CHECK_EQ(p.x.numel(), T * gate.in);
    SPARROW_CHECK(K > 0 && K <= kMaxRouterTopk && K <= E);
    SPARROW_CHECK_LE(E, 4096);  // two [E] fp32 arrays in shared memory
    const bool forced = !p.forced_experts.empty();
    if (forced) SPARROW_CHECK_EQ(p.forced_experts.numel(), T * K);
    if (!forced && p.kind == MoeKind::kHash) SPARROW_CHECK(p.tid2eid.data != nullptr);
    if (!forced && p.kind == MoeKind::kScored) SPARROW_CHECK_EQ(p.bias.numel(), E);
    if (T == 0) return;
    DeviceBuffer logits = DeviceBuffer::scratch(T * E * sizeof(float));  // (the linear writes every logit)
    PartsView view = logits.f32();  // (the gate's parts where the bf16 GEMM leaves them: parts_in_readers)
    if (!(p.input_bf16 && bf16_gemm(logits.f32(), p.x.f32(), T, 1, gate, false, parts_in_readers_ ? &view : nullptr)))
      launch_linear({.out = logits.f32(), .in = p.x.f32(), .in_rows = nullptr, .w = dev_weight(gate), .T = T,
                     .in_stride = gate.in, .rows_per_group = E});
    launch_check("router logits");
    count_left(view);
    const double scale = p.placement == RoutedScalePlacement::kInRouterWeights ? p.routed_scale : 1.0;
    launch_router({.out_experts = p.out_experts.i32(), .out_weights = p.out_weights.f32(), .logits = view,
                   .forced = forced ? p.forced_experts.i32() : nullptr, .token_ids = device_batch(batch).ids,
                   .bias = dev_view(p.bias), .tid2eid = dev_index_view(p.tid2eid), .T = T, .E = E, .K = K,
                   .hash = p.kind == MoeKind::kHash, .scale = static_cast<float>(scale)});
    launch_check("router");
  }

  // Routed experts grouped by expert (each expert's weights are read once per batch, over the
  // gathered rows of the tokens that picked it), then the shared expert, then the combine.
  void moe(const MoeParams& p) override {
    OpProfiler::Scope op_scope(profiler_, "moe");
    last_moe_scatter_store_ = false;
    last_w4a8_expanded_ = false;
    const int64_t T = p.x.dim(0), D = p.x.dim(1), K = p.experts.dim(1);
    const auto& routed = *p.routed;
    const int64_t E = static_cast<int64_t>(routed.size());
    const double combine_scale = p.placement == RoutedScalePlacement::kInExpertCombine ? p.routed_scale : 1.0;
    SPARROW_CHECK_EQ(p.out.numel(), T * D);
    SPARROW_CHECK_EQ(p.weights.numel(), T * K);
    if (T == 0) return;
    // ref_numerics: every expert reads the input FP8-quantised (1x128 per token, as the CPU's
    // swiglu_ffn quantises each gathered row: the same row gives the same codes for every expert).
    // The rounded rows (xq) are made where a path reads them: the CUDA-core projections. The W4A8
    // experts and the shared expert's FP8 tensor-core GEMMs quantise p.x themselves, which gives the
    // rounded rows' values (quantising those again gives them back, with the same or half the block
    // scale and the codes doubled: the same products), so on the fast profiles' paths the pass is
    // not launched (`moe_x_lazy`, set_moe_x_lazy; off: made first, as before, the same bits).
    DeviceBuffer xq;
    last_moe_x_rounded_ = false;
    // (beside: the rows made on the side stream, by the shared expert's CUDA-core projections, and
    // read later on the default stream: it waits for the side stream's mark after them, once.)
    bool xq_on_side = false, xq_waited = false;
    const std::function<const float*()> rounded = [&]() -> const float* {
      if (!p.ref_numerics || D == 0) return p.x.f32();
      if (xq.get() && xq_on_side && !xq_waited && launch_stream() == cudaStreamPerThread) {
        side_.wait_mark();
        xq_waited = true;
      }
      if (!xq.get()) {
        OpProfiler::Scope part(profiler_, "moe/input act_quant");
        // Rounded from x into xq in one pass (a copy then an in-place pass put a copy node between
        // two kernels of a captured step).
        xq = DeviceBuffer::scratch(static_cast<size_t>(T * D) * sizeof(float));
        launch_row_sim({.x = xq.f32(), .rows = nullptr, .n = T, .row_stride = D, .dims = D,
                        .kind = RowSimKind::kFp8Pow2, .block = kFp8ActBlock, .src = p.x.f32()});
        launch_check("moe input act_quant_fp8");
        last_moe_x_rounded_ = true;
        if (launch_stream() != cudaStreamPerThread) {
          side_.mark();
          xq_on_side = true;
        }
      }
      return xq.f32();
    };
    if (!moe_x_lazy_) rounded();
    // The shared expert first, on a stream of its own beside the routed experts
    // (`moe_shared_beside`, up to kSharedBesideRows tokens; not while profiling ops, whose events
    // time the default stream): it reads only x (or the rounded rows, above), and the combine waits
    // for it. Its buffers are made here and kept to the combine; those its linears free meanwhile
    // are held to the join (SideStream).
    DeviceBuffer shared_out, shared_h1, shared_h3;
    PartsView shared_view;  // (data null: no shared expert)
    const auto shared_expert = [&] {
      OpProfiler::Scope part(profiler_, "moe/shared expert");
      const int64_t F = p.shared->w1.out;
      shared_h1 = DeviceBuffer::scratch(T * F * sizeof(float));
      shared_h3 = DeviceBuffer::scratch(T * F * sizeof(float));
      shared_out = DeviceBuffer::scratch(T * D * sizeof(float));  // (the linears write h1, h3 and it)
      shared_view = shared_out.f32();
      // (Lazy: the unrounded rows, which its tensor-core GEMMs quantise; else the rounded ones, as before.)
      swiglu_ffn(*p.shared, moe_x_lazy_ ? p.x.f32() : rounded(), D, nullptr, T, shared_h1.f32(), shared_h3.f32(),
                 shared_out.f32(), p.swiglu_limit, {.on = p.ref_numerics, .slots = nullptr, .weights = nullptr, .scale = 1.0},
                 parts_in_readers_ ? &shared_view : nullptr, &rounded);
    };
    const bool beside = p.shared != nullptr && moe_shared_beside_ && T <= kSharedBesideRows && !profiler_.enabled();
    last_moe_shared_beside_ = beside;
    // (An exception between the fork and the join still joins, so the next call can fork again.)
    struct JoinOnExit {
      SideStream& side;
      ~JoinOnExit() {
        if (side.forked()) side.join();
      }
    } join_on_exit{side_};
    if (beside) {
      side_.fork();
      const LaunchStreamScope on_side(side_.stream());
      shared_expert();
    }
    // contrib[(t*K + i), :]: expert output for token t's slot i, summed in slot order below.
    // (Every slot's row is written: each slot has an expert, and every expert's rows are scattered.)
    DeviceBuffer contrib = DeviceBuffer::scratch(T * K * D * sizeof(float));
    static const bool grouped = cuda_feature_on("grouped_moe"), device_plan = cuda_feature_on("moe_device_plan");
    std::optional<OpProfiler::Scope> routed_part(std::in_place, profiler_, "moe/routed experts");
    const ExpertTables* tab = grouped ? expert_tables(routed) : nullptr;  // null: the experts differ in shape
    if (tab) {
      MoePlan plan;
      if (device_plan) {
        OpProfiler::Scope plan_part(profiler_, "moe/plan (device)");
        plan = plan_on_device(p.experts, T, K, E);
      } else {
        plan = upload_plan(plan_on_host(p.experts, T, K, E));
      }
      run_planned_experts(*tab, routed[0], plan, rounded, D, T * K, contrib.f32(), p, combine_scale);
    } else {
      const HostMoePlan hp = plan_on_host(p.experts, T, K, E);
      if (hp.max_rows > 0) {
        // One expert at a time (experts of different shapes, or SPARROW_CUDA_DISABLE=grouped_moe).
        const DeviceBuffer d_rows = upload_vector(hp.rows), d_slots = upload_vector(hp.slots);
        const auto* rows_ptr = static_cast<const int32_t*>(d_rows.get());
        const auto* slots_ptr = static_cast<const int32_t*>(d_slots.get());
        int64_t max_f = 0;
        for (int64_t e = 0; e < E; ++e)
          if (hp.offsets[e + 1] > hp.offsets[e]) max_f = std::max(max_f, routed[e].w1.out);
        DeviceBuffer h1(hp.max_rows * max_f * sizeof(float)), h3(hp.max_rows * max_f * sizeof(float)),
            y(hp.max_rows * D * sizeof(float));
        for (int64_t e = 0; e < E; ++e) {
          const int64_t R = hp.offsets[e + 1] - hp.offsets[e];
          if (R == 0) continue;
          const RefRouting ref{.on = p.ref_numerics, .slots = slots_ptr + hp.offsets[e], .weights = p.weights.f32(),
                               .scale = combine_scale};
          swiglu_ffn(routed[e], rounded(), D, rows_ptr + hp.offsets[e], R, h1.f32(), h3.f32(), y.f32(), p.swiglu_limit,
                     ref);
          // ref_numerics: the weight is in h already; contrib = y.
          launch_expert_scatter({.contrib = contrib.f32(), .y = y.f32(), .slots = slots_ptr + hp.offsets[e],
                                 .weights = p.ref_numerics ? nullptr : p.weights.f32(), .R = R, .D = D,
                                 .scale = static_cast<float>(combine_scale)});
          launch_check("expert scatter");
        }
      }
    }
    routed_part.reset();
    if (beside) side_.join();
    else if (p.shared) shared_expert();
    launch_moe_combine({.out = p.out.f32(), .contrib = contrib.f32(), .shared = shared_view,
                        .T = T, .K = K, .D = D, .round_bf16 = p.ref_numerics});
    launch_check("moe combine");
  }

  // Device bytes of a stored tensor, uploaded on first use and cached: by its TensorView::id when
  // it has one (a checkpoint tensor: nothing on the host is read again), else by host address and
  // checked against host_fingerprint (cuda_state.h) on every use.
  const void* device_bytes(const TensorView& v) { return cached_upload(weights_, v, false); }
  // The same for an MXFP4 weight's codes, in the device layout (fp4_layout.h; a cache of its own,
  // so these bytes never serve as the released ones).
  // `tiled_rows`: the weight's rows when they go in the tiled row order (dev_weight decides), else 0.
  const void* device_fp4_bytes(const TensorView& v, int64_t tiled_rows) {
    return cached_upload(fp4_weights_, v, true, tiled_rows);
  }
  // fp4_layout: the words re-laid by a kernel after the copy, or on the host while a step is
  // captured (a captured kernel would re-lay them again at every replay); with tiled_rows, also in
  // the tiled row order (fp4_layout.h), through a staging copy of the released bytes.
  static const void* cached_upload(WeightCache<DeviceBuffer>& cache, const TensorView& v, bool fp4_layout, int64_t tiled_rows = 0) {
    if (!v.data) return nullptr;
    const size_t bytes = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
    if (fp4_layout) SPARROW_CHECK(bytes % 4 == 0 && "MXFP4 rows come in whole 32-bit words (8 inputs)");
    const bool tiled = tiled_rows > 0;
    const int64_t row_bytes = tiled ? static_cast<int64_t>(bytes) / tiled_rows : 0;
    if (tiled)
      SPARROW_CHECK(fp4_layout && row_bytes * tiled_rows == static_cast<int64_t>(bytes) && fp4_tiles(tiled_rows, row_bytes) &&
                    "an MXFP4 weight tiled on the device is whole 64-row blocks of whole 64-byte groups");
    const uint64_t fp = view_fingerprint(v);
    if (const DeviceBuffer* hit = cache.find(v, fp); hit && hit->bytes() == bytes) return hit->get();
    const LongLived weight;
    DeviceBuffer b(bytes, false);  // (every byte copied over)
    if (fp4_layout && capturing_step()) {
      // Word i of the released bytes to its place (fp4_offset) in the device layout.
      std::vector<uint32_t> words(bytes / 4), out(bytes / 4);
      std::memcpy(words.data(), v.data, bytes);
      for (size_t i = 0; i < words.size(); ++i) {
        const int64_t byte = 4 * static_cast<int64_t>(i);
        const int64_t at = tiled ? fp4_offset(true, row_bytes, byte / row_bytes, byte % row_bytes) : byte;
        out[static_cast<size_t>(at / 4)] = fp4_word_to_device(words[i]);
      }
      host_to_device(b.get(), out.data(), bytes);
    } else if (tiled) {
      DeviceBuffer released(bytes, false);
      host_to_device(released.get(), v.data, bytes);
      launch_fp4_to_device_tiled(static_cast<const uint32_t*>(released.get()), static_cast<uint32_t*>(b.get()), tiled_rows,
                                 row_bytes);
      launch_check("MXFP4 weight upload");
    } else {
      host_to_device(b.get(), v.data, bytes);
      if (fp4_layout) {
        launch_fp4_to_device_layout(static_cast<uint32_t*>(b.get()), static_cast<int64_t>(bytes / 4));
        launch_check("MXFP4 weight upload");
      }
    }
    return cache.put(v, fp, std::move(b)).get();
  }

 private:
  struct DeviceBatch {
    std::vector<int64_t> host_positions;
    std::vector<int32_t> host_ids;
    DeviceBuffer d_positions, d_ids;  // kept between batches (grown, never shrunk)
    const int64_t* positions = nullptr;
    const int32_t* ids = nullptr;
    bool in_step = false;  // uploaded in the step being captured
    // d_ids came from a batch's device_token_ids: host_ids then holds its placeholders, which a
    // later batch of host ids may equal, so that batch uploads its ids whatever they are.
    bool ids_from_device = false;
    uint64_t ids_step = 0;         // in the step of that serial (CudaBackend::step_serial_)
  };

  // The batch's positions and ids on the device; uploaded again when they change, and once in
  // every captured step (whose graph then carries the copy). The buffers stay where they are while
  // they are large enough, so a step's graph finds them at the same addresses.
  // Ids given on the device (BatchInfo::device_token_ids) are copied into the same buffer by a
  // kernel (whose pointer arguments a kept graph updates), once a step (at every call outside one).
  const DeviceBatch& device_batch(const BatchInfo& b) {
    const bool capture = step_graphs_.capturing();
    const bool device_ids = !b.device_token_ids.empty();
    if (!batch_.positions || batch_.host_positions != b.positions || batch_.host_ids != b.token_ids ||
        (capture && !batch_.in_step) || (batch_.ids_from_device && !device_ids) ||
        (device_ids && (step_depth_ == 0 || batch_.ids_step != step_serial_))) {
      batch_.host_positions = b.positions;
      batch_.host_ids = b.token_ids;
      batch_.d_positions.ensure(b.positions.size() * sizeof(int64_t));
      batch_.d_ids.ensure(b.token_ids.size() * sizeof(int32_t));
      host_to_device(batch_.d_positions.get(), b.positions.data(), b.positions.size() * sizeof(int64_t));
      if (device_ids) {
        SPARROW_CHECK(b.device_token_ids.type() == ElemType::kI32 && b.device_token_ids.numel() == b.num_tokens());
        launch_copy_i32(static_cast<int32_t*>(batch_.d_ids.get()), b.device_token_ids.i32(), b.num_tokens());
        launch_check("batch ids from the device");
      } else {
        host_to_device(batch_.d_ids.get(), b.token_ids.data(), b.token_ids.size() * sizeof(int32_t));
      }
      batch_.ids_from_device = device_ids;
      batch_.ids_step = step_serial_;
      // A non-null pointer even for an empty batch marks the cache as filled.
      static const int64_t kNoPositions = 0;
      batch_.positions = b.positions.empty() ? &kNoPositions : static_cast<const int64_t*>(batch_.d_positions.get());
      batch_.ids = static_cast<const int32_t*>(batch_.d_ids.get());
      batch_.in_step = capture;
    }
    return batch_;
  }

  DevView dev_view(const TensorView& v) {
    if (v.data) SPARROW_CHECK(is_float_dtype(v.dtype));
    return {device_bytes(v), v.dtype};
  }

  DevView dev_index_view(const TensorView& v) {
    if (v.data) SPARROW_CHECK(v.dtype == DType::kI32 || v.dtype == DType::kI64);
    return {device_bytes(v), v.dtype};
  }

  DevWeight dev_weight(const WeightMatrix& w) {
    SPARROW_CHECK(w.present());
    if (w.format == WeightFormat::kFp4Packed)
      SPARROW_CHECK(w.in % 8 == 0 && "an MXFP4 weight's rows are whole 32-bit words on the device (fp4_layout.h)");
    // (MXFP4) the rows in the tiled order where whole 64-row blocks of whole 64-byte groups: the one
    // decision, which the upload follows and every reader is told (DevWeight::fp4_tiled).
    const bool fp4_tiled = w.format == WeightFormat::kFp4Packed && fp4_tiles(w.out, w.in / 2);
    DevWeight d{.format = w.format, .out = w.out, .in = w.in,
                .data = w.format == WeightFormat::kFp4Packed ? device_fp4_bytes(w.data, fp4_tiled ? w.out : 0) : device_bytes(w.data),
                .dtype = w.data.dtype, .fp4_tiled = fp4_tiled};
    switch (w.format) {
      case WeightFormat::kFloat:
        SPARROW_CHECK(is_float_dtype(w.data.dtype));
        SPARROW_CHECK_EQ(w.data.numel(), w.out * w.in);
        break;
      case WeightFormat::kFp8Block:
      case WeightFormat::kFp4Packed:
        SPARROW_CHECK(w.scale.data != nullptr && is_float_dtype(w.scale.dtype) && w.scale.shape.size() == 2);
        SPARROW_CHECK(w.block_out > 0 && w.block_in > 0);
        SPARROW_CHECK_EQ(w.data.numel() * static_cast<int64_t>(dtype_size(w.data.dtype)),
                         w.format == WeightFormat::kFp8Block ? w.out * w.in : w.out * w.in / 2);
        d.scale = device_bytes(w.scale);
        d.scale_dtype = w.scale.dtype;
        d.scale_cols = w.scale.dim(1);
        d.block_out = w.block_out;
        d.block_in = w.block_in;
        break;
    }
    return d;
  }

  // The mix values of hc_pre / hc_head computed in a block per (token, mix) (kernels.h HcPreArgs::mix):
  // `values` floats of scratch, or an empty buffer (a null pointer) with SPARROW_CUDA_DISABLE=hc_split.
  static DeviceBuffer hc_mix_scratch(int64_t values) {
    static const bool split = cuda_feature_on("hc_split");
    return DeviceBuffer::scratch(split ? static_cast<size_t>(values) * sizeof(float) : 0);  // (every mix written)
  }

  static bool same_shape(const WeightMatrix& a, const WeightMatrix& b) {
    return a.format == b.format && a.out == b.out && a.in == b.in && a.block_out == b.block_out &&
           a.block_in == b.block_in && a.data.dtype == b.data.dtype && a.scale.dtype == b.scale.dtype;
  }

  // Device weight tables of a layer's routed experts for the grouped projections: every expert's
  // DevWeight per projection (device arrays), cached by the experts vector's address and checked
  // against expert 0's current device pointers (a re-upload after a model swap rebuilds them).
  // Null when the experts differ in shape or format.
  struct ExpertTables {
    int64_t E = 0;
    DevWeight first1{};
    DeviceBuffer w1, w3, w2;
    DeviceBuffer row_emax;  // every MXFP4 weight's DevWeight::row_emax, expert by expert (w1, w3, w2)
    bool weights_vectorizable = false;  // every expert's weights pass linear_vectorizable's weight checks
    bool wgmma_ok = false;  // every expert's weights fit the W4A8 wgmma kernels (GroupedW4A8Args::wgmma)
  };
  std::unordered_map<const void*, ExpertTables> expert_tables_;

  const ExpertTables* expert_tables(const std::vector<ExpertWeights>& routed) {
    const int64_t E = static_cast<int64_t>(routed.size());
    if (E == 0) return nullptr;
    const DevWeight d0 = dev_weight(routed[0].w1);
    auto it = expert_tables_.find(routed.data());
    if (it != expert_tables_.end() && it->second.E == E && it->second.first1.data == d0.data &&
        it->second.first1.scale == d0.scale)
      return &it->second;
    for (const ExpertWeights& w : routed)
      if (!same_shape(w.w1, routed[0].w1) || !same_shape(w.w3, routed[0].w3) || !same_shape(w.w2, routed[0].w2))
        return nullptr;
    std::vector<DevWeight> w1s, w3s, w2s;
    bool vec = true, wg = true;
    const auto wgmma_fits = [](const DevWeight& d) {
      return d.format == WeightFormat::kFp4Packed && d.block_in == 32 && d.in % 128 == 0 && d.fp4_tiled &&
             d.scale_dtype == DType::kF8E8M0 && d.scale_cols % 4 == 0 && d.scale_cols >= d.in / 32 &&
             reinterpret_cast<uintptr_t>(d.scale) % 4 == 0 && reinterpret_cast<uintptr_t>(d.data) % 16 == 0;
    };
    alignas(16) static const float kAligned[4] = {};  // stands in for an aligned input in the weight checks
    for (const ExpertWeights& w : routed) {
      w1s.push_back(dev_weight(w.w1));
      w3s.push_back(dev_weight(w.w3));
      w2s.push_back(dev_weight(w.w2));
      for (const DevWeight* d : {&w1s.back(), &w3s.back(), &w2s.back()}) {
        wg = wg && wgmma_fits(*d);
        vec = vec && linear_vectorizable({.out = nullptr, .in = kAligned, .in_rows = nullptr, .w = *d, .T = 1,
                                          .in_stride = 4, .rows_per_group = 1});
      }
    }
    ExpertTables& t = expert_tables_[routed.data()];
    const LongLived tables;
    // The W4A8 wgmma kernels' row_emax, from the host's scale bytes (those just uploaded): each
    // row's largest over its in / 32 blocks.
    if (wg) {
      std::vector<uint8_t> emax;
      for (int64_t e = 0; e < E; ++e)
        for (const WeightMatrix* m : {&routed[e].w1, &routed[e].w3, &routed[e].w2}) {
          const auto* sc = static_cast<const uint8_t*>(m->scale.data);
          const int64_t cols = m->scale.dim(1), blocks = m->in / 32;
          for (int64_t r = 0; r < m->out; ++r) emax.push_back(*std::max_element(sc + r * cols, sc + r * cols + blocks));
        }
      t.row_emax = upload_vector(emax);
      const auto* next = static_cast<const uint8_t*>(t.row_emax.get());  // (the rows in the order filled)
      for (int64_t e = 0; e < E; ++e)
        for (DevWeight* d : {&w1s[e], &w3s[e], &w2s[e]}) d->row_emax = next, next += d->out;
    }
    t.E = E;
    t.first1 = w1s[0];
    t.w1 = upload_vector(w1s);
    t.w3 = upload_vector(w3s);
    t.w2 = upload_vector(w2s);
    t.weights_vectorizable = vec;
    t.wgmma_ok = wg;
    return &t;
  }

  // The MoE's grouping: rows grouped by expert in (token, slot) order, and the grouped
  // projections' work items, one per (expert with rows, tile of 8 rows) (kernels.h MoePlanArgs).
  // The grouped projections' items run on grid x, which allows 2^31 - 1 blocks.
  static constexpr int64_t kMaxMoeItems = (int64_t{1} << 31) - 1;
  struct MoePlan {
    DeviceBuffer offsets, rows, slots, items, n_items;
    int64_t max_items = 0;  // a bound on *n_items (the grid's height)
  };
  struct HostMoePlan {
    std::vector<int64_t> offsets;  // [E + 1]
    std::vector<int32_t> rows, slots, items;
    int64_t max_rows = 0, n_items = 0;
  };

  // The device plan's bound on its work items: the sum over experts of ceil(R_e / 8) is at most
  // total / 8 + (experts with rows) <= total / 8 + min(E, total), plus one for the rounding.
  static int64_t device_plan_items(int64_t total, int64_t E) {
    return total / kMoeTileRows + std::min(E, total) + 1;
  }

  // On the device: nothing waits for the router.
  MoePlan plan_on_device(const Tensor& experts, int64_t T, int64_t K, int64_t E) {
    MoePlan plan;
    const int64_t total = T * K;
    plan.max_items = device_plan_items(total, E);
    // moe_place_kernel writes the offsets, every row and slot, the first n_items items and n_items;
    // no kernel reads an item past n_items.
    plan.offsets = DeviceBuffer::scratch((E + 1) * sizeof(int64_t));
    plan.rows = DeviceBuffer::scratch(total * sizeof(int32_t));
    plan.slots = DeviceBuffer::scratch(total * sizeof(int32_t));
    plan.items = DeviceBuffer::scratch(2 * plan.max_items * sizeof(int32_t));
    plan.n_items = DeviceBuffer::scratch(sizeof(int32_t));
    // Zero-filled where several blocks add to it; else the count kernel's one block stores every count
    // (no fill: a node of the captured step that cuts its chain of programmatic dependent launches).
    const DeviceBuffer counts = moe_plan_counts_unfilled(total) ? DeviceBuffer::scratch(E * sizeof(int32_t))
                                                               : DeviceBuffer(E * sizeof(int32_t));
    launch_moe_plan({.experts = experts.i32(), .T = T, .K = K, .E = E,
                     .offsets = static_cast<int64_t*>(plan.offsets.get()), .rows = static_cast<int32_t*>(plan.rows.get()),
                     .slots = static_cast<int32_t*>(plan.slots.get()), .items = static_cast<int32_t*>(plan.items.get()),
                     .n_items = static_cast<int32_t*>(plan.n_items.get()), .max_items = plan.max_items,
                     .counts = static_cast<int32_t*>(counts.get())});
    launch_check("moe plan");
    return plan;
  }

  // On the host, from the downloaded expert choices (the same grouping and order).
  HostMoePlan plan_on_host(const Tensor& experts_t, int64_t T, int64_t K, int64_t E) {
    SPARROW_CHECK(capturing_step() == nullptr &&
                  "a host MoE plan downloads the expert choices, which a captured step cannot (begin_step)");
    const std::vector<int32_t> experts = download_i32(experts_t);
    HostMoePlan hp;
    hp.offsets.assign(E + 1, 0);
    for (int32_t e : experts) {
      SPARROW_CHECK(e >= 0 && e < E);
      ++hp.offsets[e + 1];
    }
    for (int64_t e = 0; e < E; ++e) {
      hp.max_rows = std::max(hp.max_rows, hp.offsets[e + 1]);
      hp.offsets[e + 1] += hp.offsets[e];
      for (int64_t t0 = 0; t0 < hp.offsets[e + 1] - hp.offsets[e]; t0 += kMoeTileRows) {
        hp.items.push_back(static_cast<int32_t>(e));
        hp.items.push_back(static_cast<int32_t>(t0));
      }
    }
    hp.n_items = static_cast<int64_t>(hp.items.size()) / 2;
    hp.rows.resize(T * K);
    hp.slots.resize(T * K);
    std::vector<int64_t> fill(hp.offsets.begin(), hp.offsets.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) {
      const int64_t r = fill[experts[i]]++;
      hp.rows[r] = static_cast<int32_t>(i / K);
      hp.slots[r] = static_cast<int32_t>(i);
    }
    return hp;
  }

  MoePlan upload_plan(const HostMoePlan& hp) {
    MoePlan plan;
    plan.max_items = hp.n_items;
    plan.offsets = upload_vector(hp.offsets);
    plan.rows = upload_vector(hp.rows);
    plan.slots = upload_vector(hp.slots);
    plan.items = upload_vector(hp.items);
    plan.n_items = upload_vector(std::vector<int32_t>{static_cast<int32_t>(hp.n_items)});
    return plan;
  }

  // The routed experts over a plan, one launch per projection, then SwiGLU, the reference
  // numerics' routing weight and FP8 rounding, w2 and the scatter over all rows at once. On the CUDA
  // cores (launch_grouped_expert_linear) each row goes through the arithmetic of the
  // one-expert-at-a-time path (swiglu_ffn), so the results are the same bits. Under the reference
  // numerics with MXFP4 experts (unless SPARROW_CUDA_DISABLE=w4a8, or set_w4a8_experts(false)), on the
  // tensor cores instead (launch_grouped_w4a8): the projections' inputs become e4m3 codes and 1x128
  // scales (launch_act_quant_fp8: the values fp8_rows gives, bit for bit), both operands are widened
  // to f16 in the kernel; the products are exact, the sums fp32 in the mma's order, so the rows
  // differ from the CUDA-core path in the last bits.
  // x_of: the input rows FP8-rounded (made on the first call), which the CUDA-core projections read;
  // the W4A8 kernels quantise p.x themselves.
  void run_planned_experts(const ExpertTables& tab, const ExpertWeights& f, const MoePlan& plan,
                           const std::function<const float*()>& x_of, int64_t D, int64_t total, float* contrib,
                           const MoeParams& p, double combine_scale) {
    const int64_t F = f.w1.out;
    SPARROW_CHECK_EQ(f.w3.out, F);
    SPARROW_CHECK_EQ(f.w2.in, F);
    SPARROW_CHECK_EQ(f.w1.in, D);
    SPARROW_CHECK_EQ(f.w2.out, D);
    SPARROW_CHECK_LE(plan.max_items, kMaxMoeItems);  // more work items than the grid's x: a batch of > 2^33 rows
    const auto mxfp4 = [](const WeightMatrix& w) { return w.format == WeightFormat::kFp4Packed && w.block_in == 32; };
    const bool w4a8 =
        w4a8_experts_ && p.ref_numerics && mxfp4(f.w1) && mxfp4(f.w3) && mxfp4(f.w2) && D % 32 == 0 && F % 32 == 0;
    if (w4a8) SPARROW_CHECK(D < (int64_t{1} << 30) && F < (int64_t{1} << 30));  // the W4A8 kernels index in int
    // Many rows an expert (an average of kTiledRowsPerExpert or more, as in prefill): the W4A8 kernel
    // that stages tiles in shared memory; the same bits as the small one (kernels.h GroupedW4A8Args).
    constexpr int64_t kTiledRowsPerExpert = 32;
    const bool tiled = w4a8 && w4a8_tiled_ && total >= kTiledRowsPerExpert * static_cast<int64_t>(p.routed->size());
    // On wgmma (the FP8 tensor cores) where every expert's weights allow (ExpertTables::wgmma_ok: K a
    // multiple of 128, packed e8m0 scales; unless SPARROW_CUDA_DISABLE=w4a8_wgmma); the tiled and the
    // decode kernel there give the same bits as each other, not as the mma.sync kernels.
    const bool wgmma = w4a8 && w4a8_wgmma_ && tab.wgmma_ok;
    // The rounded input rows, for the CUDA-core projections only (null on W4A8: not made there).
    const float* const x = w4a8 ? nullptr : x_of();
    // The tiled kernel's grid: a bound on the sum over experts of ceil(R_e / 64).
    const int64_t E = static_cast<int64_t>(p.routed->size());
    const int64_t max_tiles = w4a8_tile_bound(total, E, kW4A8TileRows);
    SPARROW_CHECK_LE(max_tiles, kMaxMoeItems);
    // h1 and h3 in one buffer, h3 after h1: the decode wgmma kernel computes both in one launch
    // (GroupedW4A8Args::w_b; `w4a8_pair` off: a launch each, the same bits).
    // (Every row of every expert with rows is written by the projections; the quarters' slices of
    // `partial` likewise, an empty quarter as zeros.)
    DeviceBuffer h13 = DeviceBuffer::scratch(2 * total * F * sizeof(float));
    float* const h1 = h13.f32();
    float* const h3 = h1 + total * F;
    static const bool pair_on = cuda_feature_on("w4a8_pair");
    const bool pair = pair_on && wgmma && !tiled;
    // The decode wgmma kernel split over K's quarters for few rows (GroupedW4A8Args::partial): at
    // batch 1 an unsplit block walks all of K alone. The same bits split or not.
    const bool split = wgmma && !tiled &&
                       (w4a8_wgmma_split_ == 2 || (w4a8_wgmma_split_ == 0 && total <= kSplitRows));
    DeviceBuffer partial = DeviceBuffer::scratch(split ? 4 * total * std::max(D, 2 * F) * sizeof(float) : 0);
    // Where a block sums all of w2's K (the tiled kernel, or the decode kernel unsplit), the wgmma
    // kernels store w2's rows straight into their slots of contrib (GroupedW4A8Args::scatter_slots;
    // `moe_scatter_store` off: into y, then expert_scatter_kernel; the same values: the W4A8 path
    // runs under ref_numerics only, where the scatter applies no routing weight).
    static const bool scatter_store_on = cuda_feature_on("moe_scatter_store");
    const bool scatter_store = scatter_store_on && wgmma && !split;
    DeviceBuffer y = DeviceBuffer::scratch(scatter_store ? 0 : total * D * sizeof(float));
    // The expanded form of the tiled wgmma projections (GroupedW4A8Args::expanded): one scratch for
    // the weights' e5m2 bytes of one projection at a time (stream order: each projection's GEMM has
    // read it before the next one's expansion writes it), and one for w1 / w3's input rows in grouped
    // order (gathered once, for both; w2's rows are in that order already).
    static const bool expand_on = cuda_feature_enabled("w4a8_expand");  // (opt-in: slower on an H100)
    const bool expand = wgmma && tiled &&
                        (w4a8_expand_ == 2 || (w4a8_expand_ == 0 && expand_on && total >= kW4A8ExpandRows * E));
    last_w4a8_expanded_ = expand;
    DeviceBuffer expanded = DeviceBuffer::scratch(
        expand ? static_cast<size_t>(std::max(w4a8_expanded_bytes(E, F, D), w4a8_expanded_bytes(E, D, F))) : 0);
    const int64_t d_pad = (D + kFp8ActBlock - 1) / kFp8ActBlock * kFp8ActBlock;
    DeviceBuffer sorted_codes = DeviceBuffer::scratch(expand ? static_cast<size_t>(total * d_pad) : 0);
    bool rows_sorted = false;  // sorted_codes holds w1 / w3's rows
    const int64_t tma_tiles = expand ? w4a8_tile_bound(total, E, kW4A8TmaTileRows) : 0;
    DeviceBuffer tile_list = DeviceBuffer::scratch(static_cast<size_t>(2 * tma_tiles) * sizeof(int64_t));
    DeviceBuffer tile_scales = DeviceBuffer::scratch(
        static_cast<size_t>(tma_tiles * (std::max(D, F) / kFp8ActBlock) * kW4A8TmaTileRows) * sizeof(float));
    const bool vec = p.ref_numerics && tab.weights_vectorizable && aligned16(x) && D % 4 == 0 && F % 4 == 0 &&
                     aligned16(h1);
    const auto* rows = static_cast<const int32_t*>(plan.rows.get());
    const auto* slots = static_cast<const int32_t*>(plan.slots.get());
    // w4a8: an input [n, K] of float rows as e4m3 codes [n, k_pad] and scales [k_pad / 128, n].
    struct Codes {
      DeviceBuffer codes, scales;
      int64_t rows = 0, k_pad = 0;
    };
    // Codes for n rows of K inputs, and the act_quant arguments that fill them from `in` (f32 rows).
    const auto new_codes = [](int64_t n, int64_t K) {
      Codes c{.rows = n, .k_pad = (K + kFp8ActBlock - 1) / kFp8ActBlock * kFp8ActBlock};
      // (act_quant writes every code, padding included, and every scale.)
      c.codes = DeviceBuffer::scratch(static_cast<size_t>(n * c.k_pad));
      c.scales = DeviceBuffer::scratch(static_cast<size_t>(c.k_pad / kFp8ActBlock * n) * sizeof(float));
      return c;
    };
    const auto quant_args = [wgmma](Codes& c, const float* in, int64_t K) {
      return ActQuantFp8Args{.codes = static_cast<uint8_t*>(c.codes.get()), .scales = c.scales.f32(), .in = in,
                             .in_dtype = DType::kF32, .rows = c.rows, .K = K, .in_stride = K, .rows_pad = c.rows,
                             .k_pad = c.k_pad, .w4a8_order = wgmma};
    };
    const auto quantise = [&](const float* in, int64_t n, int64_t K) {
      Codes c = new_codes(n, K);
      launch_act_quant_fp8(quant_args(c, in, K));
      launch_check("experts act_quant (w4a8)");
      return c;
    };
    // The plan's last kernel (or upload) is at least two launches behind every projection: the
    // input's act_quant comes between it and w1 / w3, the swiglu pass between w1 / w3 and w2. So the
    // decode kernel reads the plan before its wait (GroupedW4A8Args::plan_early; SPARROW_CUDA_DISABLE=
    // w4a8_early: after it, the same bits).
    static const bool plan_early = cuda_feature_on("w4a8_early");
    // out = in x W^T over the plan; `in` is float rows (CUDA cores) or `codes` (w4a8).
    // w_b (w4a8 decode wgmma only): a second projection of the same shape into out + total * N.
    // Returns out's view: where `leave` and the decode kernel split K's quarters over blocks, the
    // quarters in `partial`, for the next kernel to add (parts_in_readers; out not written).
    // scatter (w2 under scatter_store): out is contrib, row r's outputs going to its slot.
    auto project = [&](const DeviceBuffer& w, const WeightMatrix& shape, float* out, const float* in, const Codes& codes,
                       const int32_t* in_rows, const DeviceBuffer* w_b = nullptr, bool leave = false,
                       bool scatter = false) -> PartsView {
      const auto* dw = static_cast<const DevWeight*>(w.get());
      const auto* offsets = static_cast<const int64_t*>(plan.offsets.get());
      const auto* items = static_cast<const int32_t*>(plan.items.get());
      const auto* n_items = static_cast<const int32_t*>(plan.n_items.get());
      if (w4a8) {
        return launch_grouped_w4a8({.out = out, .codes = static_cast<const uint8_t*>(codes.codes.get()),
                             .scales = codes.scales.f32(), .rows_pad = codes.rows, .k_pad = codes.k_pad,
                             .in_rows = in_rows, .w = dw, .offsets = offsets, .items = items, .n_items = n_items,
                             .max_items = plan.max_items, .N = shape.out, .K = shape.in, .tiled = tiled,
                             .experts = E, .max_tiles = max_tiles, .small_tiles = w4a8_small_tiles_,
                             .wgmma = wgmma, .wgmma_warpgroups = w4a8_wgmma_warpgroups_,
                             .partial = split ? partial.f32() : nullptr, .rows_total = total,
                             .w_b = w_b ? static_cast<const DevWeight*>(w_b->get()) : nullptr,
                             .plan_early = plan_early, .leave_parts = leave,
                             .scatter_slots = scatter ? slots : nullptr,
                             .expanded = expand ? static_cast<uint8_t*>(expanded.get()) : nullptr,
                             .sorted_codes = static_cast<uint8_t*>(sorted_codes.get()),
                             .sorted_ready = in_rows != nullptr && std::exchange(rows_sorted, expand),
                             .tile_list = static_cast<int64_t*>(tile_list.get()), .tile_scales = tile_scales.f32()});
      }
      SPARROW_CHECK(!scatter && "scattered stores: the W4A8 wgmma kernels only");
      launch_grouped_expert_linear({.out = out, .in = in, .in_rows = in_rows, .w = dw, .offsets = offsets,
                                    .items = items, .n_items = n_items, .max_items = plan.max_items, .N = shape.out,
                                    .in_stride = shape.in, .format = shape.format, .vectorized = vec});
      return out;
    };
    // The profile's names of the two projection steps, by path: CUDA cores, then W4A8 (mma.sync or
    // wgmma, small or tiled kernel).
    static constexpr const char* kW13[] = {"moe/experts w1, w3", "moe/experts w1, w3 (w4a8)",
                                           "moe/experts w1, w3 (w4a8 tiled)", "moe/experts w1, w3 (w4a8 wgmma)",
                                           "moe/experts w1, w3 (w4a8 wgmma tiled)"};
    static constexpr const char* kW2[] = {"moe/experts w2, scatter", "moe/experts w2, scatter (w4a8)",
                                          "moe/experts w2, scatter (w4a8 tiled)", "moe/experts w2, scatter (w4a8 wgmma)",
                                          "moe/experts w2, scatter (w4a8 wgmma tiled)"};
    const int path = w4a8 ? 1 + (tiled ? 1 : 0) + (wgmma ? 2 : 0) : 0;
    std::optional<OpProfiler::Scope> part(std::in_place, profiler_, kW13[path]);
    // The fused activation kernel adds w1 and w3's quarters itself where one launch made both (their
    // own launches would share `partial`), and the scatter w2's (parts_in_readers).
    const bool fused_act = w4a8 && moe_fused_act_;
    PartsView h1_view = h1, h3_view = h3;
    {
      // w4a8 quantises the layer input itself (p.x; x is its fp8_rows copy, the same values).
      const Codes xc = w4a8 ? quantise(p.x.f32(), p.x.dim(0), D) : Codes{};
      if (pair) {
        h1_view = project(tab.w1, f.w1, h1, x, xc, rows, &tab.w3, fused_act && parts_in_readers_);
        h3_view = h1_view.from(total * F);
        count_left(h1_view);
      } else {
        project(tab.w1, f.w1, h1, x, xc, rows);
        project(tab.w3, f.w3, h3, x, xc, rows);
      }
    }
    part.emplace(profiler_, "moe/experts swiglu, scale, act_quant");
    Codes hc;
    if (fused_act) {
      // The three steps below in one kernel, the same bits (SPARROW_CUDA_DISABLE=moe_fused_act: in turn).
      hc = new_codes(total, F);
      launch_swiglu_quant_fp8({.h1 = h1_view, .h3 = h3_view, .limit = static_cast<float>(p.swiglu_limit),
                               .slots = slots, .weights = p.weights.f32(), .scale = combine_scale,
                               .q = quant_args(hc, nullptr, F)});
      launch_check("experts swiglu, routing weight, act_quant (w4a8)");
    } else {
      launch_swiglu({.a = h1, .b = h3, .n = total * F, .limit = static_cast<float>(p.swiglu_limit)});
      if (p.ref_numerics) {
        launch_check("experts swiglu");
        launch_route_scale_bf16({.h = h1, .slots = slots, .weights = p.weights.f32(), .R = total, .F = F,
                                 .scale = combine_scale});
        launch_check("experts routing weight");
        if (w4a8) hc = quantise(h1, total, F);
        else fp8_rows(h1, total, F, F, kFp8ActBlock, "experts w2 act_quant_fp8");
      }
    }
    part.emplace(profiler_, kW2[path]);
    if (scatter_store) {
      project(tab.w2, f.w2, contrib, h1, hc, nullptr, nullptr, false, true);
      launch_check("experts ffn, scattered");
      last_moe_scatter_store_ = true;
      return;
    }
    const PartsView y_view = project(tab.w2, f.w2, y.f32(), h1, hc, nullptr, nullptr, parts_in_readers_);
    launch_check("experts ffn");
    count_left(y_view);
    launch_expert_scatter({.contrib = contrib, .y = y_view, .slots = slots,
                           .weights = p.ref_numerics ? nullptr : p.weights.f32(), .R = total, .D = D,
                           .scale = static_cast<float>(combine_scale)});
    launch_check("experts scatter");
  }

  // ref_numerics inside one expert: h <- bf16(g_r * h) then FP8 1x128, before w2 (weights null: g = 1).
  struct RefRouting {
    bool on = false;
    const int32_t* slots = nullptr;
    const float* weights = nullptr;
    double scale = 1.0;
  };

  // ys = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for the R rows `rows` of x (all T when null).
  // With `y_view` (the shared expert under parts_in_readers), the FP8 GEMMs' quarters may be left for
  // their readers: the stacked w1 / w3's for swiglu_sim, w2's for the caller's reader, *y_view then
  // saying where y is (y itself or the quarters, valid until the next FP8 linear).
  // cc_x, where set: x is the input before its FP8 rounding (ref.on), which the tensor-core GEMMs
  // quantise themselves, and cc_x() the rounded rows that a CUDA-core projection reads instead.
  void swiglu_ffn(const ExpertWeights& w, const float* x, int64_t x_stride, const int32_t* rows, int64_t R, float* h1,
                  float* h3, float* y, double limit, const RefRouting& ref, PartsView* y_view = nullptr,
                  const std::function<const float*()>* cc_x = nullptr) {
    if (y_view) *y_view = y;
    const int64_t F = w.w1.out;
    SPARROW_CHECK_EQ(w.w3.out, F);
    SPARROW_CHECK_EQ(w.w2.in, F);
    SPARROW_CHECK_EQ(w.w1.in, x_stride);
    SPARROW_CHECK_EQ(w.w2.out, x_stride);
    // Under the reference numerics, an ungathered FFN (the shared expert) with 128x128 FP8 weights
    // takes the fast linears' tensor-core GEMM (fp8_gemm), which quantises its input: the rounded
    // rows' values whether it is given them (quantising them again gives them back) or, with cc_x,
    // the rows before their rounding (fp8_gemm_rows).
    const bool tensor_cores = ref.on && rows == nullptr;
    auto project = [&](float* out, const float* in, const int32_t* in_rows, int64_t in_stride, int64_t rows_per_group,
                       const WeightMatrix& m, PartsView* view = nullptr,
                       const std::function<const float*()>* cc_in = nullptr) {
      if (!(tensor_cores && fp8_gemm_rows(out, in, R, m, false, view)))
        launch_linear({.out = out, .in = cc_in ? (*cc_in)() : in, .in_rows = in_rows, .w = dev_weight(m), .T = R,
                       .in_stride = in_stride, .rows_per_group = rows_per_group, .vectorized = ref.on});
    };
    // The shared expert's w1 and w3 as one GEMM over the two stacked (`fp8_stack`), SwiGLU reading
    // both halves of each row.
    // Under the reference numerics SwiGLU, the routing weight's rounding and the fp8 rounding in one
    // kernel (SPARROW_CUDA_DISABLE=swiglu_sim: three passes, the same bits), which can add the
    // stacked GEMM's quarters itself.
    static const bool swiglu_sim = cuda_feature_on("swiglu_sim");
    const bool fused = ref.on && swiglu_sim;
    const float* stacked = nullptr;
    PartsView stacked_view;
    if (fp8_stack_ && tensor_cores && fp8_gemm_in_linear_) {
      const WeightMatrix* ws[] = {&w.w1, &w.w3};
      stacked = fp8_.run_stacked(Tensor(nullptr, const_cast<float*>(x), ElemType::kF32, {R, x_stride}), ws,
                                 y_view && fused ? &stacked_view : nullptr);
      if (stacked && stacked_view.data == nullptr) stacked_view = stacked;
      if (stacked) count_left(stacked_view);
    }
    if (!stacked) {
      project(h1, x, rows, x_stride, F, w.w1, nullptr, cc_x);
      project(h3, x, rows, x_stride, F, w.w3, nullptr, cc_x);
    }
    // SwiGLU's operands: the stacked GEMM's rows of 2F (w1's half, then w3's), or h1 and h3.
    float* const a = stacked ? const_cast<float*>(stacked) : h1;
    const float* const b = stacked ? stacked + F : h3;
    const int64_t stride = stacked ? 2 * F : F;
    if (fused)
      launch_swiglu_sim_fp8({.out = h1, .a = stacked ? stacked_view : PartsView(h1),
                             .b = stacked ? stacked_view.from(F) : PartsView(h3), .R = R, .F = F, .stride = stride,
                             .limit = static_cast<float>(limit), .slots = ref.slots, .weights = ref.weights,
                             .scale = ref.scale, .block = kFp8ActBlock});
    else  // (the strided form; with stride F it is h1 in place, the same values)
      launch_swiglu({.a = a, .b = b, .n = R * F, .limit = static_cast<float>(limit), .out = h1, .cols = F,
                     .stride = stride});
    if (fused) {
      launch_check("expert swiglu, routing weight, act_quant_fp8 rounding");
    } else if (ref.on) {
      launch_check("expert swiglu");
      launch_route_scale_bf16({.h = h1, .slots = ref.slots, .weights = ref.weights, .R = R, .F = F, .scale = ref.scale});
      launch_check("expert routing weight");
      fp8_rows(h1, R, F, F, kFp8ActBlock, "expert w2 act_quant_fp8");
    }
    project(y, h1, nullptr, F, w.w2.out, w.w2, y_view);
    launch_check("expert ffn");
    if (y_view) count_left(*y_view);
  }

  // out [T, N] = in [T, G*K] (bf16 values) x w^T in G groups as a bf16 GEMM on the tensor cores
  // (Bf16GroupedLinear) when bf16_gemm is on and w is a weight it takes (FP8-block or BF16, R and K
  // multiples of 8); false (nothing run) otherwise. Whether it runs depends on the shapes, never on T.
  // `round_bf16`: the outputs rounded to bf16 too (in the GEMM's sum of parts where it has one).
  // `parts`: as Bf16GroupedLinear::run's (set only when it returns true).
  bool bf16_gemm(float* out, const float* in, int64_t T, int64_t G, const WeightMatrix& w, bool round_bf16 = false,
                 PartsView* parts = nullptr) {
    static const bool on = cuda_feature_on("bf16_gemm");
    if (!on || !bf16_.run(out, in, T, G, w, [&] { return dev_weight(w); }, round_bf16, parts)) return false;
    launch_check("bf16 GEMM");
    return true;
  }

  // out [T, N] = act_quant_fp8(in [T, K], contiguous) x w^T on the tensor cores (Fp8Linear, the
  // batch-invariant cuBLASLt plan) when fp8_gemm is on and w is FP8 with 128x128 blocks; false (and
  // nothing run) otherwise. An input whose rows are already FP8-rounded (1x128, power-of-two scales)
  // is quantised to the same values again, so callers may pass either.
  // `parts`: as Fp8Linear::run's (set only when it returns true).
  bool fp8_gemm_rows(float* out, const float* in, int64_t T, const WeightMatrix& w, bool round_bf16 = false,
                     PartsView* parts = nullptr) {
    if (!fp8_gemm_in_linear_ || w.format != WeightFormat::kFp8Block || w.block_out != 128 || w.block_in != 128)
      return false;
    const Tensor ti(nullptr, const_cast<float*>(in), ElemType::kF32, {T, w.in});
    const Tensor to(nullptr, out, ElemType::kF32, {T, w.out});
    fp8_.run({.out = to, .in = ti, .weight = &w}, [&] { return dev_weight(w); }, round_bf16, parts);
    return true;
  }
  // Counts a view whose parts its reader adds (parts_left_for_readers).
  void count_left(const PartsView& v) {
    if (!v.summed()) ++parts_left_;
  }

  WeightCache<DeviceBuffer> weights_;
  WeightCache<DeviceBuffer> fp4_weights_;  // MXFP4 codes in the device layout (device_fp4_bytes)
  DeviceBatch batch_;
  StepGraphs step_graphs_;
  bool step_graphs_on_ = cuda_feature_on("graphs");
  int step_depth_ = 0;
  uint64_t step_serial_ = 0;  // steps begun (device_batch copies device ids once a step)
  // The arena hands blocks a step frees out again within the step (arena_blocks.h), so a captured
  // step holds about the peak of its temporaries, as op by op; the engine's 256-token prefill
  // chunks are captured too.
  static constexpr int64_t kMaxGraphTokens = 512;
  std::vector<bool> warm_steps_ = std::vector<bool>(kMaxGraphTokens + 1);  // by token count: run before
  Fp8Linear fp8_;
  Bf16GroupedLinear bf16_;
  DeviceBuffer hc_arrivals_;  // launch_hc_boundary's counters (kernels.h HcBoundaryArgs::arrivals)
  OpProfiler profiler_;
  enum class LinearPath : uint8_t { kElementWise, kVectorized, kTensorCores };
  LinearPath last_linear_ = LinearPath::kElementWise;  // test support
  bool fp8_gemm_in_linear_ = false;
  bool w4a8_experts_ = cuda_feature_on("w4a8");
  bool w4a8_tiled_ = cuda_feature_on("w4a8_tiled");
  bool moe_fused_act_ = cuda_feature_on("moe_fused_act");
  bool moe_x_lazy_ = cuda_feature_on("moe_x_lazy");
  bool last_moe_x_rounded_ = false;  // test support
  bool fp8_stack_ = cuda_feature_on("fp8_stack");  // linears of one input as one GEMM (linears, swiglu_ffn)
  bool w4a8_wgmma_ = cuda_feature_on("w4a8_wgmma");
  int w4a8_wgmma_warpgroups_ = 0;
  int w4a8_wgmma_split_ = 0;           // 0: by the rows (kSplitRows), 1: never, 2: always
  int w4a8_expand_ = 0;                // 0: by the rows (kW4A8ExpandRows, `w4a8_expand`), 1: never, 2: always
  bool last_w4a8_expanded_ = false;    // test support
  static constexpr int64_t kSplitRows = 64;
  int w4a8_small_tiles_ = 0;
  bool last_indexer_mma_ = false;  // test support
  bool last_attention_mma_ = false;  // test support
  int64_t last_attention_passes_ = 0;  // test support
  bool last_attention_q_fold_ = false;  // test support
  bool last_attention_o_fold_ = false;  // test support
  bool last_attention_bf16_kv_ = false;  // test support
  bool last_attention_records_ = false;  // test support
  bool kv_records_ = cuda_feature_enabled("kv_record");  // set_kv_records; SPARROW_CUDA_ENABLE=kv_record
  int attention_block_heads_ = 0;        // test support (set_attention_block_heads)
  bool hc_fused_ = cuda_feature_on("hc_fused");  // set_hc_fused; SPARROW_CUDA_DISABLE=hc_fused
  bool last_hc_boundary_fused_ = false;
  bool last_moe_scatter_store_ = false;  // the last moe call's w2 stored its rows in their slots
  // set_moe_shared_beside; SPARROW_CUDA_DISABLE=moe_shared_beside. Up to kSharedBesideRows tokens:
  // the 8-layer batch-1 step 5-7 % shorter on an H100, batch 256's layer cell 0.5-0.8 % longer
  // (2026-12-07, docs/perf.md).
  bool moe_shared_beside_ = cuda_feature_on("moe_shared_beside");
  static constexpr int64_t kSharedBesideRows = 64;
  bool last_moe_shared_beside_ = false;  // test support
  SideStream side_;  // (moe) the shared expert's stream
  // set_parts_in_readers; SPARROW_CUDA_DISABLE=parts_in_readers
  bool parts_in_readers_ = cuda_feature_on("parts_in_readers");
  int64_t parts_left_ = 0;  // GEMM outputs whose parts a reader added (test support)
  bool attention_bf16_kv_ = true;        // test support (set_attention_bf16_kv)
  int indexer_mma_tiles_ = 0;       // test support

 public:
  void set_w4a8_experts(bool on) { w4a8_experts_ = on; }
  void set_w4a8_tiled(bool on) { w4a8_tiled_ = on; }
  void set_moe_fused_act(bool on) { moe_fused_act_ = on; }
  void set_moe_x_lazy(bool on) { moe_x_lazy_ = on; }
  bool last_moe_x_rounded() const { return last_moe_x_rounded_; }
  void set_w4a8_wgmma(bool on) { w4a8_wgmma_ = on; }
  void set_w4a8_wgmma_warpgroups(int n) { w4a8_wgmma_warpgroups_ = n; }
  void set_w4a8_wgmma_split(int mode) { w4a8_wgmma_split_ = mode; }
  void set_w4a8_expand(int mode) { w4a8_expand_ = mode; }
  bool last_w4a8_expanded() const { return last_w4a8_expanded_; }
  void set_w4a8_small_tiles(int tiles) { w4a8_small_tiles_ = tiles; }
  bool last_indexer_mma() const { return last_indexer_mma_; }
  bool last_attention_mma() const { return last_attention_mma_; }
  int64_t last_attention_passes() const { return last_attention_passes_; }
  bool last_attention_q_fold() const { return last_attention_q_fold_; }
  bool last_attention_o_fold() const { return last_attention_o_fold_; }
  bool last_attention_bf16_kv() const { return last_attention_bf16_kv_; }
  bool last_attention_records() const { return last_attention_records_; }
  void set_kv_records(bool on) { kv_records_ = on; }
  void set_hc_fused(bool on) { hc_fused_ = on; }
  bool hc_fused() const { return hc_fused_; }
  void set_parts_in_readers(bool on) { parts_in_readers_ = on; }
  int64_t parts_left_for_readers() const { return parts_left_; }
  int64_t fp8_linear_quantisations() const { return fp8_.quantisations(); }
  bool last_hc_boundary_fused() const { return last_hc_boundary_fused_; }
  bool last_moe_scatter_store() const { return last_moe_scatter_store_; }
  void set_moe_shared_beside(bool on) { moe_shared_beside_ = on; }
  bool last_moe_shared_beside() const { return last_moe_shared_beside_; }
  bool kv_records() const { return kv_records_; }
  void set_attention_block_heads(int heads) { attention_block_heads_ = heads; }
  void set_attention_bf16_kv(bool on) { attention_bf16_kv_ = on; }
  void set_indexer_mma_tiles(int tiles) { indexer_mma_tiles_ = tiles; }
  // The fast profiles' FP8-stored linears on the tensor cores (batch-invariant cuBLASLt plans).
  void set_fp8_gemm_in_linear(bool on) {
    fp8_gemm_in_linear_ = on;
    fp8_.set_batch_invariant(on);
  }
  void set_fp8_wgmma(bool on) { fp8_.set_wgmma(on); }
  void set_bf16_wgmma(bool on) { bf16_.set_wgmma(on); }
  bool bf16_last_wgmma() const { return bf16_.last_wgmma(); }
  bool bf16_last_f32_in() const { return bf16_.last_f32_in(); }
  bool bf16_last_fp8_weights() const { return bf16_.last_fp8_weights(); }
  OpProfiler& profiler() { return profiler_; }
  void set_step_graphs(bool on) { step_graphs_on_ = on; }
  StepGraphStats step_graph_stats() const { return step_graphs_.stats(); }
  void set_step_segment_timing(bool on) { step_graphs_.set_timing(on); }
  std::vector<StepSegmentTime> step_segment_times() { return step_graphs_.take_times(); }
  void set_kernel_trace(bool on) { step_graphs_.set_kernel_trace(on); }
  std::vector<KernelTraceLaunch> kernel_trace() { return step_graphs_.take_kernel_trace(); }
  bool last_linear_vectorized() const { return last_linear_ == LinearPath::kVectorized; }
  bool last_linear_tensor_cores() const { return last_linear_ == LinearPath::kTensorCores; }
};

CudaBackend& cuda_backend(Backend& b) {
  auto* cb = dynamic_cast<CudaBackend*>(&b);
  SPARROW_CHECK(cb != nullptr && "not a CUDA backend");
  return *cb;
}

}  // namespace

std::vector<float> state_entries(SequenceState& state, int64_t layer, CompressorSlot slot) {
  LayerState& l = cuda_state(&state).layer(layer);
  const CompressorBuffer& buf = slot == CompressorSlot::kMain ? l.main : l.indexer;
  std::vector<float> v(buf.count * buf.dim);
  if (v.empty()) return v;
  if (buf.records()) {  // decoded on the device (launch_kv_record_decode)
    const DeviceBuffer out(v.size() * sizeof(float), false);
    launch_kv_record_decode({.rec_in = static_cast<const uint8_t*>(buf.entries_rec.get()), .out = out.f32(),
                             .rows = buf.count, .rec_stride = buf.rec.bytes, .out_stride = buf.dim, .layout = buf.rec});
    launch_check("state_entries records");
    SPARROW_CUDA_CHECK(cudaMemcpy(v.data(), out.get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  SPARROW_CUDA_CHECK(cudaMemcpy(v.data(), buf.entries.get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

int64_t state_entry_bytes(SequenceState& state, int64_t layer) {
  const CompressorBuffer& m = cuda_state(&state).layer(layer).main;
  return static_cast<int64_t>(m.entries.bytes() + m.entries_bf16.bytes() + m.entries_rec.bytes());
}

bool state_keeps_records(SequenceState& state, int64_t layer) {
  LayerState& l = cuda_state(&state).layer(layer);
  return l.ring_form == RingForm::kRecords || l.main.records();
}

std::vector<float> key_sim_rows(const std::vector<float>& rows, int64_t dim, KeyPrecision precision) {
  SPARROW_CHECK(dim > 0 && static_cast<int64_t>(rows.size()) % dim == 0);
  const int64_t n = static_cast<int64_t>(rows.size()) / dim;
  const DeviceBuffer values = upload_vector(rows);
  std::vector<float*> ptrs(n);
  for (int64_t r = 0; r < n; ++r) ptrs[r] = values.f32() + r * dim;
  const DeviceBuffer d_ptrs = upload_vector(ptrs);
  launch_key_sim({.rows = static_cast<float* const*>(d_ptrs.get()), .n = n, .dim = dim, .precision = precision});
  launch_check("key_sim_rows");
  std::vector<float> out(rows.size());
  if (!out.empty())
    SPARROW_CUDA_CHECK(cudaMemcpy(out.data(), values.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<int32_t> indexer_select_rows(const std::vector<float>& scores, const std::vector<int64_t>& visible,
                                         int64_t k) {
  return indexer_select_rows(scores, visible, k, IndexerSelectKernel::kAuto);
}
std::vector<int32_t> indexer_select_rows(const std::vector<float>& scores, const std::vector<int64_t>& visible,
                                         int64_t k, IndexerSelectKernel kernel) {
  const int64_t T = static_cast<int64_t>(visible.size());
  SPARROW_CHECK(T > 0 && k > 0 && static_cast<int64_t>(scores.size()) % T == 0);
  const int64_t C = static_cast<int64_t>(scores.size()) / T;
  for (int64_t v : visible) SPARROW_CHECK(v >= 0 && v <= C);
  const DeviceBuffer d_scores = upload_vector(scores), d_visible = upload_vector(visible);
  const DeviceBuffer d_out = upload_vector(std::vector<int32_t>(T * k, 0x7f7f7f7f));  // (the launch writes every slot)
  launch_indexer_select({.out_indices = static_cast<int32_t*>(d_out.get()), .scores = d_scores.f32(), .q = nullptr,
                         .head_weights = nullptr, .keys = nullptr, .visible = static_cast<const int64_t*>(d_visible.get()),
                         .T = T, .Hi = 0, .di = 0, .k = k, .C = C, .scale = 1.0f, .select = kernel});
  launch_check("indexer_select_rows");
  std::vector<int32_t> out(T * k);
  SPARROW_CUDA_CHECK(cudaMemcpy(out.data(), d_out.get(), out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return out;
}

void fp8_linear_keep_quantised(Backend& backend, bool on) { cuda_backend(backend).fp8().keep_quantised(on); }

std::string fp8_linear_last_path(Backend& backend) {
  const Fp8Linear& f = cuda_backend(backend).fp8();
  switch (f.last_path()) {
    case Fp8GemmPath::kNone: return "none: " + f.last_detail();
    case Fp8GemmPath::kTensorCores: return "tensor cores: " + f.last_detail();
    case Fp8GemmPath::kFallback: return "fallback: " + f.last_detail();
  }
  return "?";
}

void fp8_linear_force_fallback(Backend& backend, bool force) { cuda_backend(backend).fp8().set_force_fallback(force); }

void set_op_profiling(Backend& backend, bool on) { cuda_backend(backend).profiler().set_enabled(on); }

std::vector<OpTime> take_op_profile(Backend& backend) { return cuda_backend(backend).profiler().take(); }
void set_step_graphs(Backend& backend, bool on) { cuda_backend(backend).set_step_graphs(on); }
StepGraphStats step_graph_stats(Backend& backend) { return cuda_backend(backend).step_graph_stats(); }
void set_step_segment_timing(Backend& backend, bool on) { cuda_backend(backend).set_step_segment_timing(on); }
std::vector<StepSegmentTime> step_segment_times(Backend& backend) { return cuda_backend(backend).step_segment_times(); }
bool kernel_trace_compiled() {
#if defined(SPARROW_KERNEL_TRACE) && SPARROW_KERNEL_TRACE
  return true;
#else
  return false;
#endif
}
void set_kernel_trace(Backend& backend, bool on) {
  if (on && !kernel_trace_compiled())
    throw std::runtime_error("kernel trace: this build has no kernel timestamps (configure with -DSPARROW_KERNEL_TRACE=ON)");
  cuda_backend(backend).set_kernel_trace(on);
}
std::vector<KernelTraceLaunch> kernel_trace(Backend& backend) { return cuda_backend(backend).kernel_trace(); }

bool last_linear_vectorized(Backend& backend) { return cuda_backend(backend).last_linear_vectorized(); }
bool last_linear_tensor_cores(Backend& backend) { return cuda_backend(backend).last_linear_tensor_cores(); }

void set_fp8_gemm_in_linear(Backend& backend, bool on) { cuda_backend(backend).set_fp8_gemm_in_linear(on); }
void set_fp8_wgmma(Backend& backend, bool on) { cuda_backend(backend).set_fp8_wgmma(on); }
void set_bf16_wgmma(Backend& backend, bool on) { cuda_backend(backend).set_bf16_wgmma(on); }
bool bf16_linear_last_wgmma(Backend& backend) { return cuda_backend(backend).bf16_last_wgmma(); }
bool bf16_linear_last_f32_in(Backend& backend) { return cuda_backend(backend).bf16_last_f32_in(); }
bool bf16_linear_last_fp8_weights(Backend& backend) { return cuda_backend(backend).bf16_last_fp8_weights(); }
void set_w4a8_experts(Backend& backend, bool on) { cuda_backend(backend).set_w4a8_experts(on); }
void set_w4a8_tiled(Backend& backend, bool on) { cuda_backend(backend).set_w4a8_tiled(on); }
void set_moe_fused_act(Backend& backend, bool on) { cuda_backend(backend).set_moe_fused_act(on); }
void set_moe_x_lazy(Backend& backend, bool on) { cuda_backend(backend).set_moe_x_lazy(on); }
bool last_moe_x_rounded(Backend& backend) { return cuda_backend(backend).last_moe_x_rounded(); }
void set_w4a8_wgmma(Backend& backend, bool on) { cuda_backend(backend).set_w4a8_wgmma(on); }
void set_w4a8_wgmma_split(Backend& backend, int mode) {
  SPARROW_CHECK(mode >= 0 && mode <= 2);
  cuda_backend(backend).set_w4a8_wgmma_split(mode);
}
void set_w4a8_expand(Backend& backend, int mode) {
  SPARROW_CHECK(mode >= 0 && mode <= 2);
  cuda_backend(backend).set_w4a8_expand(mode);
}
bool last_w4a8_expanded(Backend& backend) { return cuda_backend(backend).last_w4a8_expanded(); }
void set_w4a8_wgmma_warpgroups(Backend& backend, int n) {
  SPARROW_CHECK(n == 0 || n == 1 || n == 2 || n == 4);
  cuda_backend(backend).set_w4a8_wgmma_warpgroups(n);
}
bool compressor_keeps_bf16_copies(CompressorSlot slot, KeyPrecision keys, bool round_bf16) {
  static const bool indexer_mma_on = cuda_feature_on("indexer_mma");
  static const bool attn_bf16_on = cuda_feature_on("attn_mma") && cuda_feature_on("attn_bf16_kv");
  if (slot == CompressorSlot::kIndexer) return indexer_mma_on && (keys == KeyPrecision::kBf16 || keys == KeyPrecision::kFp4);
  return attn_bf16_on && round_bf16 && keys != KeyPrecision::kFp8;
}
bool last_indexer_tensor_cores(Backend& backend) { return cuda_backend(backend).last_indexer_mma(); }
bool last_attention_tensor_cores(Backend& backend) { return cuda_backend(backend).last_attention_mma(); }
int64_t last_attention_passes(Backend& backend) { return cuda_backend(backend).last_attention_passes(); }
bool step_capture_allowed() {
  static const bool ok = cuda_feature_on("moe_device_plan") && cuda_feature_on("grouped_moe") && cuda_feature_on("pool") &&
                         cuda_feature_on("async_upload") && !sync_every_launch();
  return ok;
}
void set_attention_scratch_cap(int64_t bytes) {
  SPARROW_CHECK(bytes >= 0);
  g_attention_scratch_cap.store(bytes);
}
bool last_attention_q_fold(Backend& backend) { return cuda_backend(backend).last_attention_q_fold(); }
bool last_attention_o_fold(Backend& backend) { return cuda_backend(backend).last_attention_o_fold(); }
bool last_attention_bf16_kv(Backend& backend) { return cuda_backend(backend).last_attention_bf16_kv(); }
bool last_attention_records(Backend& backend) { return cuda_backend(backend).last_attention_records(); }
void set_kv_records(Backend& backend, bool on) { cuda_backend(backend).set_kv_records(on); }
void set_hc_fused(Backend& backend, bool on) { cuda_backend(backend).set_hc_fused(on); }
void set_parts_in_readers(Backend& backend, bool on) { cuda_backend(backend).set_parts_in_readers(on); }
int64_t parts_left_for_readers(Backend& backend) { return cuda_backend(backend).parts_left_for_readers(); }
int64_t fp8_linear_quantisations(Backend& backend) { return cuda_backend(backend).fp8_linear_quantisations(); }
void fp8_linear_set_quant_in(Backend& backend, bool on) { cuda_backend(backend).fp8().set_quant_in(on); }
bool hc_fused(Backend& backend) { return cuda_backend(backend).hc_fused(); }
bool last_hc_boundary_fused(Backend& backend) { return cuda_backend(backend).last_hc_boundary_fused(); }
bool last_moe_scatter_store(Backend& backend) { return cuda_backend(backend).last_moe_scatter_store(); }
void set_moe_shared_beside(Backend& backend, bool on) { cuda_backend(backend).set_moe_shared_beside(on); }
bool last_moe_shared_beside(Backend& backend) { return cuda_backend(backend).last_moe_shared_beside(); }
bool kv_records(Backend& backend) { return cuda_backend(backend).kv_records(); }
void set_attention_block_heads(Backend& backend, int heads) {
  SPARROW_CHECK(heads == 0 || heads == 16 || heads == 32 || heads == 64);
  cuda_backend(backend).set_attention_block_heads(heads);
}
void set_attention_bf16_kv(Backend& backend, bool on) { cuda_backend(backend).set_attention_bf16_kv(on); }
void set_indexer_mma_tiles(Backend& backend, int tiles) {
  SPARROW_CHECK(tiles >= 0 && tiles <= 8);
  cuda_backend(backend).set_indexer_mma_tiles(tiles);
}
void set_w4a8_small_tiles(Backend& backend, int tiles) {
  SPARROW_CHECK(tiles >= 0 && tiles <= 2);
  cuda_backend(backend).set_w4a8_small_tiles(tiles);
}

ActQuantFp8Rows act_quant_fp8_rows(const void* rows, DType dtype, int64_t n, int64_t K, int64_t rows_pad,
                                   bool w4a8_order) {
  SPARROW_CHECK(dtype == DType::kF32 || dtype == DType::kBF16);
  SPARROW_CHECK(n >= 0 && K > 0 && rows_pad >= n);
  ActQuantFp8Rows r;
  r.rows_pad = rows_pad;
  r.k_pad = (K + kFp8ActBlock - 1) / kFp8ActBlock * kFp8ActBlock;
  const size_t in_bytes = static_cast<size_t>(n * K) * dtype_size(dtype);
  DeviceBuffer in(in_bytes), codes(static_cast<size_t>(rows_pad * r.k_pad)),
      scales(static_cast<size_t>(r.k_pad / kFp8ActBlock * rows_pad) * sizeof(float));
  if (in_bytes > 0) SPARROW_CUDA_CHECK(cudaMemcpy(in.get(), rows, in_bytes, cudaMemcpyHostToDevice));
  launch_act_quant_fp8({.codes = static_cast<uint8_t*>(codes.get()), .scales = scales.f32(), .in = in.get(),
                        .in_dtype = dtype, .rows = n, .K = K, .in_stride = K, .rows_pad = rows_pad, .k_pad = r.k_pad,
                        .w4a8_order = w4a8_order});
  launch_check("act_quant_fp8_rows");
  r.codes.resize(codes.bytes());
  r.scales.resize(scales.bytes() / sizeof(float));
  if (!r.codes.empty())
    SPARROW_CUDA_CHECK(cudaMemcpy(r.codes.data(), codes.get(), codes.bytes(), cudaMemcpyDeviceToHost));
  if (!r.scales.empty())
    SPARROW_CUDA_CHECK(cudaMemcpy(r.scales.data(), scales.get(), scales.bytes(), cudaMemcpyDeviceToHost));
  return r;
}

}  // namespace cuda

Expected<std::unique_ptr<Backend>> make_cuda_backend() {
  // A misspelt switch would change nothing: refused before anything runs.
  if (Status st = cuda::check_feature_names(std::getenv("SPARROW_CUDA_DISABLE"), std::getenv("SPARROW_CUDA_ENABLE")); !st.is_ok())
    return st;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the error so that later runtime calls do not report it again
    return Status::unsupported(std::string("backend 'cuda': no usable CUDA device (") +
                               (err != cudaSuccess ? cudaGetErrorString(err) : "no device found") + ")");
  }
  cudaDeviceProp prop{};
  SPARROW_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0)
    return Status::unsupported("backend 'cuda': this build has code for sm_90a (Hopper) only; GPU 0 is " +
                               std::string(prop.name) + " with compute capability " + std::to_string(prop.major) + "." +
                               std::to_string(prop.minor));
  if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess)
    return Status::unsupported(std::string("backend 'cuda': cannot use GPU 0: ") + cudaGetErrorString(e));
  {
    // Keep freed blocks in the pool (device_alloc).
    cudaMemPool_t pool;
    SPARROW_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    SPARROW_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  return std::unique_ptr<Backend>(std::make_unique<cuda::CudaBackend>());
}

}  // namespace sparrow
