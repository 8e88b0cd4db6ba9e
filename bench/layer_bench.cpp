#include "bench/layer_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_state.h"
#include "backends/cuda/kernels.h"
#include "bench/bench_cuda.h"
#include "bench/device_fill.h"
#include "bench/device_peaks.h"
#include "bench/floors.h"
#include "core/check.h"

namespace sparrow::bench {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Free device memory left untouched by a cell: cuBLAS/driver scratch, fragmentation, the
// backend's per-op cudaMallocs we do not itemise.
constexpr double kMarginBytes = 3.0 * kGiB;
// A cell whose state sets are smaller than this rotates among several copies (L2 is 50-60 MB).
constexpr double kRotateStateBytes = 512.0 * 1024 * 1024;

double alloc_bytes(double b) {
  const double page = 2.0 * 1024 * 1024;
  return b > page / 2 ? std::ceil(b / page) * page : std::ceil(b / 512) * 512;
}

// A copy of the config in which only layer `l` keeps its compressors, so a sequence state holds
// compressed buffers for the timed layer alone (every layer still gets its window ring).
ModelConfig state_config(const ModelConfig& c, int64_t l) {
  ModelConfig s = c;
  for (int64_t j = 0; j < c.num_layers; ++j)
    if (j != l) {
      s.attention[j] = AttentionKind::kSliding;
      s.compress_ratio[j] = 0;
    }
  return s;
}

// Device bytes of one sequence's state for layer l after `entries` compressed entries (+1 spare).
double sequence_bytes(const ModelConfig& c, int64_t l, int64_t entries) {
  // (fp32 rings and their bf16 copies, which the CUDA backend keeps for the tensor-core attention)
  double b = c.num_layers * (alloc_bytes(static_cast<double>(c.sliding_window) * c.head_dim * 4) +
                             alloc_bytes(static_cast<double>(c.sliding_window) * c.head_dim * 2));
  const int64_t m = c.compress_ratio[l];
  auto compressor = [&](int64_t dim, bool overlap) {
    const double width = overlap ? 2.0 * dim : dim;
    double x = 2 * alloc_bytes(m * width * 4) + alloc_bytes(std::max<int64_t>(entries + 1, 16) * dim * 4.0);
    if (overlap) x += 2 * alloc_bytes(m * dim * 4.0);
    return x;
  };
  // (+ the bf16 copies of the compressed KV and of the indexer keys, which the CUDA backend keeps for
  // its tensor-core attention and scorer)
  const double copy = alloc_bytes(std::max<int64_t>(entries + 1, 16) * c.head_dim * 2.0);
  if (c.attention[l] == AttentionKind::kCsa)
    b += compressor(c.head_dim, true) + compressor(c.index_head_dim, true) + copy +
         alloc_bytes(std::max<int64_t>(entries + 1, 16) * c.index_head_dim * 2.0);
  if (c.attention[l] == AttentionKind::kHca) b += compressor(c.head_dim, false) + copy;
  return b;
}

// Device bytes of the activations and per-op scratch of one forward of layer l over T tokens
// whose queries see `visible` compressed entries: every buffer model.cpp and the CUDA backend
// allocate, generously (fp32).
double activation_bytes(const ModelConfig& c, int64_t l, int64_t T, int64_t visible) {
  const double D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, S = c.hc_mult, F = c.moe_intermediate;
  const double K = c.experts_per_token, Hi = c.index_heads, di = c.index_head_dim;
  double keys = c.sliding_window;
  if (c.attention[l] == AttentionKind::kCsa) keys += c.index_topk;
  if (c.attention[l] == AttentionKind::kHca) keys += visible;
  const double per_token = 8 * S * D + c.q_lora_rank + 4 * H * Dh + 6 * Dh + 5 * di + Hi * di + Hi + c.index_topk +
                           c.o_groups * c.o_lora_rank + H * keys + visible + (K + 3) * D + 4 * F * (K + 1) +
                           c.num_experts;
  return T * per_token * 4 + 256.0 * 1024 * 1024;
}

double free_device_bytes() {
  cuda::trim_device_pool();  // the backend's cached blocks count as free here
  size_t free = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free, &total));
  return static_cast<double>(free);
}

std::string fits_or_reason(double need, const char* what) {
  const double free = free_device_bytes();
  if (need + kMarginBytes <= free) return {};
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s needs %.1f GiB of device memory, %.1f GiB free (%.0f GiB kept as margin)", what,
                need / kGiB, free / kGiB, kMarginBytes / kGiB);
  return buf;
}

void set_counters(cuda::CompressorBuffer& buf, int64_t context) {
  buf.count = context / buf.ratio;
  buf.pending = context % buf.ratio;
  buf.has_prev = buf.overlap && buf.count > 0;
  if (buf.entries_bf16.get()) buf.mirrored = buf.count;
}

// Counters of layer l as if `context` tokens had been absorbed.
void reset_layer(cuda::LayerState& s, const ModelConfig& c, int64_t l, int64_t context) {
  if (c.attention[l] == AttentionKind::kSliding) return;
  set_counters(s.main, context);
  if (c.attention[l] == AttentionKind::kCsa) set_counters(s.indexer, context);
}

// `rows` random rows of l.dim values encoded as FP8 KV records at `rec` (l.bytes apart).
void fill_records(uint8_t* rec, const KvRecordLayout& l, int64_t rows, uint64_t seed) {
  const cuda::DeviceBuffer values(static_cast<size_t>(rows * l.dim) * sizeof(float), false);
  device_fill_normal(values.f32(), rows * l.dim, seed, 1.0f);
  cuda::launch_kv_record_encode(
      {.in = values.f32(), .rec = rec, .rows = rows, .in_stride = l.dim, .rec_stride = l.bytes, .layout = l});
}

// bf16_copy: also the keys' bf16 copy the CUDA backend's compressor keeps for the tensor-core
// scorer (CompressorBuffer::entries_bf16), as it would hold after `context` tokens. rec.bytes > 0:
// the entries as FP8 KV records only (CompressorBuffer::entries_rec), as the compressor keeps the
// compressed KV under the fast profiles.
void fill_compressor(cuda::CompressorBuffer& buf, int64_t context, uint64_t seed, bool bf16_copy = false,
                     const KvRecordLayout& rec = {}) {
  // Capacity first (reserve copies the `count` entries it holds), then the counters; one entry
  // more for the one this step may emit: no growth while timing.
  buf.count = 0;
  buf.mirrored = 0;
  buf.rec = rec;
  if (bf16_copy && !buf.records())
    buf.entries_bf16 = cuda::DeviceBuffer(std::max<int64_t>(buf.capacity, 1) * buf.dim * sizeof(uint16_t));
  buf.reserve(context / buf.ratio + 1);
  set_counters(buf, context);
  const int64_t width = buf.overlap ? 2 * buf.dim : buf.dim;
  if (buf.records()) {
    fill_records(static_cast<uint8_t*>(buf.entries_rec.get()), buf.rec, buf.count + 1, seed + 1);
  } else {
    device_fill_normal(buf.entries.f32(), (buf.count + 1) * buf.dim, seed + 1, 1.0f);
    if (bf16_copy)
      cuda::launch_f32_to_bf16(buf.entries.f32(), static_cast<uint16_t*>(buf.entries_bf16.get()), (buf.count + 1) * buf.dim);
  }
  device_fill_normal(buf.pending_kv.f32(), buf.ratio * width, seed + 2, 1.0f);
  device_fill_normal(buf.pending_gate.f32(), buf.ratio * width, seed + 3, 1.0f);
  if (buf.overlap) {
    device_fill_normal(buf.prev_kv.f32(), buf.ratio * buf.dim, seed + 4, 1.0f);
    device_fill_normal(buf.prev_gate.f32(), buf.ratio * buf.dim, seed + 5, 1.0f);
  }
}

// Whether the CUDA backend's compressor keeps bf16 copies of the indexer keys / the compressed KV
// for this model, as it does when it emits them (every profile but fp32 rounds to bf16).
bool keys_bf16_copy(const Model& model) {
  return cuda::compressor_keeps_bf16_copies(CompressorSlot::kIndexer, model.index_keys(),
                                            model.precision() != Precision::kFp32);
}
bool kv_bf16_copy(const Model& model) {
  return cuda::compressor_keeps_bf16_copies(CompressorSlot::kMain, KeyPrecision::kF32, model.precision() != Precision::kFp32);
}
// Whether the CUDA backend stores this model's window and compressed KV as FP8 KV records: when it
// keeps records (cuda::kv_records) under the profiles that round the KV to them; the state made with
// it says whether the layout allows (LayerState::rec).
bool kv_records(const Model& model, Backend& backend) {
  return model.precision() != Precision::kFp32 && cuda::kv_records(backend);
}

// The state of layer l after `context` tokens, random contents (see layer_bench.h).
std::unique_ptr<cuda::CudaSequenceState> make_filled_state(const ModelConfig& sc, int64_t l, int64_t context,
                                                            uint64_t seed, bool index_keys_bf16, bool kv_bf16,
                                                            bool records) {
  auto st = std::make_unique<cuda::CudaSequenceState>(sc, records);
  cuda::LayerState& s = st->layer(l);
  const KvRecordLayout rec = s.rec;
  if (rec.bytes > 0) {  // the ring as records only (RingForm::kRecords)
    fill_records(static_cast<uint8_t*>(s.ring_rec.get()), rec, sc.sliding_window, seed);
    s.ring_form = cuda::RingForm::kRecords;
  } else {
    device_fill_normal(s.ring.f32(), sc.sliding_window * sc.head_dim, seed, 1.0f);
    if (s.ring_bf16.get())  // the ring's bf16 copy, written with it
      cuda::launch_f32_to_bf16(s.ring.f32(), static_cast<uint16_t*>(s.ring_bf16.get()), sc.sliding_window * sc.head_dim);
  }
  if (sc.attention[l] != AttentionKind::kSliding) fill_compressor(s.main, context, seed + 16, kv_bf16, rec);
  if (sc.attention[l] == AttentionKind::kCsa) fill_compressor(s.indexer, context, seed + 32, index_keys_bf16);
  st->advance(context);
  return st;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(pick(rng));
  return ids;
}

// One step timed by a pair of events. With spin_ms > 0 the step is queued behind a spin kernel
// (device_spin) that long: the host enqueues it while the GPU spins, and `queued` says whether the
// enqueue, counted from the spin's launch, ended within 90 % of the spin (else the GPU may have
// caught up with the host). gpu_ms is the step's (the events bracket the step, not the spin),
// host_ms the host's time in the step call (from the spin's launch when there is one).
struct StepTime {
  double gpu_ms = 0, host_ms = 0;
  bool queued = false;
};
class StepTimer {
 public:
  StepTimer() {
    BENCH_CUDA(cudaEventCreate(&start_));
    BENCH_CUDA(cudaEventCreate(&stop_));
  }
  ~StepTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;
  template <class Step>
  StepTime time(Step step, double spin_ms = 0) {
    StepTime t;
    std::chrono::steady_clock::time_point h0;
    if (spin_ms > 0) {
      h0 = std::chrono::steady_clock::now();
      device_spin(static_cast<uint64_t>(spin_ms * 1e6));
      BENCH_CUDA(cudaEventRecord(start_));
    } else {
      BENCH_CUDA(cudaEventRecord(start_));
      h0 = std::chrono::steady_clock::now();
    }
    step();
    t.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
    BENCH_CUDA(cudaEventRecord(stop_));
    BENCH_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    t.gpu_ms = ms;
    t.queued = spin_ms > 0 && t.host_ms < 0.9 * spin_ms;
    return t;
  }

 private:
  cudaEvent_t start_, stop_;
};

// Times `step` with events: warm-up, then repetitions until min_reps and target_s (or max_reps).
// `step(i)` runs step i; `before(i)` runs untimed before it (restores, resets).
// With `queued`, then up to 10 more steps each queued behind a spin kernel of three times the
// host's median enqueue time, at least 1 ms (CellTiming::queued_median_ms; a step whose enqueue
// outlasted it is not counted).
template <class Before, class Step, class After>
void time_steps(const TimingOptions& o, Before before, Step step, After after, CellTiming& out, bool queued = false) {
  StepTimer timer;
  std::vector<double> host_times;
  auto one = [&](int i, double spin_ms) {
    before(i);
    const StepTime t = timer.time([&] { step(i); }, spin_ms);
    after(i);
    return t;
  };
  int i = 0;
  for (int w = 0; w < o.warmup; ++w) {
    const double ms = one(i++, 0).gpu_ms;
    if (ms * 1e-3 > o.target_s) break;  // a slow step: one warm-up is enough
  }
  std::vector<double> times;
  double total_s = 0;
  while (static_cast<int>(times.size()) < o.max_reps &&
         (static_cast<int>(times.size()) < o.min_reps || total_s < o.target_s)) {
    const StepTime t = one(i++, 0);
    times.push_back(t.gpu_ms);
    host_times.push_back(t.host_ms);
    total_s += t.gpu_ms * 1e-3;
  }
  out.ok = true;
  out.reps = static_cast<int>(times.size());
  out.median_ms = median_of(times);
  out.host_median_ms = median_of(host_times);
  out.min_ms = *std::min_element(times.begin(), times.end());
  out.max_ms = *std::max_element(times.begin(), times.end());
  if (queued) {
    const double spin_ms = std::max(1.0, 3.0 * out.host_median_ms);
    std::vector<double> queued_times;
    const int n = std::min<int>(static_cast<int>(times.size()), 10);
    for (int q = 0; q < n; ++q)
      if (const StepTime t = one(i++, spin_ms); t.queued) queued_times.push_back(t.gpu_ms);
    out.queued_reps = static_cast<int>(queued_times.size());
    out.queued_median_ms = queued_times.empty() ? -1 : median_of(queued_times);
  }
}

}  // namespace

double LayerBench::layer_weight_bytes(const ModelConfig& c, int64_t l) {
  // Every expert and every ape row: the stored tensors the backend uploads, plus the whole
  // tid2eid table of a hash layer ([V, K] int64) instead of the rows a step reads.
  const StepFloor f = decode_floor(c, l, int64_t{1} << 20, 0, floor_options_for(c));
  const double router = c.num_experts * c.hidden_size * 2.0 +
                        (c.moe[l] == MoeKind::kScored ? c.num_experts * 4.0 : c.vocab_size * c.experts_per_token * 8.0);
  return f.bytes.weights() - f.bytes.router_weights + router;
}

Expected<double> LayerBench::warm(int64_t l, int64_t tokens, uint64_t seed) {
  const ModelConfig& c = model_.config();
  const ModelConfig sc = state_config(c, l);
  const int64_t m = std::max<int64_t>(c.compress_ratio[l], 1);
  const double need = layer_weight_bytes(c, l) + sequence_bytes(c, l, tokens / m) + activation_bytes(c, l, tokens, tokens / m);
  if (std::string why = fits_or_reason(need, "holding the layer's weights and a warm-up forward"); !why.empty())
    return Status::unsupported(why);
  const auto t0 = std::chrono::steady_clock::now();
  auto state = std::make_unique<cuda::CudaSequenceState>(sc, cuda::kv_records(backend_));
  BatchInfo batch;
  batch.token_ids = random_ids(tokens, c.vocab_size, seed);
  batch.positions.resize(tokens);
  for (int64_t t = 0; t < tokens; ++t) batch.positions[t] = t;
  batch.seq_of_token.assign(tokens, 0);
  batch.seqs = {state.get()};
  batch.seq_begin = {0};
  batch.seq_end = {tokens};
  Tensor streams = backend_.alloc(ElemType::kF32, {tokens, c.hc_mult, c.hidden_size});
  device_fill_normal(streams.f32(), streams.numel(), seed, 1.0f);
  model_.forward_layer(backend_, batch, l, streams);
  BENCH_CUDA(cudaDeviceSynchronize());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// TimingOptions::breakdown: one more step, untimed, with per-op profiling; with spin_ms > 0 queued
// behind a spin kernel as StepTimer does it.
template <class Before, class Step, class After>
void profile_step(Backend& backend, Before before, Step step, After after, CellTiming& out, double spin_ms = 0) {
  before(0);
  BENCH_CUDA(cudaDeviceSynchronize());
  cuda::set_op_profiling(backend, true);
  StepTimer timer;
  const auto t0 = std::chrono::steady_clock::now();
  const StepTime t = timer.time([&] { step(0); }, spin_ms);
  BENCH_CUDA(cudaDeviceSynchronize());
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // With a spin: the step's GPU time (it holds waits for the host unless queued); without one, the
  // wall time.
  out.breakdown_queued = t.queued;
  out.breakdown_step_ms = spin_ms > 0 ? t.gpu_ms : wall_ms;
  cuda::set_op_profiling(backend, false);
  out.breakdown = cuda::take_op_profile(backend);
  after(0);
}

CellTiming LayerBench::decode(int64_t l, int64_t B, int64_t C, const TimingOptions& o) {
  const ModelConfig& c = model_.config();
  const ModelConfig sc = state_config(c, l);
  CellTiming out;
  const int64_t m = c.compress_ratio[l];
  const int64_t entries = m > 0 ? C / m : 0;
  const double set_bytes = B * sequence_bytes(c, l, entries);
  const int inputs = std::max(1, o.input_sets);
  out.state_sets = static_cast<int>(std::clamp<double>(std::floor(kRotateStateBytes / set_bytes), 1, inputs));
  out.state_bytes = out.state_sets * set_bytes;
  const double stream_bytes = static_cast<double>(B) * c.hc_mult * c.hidden_size * 4;
  const double need = out.state_bytes + (inputs + 1) * stream_bytes + activation_bytes(c, l, B, entries + 1);
  if (std::string why = fits_or_reason(need, "the fp32 state and activations"); !why.empty()) {
    out.skipped = why;
    return out;
  }

  // states[s][b]: set s, sequence b.
  std::vector<std::vector<std::unique_ptr<cuda::CudaSequenceState>>> states(out.state_sets);
  for (int s = 0; s < out.state_sets; ++s)
    for (int64_t b = 0; b < B; ++b)
      states[s].push_back(make_filled_state(sc, l, C, o.seed * 1000003 + s * 7919 + b * 104729, keys_bf16_copy(model_),
                                            kv_bf16_copy(model_), kv_records(model_, backend_)));
  std::vector<std::vector<int32_t>> ids(inputs);
  std::vector<Tensor> pristine(inputs);
  for (int r = 0; r < inputs; ++r) {
    ids[r] = random_ids(B, c.vocab_size, o.seed * 31 + r);
    pristine[r] = backend_.alloc(ElemType::kF32, {B, c.hc_mult, c.hidden_size});
    device_fill_normal(pristine[r].f32(), pristine[r].numel(), o.seed * 131 + r, 1.0f);
  }
  Tensor streams = backend_.alloc(ElemType::kF32, {B, c.hc_mult, c.hidden_size});
  BENCH_CUDA(cudaDeviceSynchronize());

  auto batch_for = [&](int i) {
    BatchInfo batch;
    const int s = i % out.state_sets, r = i % inputs;
    batch.token_ids = ids[r];
    batch.positions.assign(B, C);
    for (int64_t b = 0; b < B; ++b) {
      batch.seq_of_token.push_back(static_cast<int32_t>(b));
      batch.seqs.push_back(states[s][b].get());
      batch.seq_begin.push_back(b);
      batch.seq_end.push_back(b + 1);
    }
    return batch;
  };
  auto restore = [&](int i) {
    BENCH_CUDA(cudaMemcpyAsync(streams.f32(), pristine[i % inputs].f32(), static_cast<size_t>(stream_bytes),
                               cudaMemcpyDeviceToDevice, 0));
  };
  auto reset = [&](int i) {
    for (auto& st : states[i % out.state_sets]) reset_layer(st->layer(l), c, l, C);
  };

  // One untimed step with a tap on the router's choice: how many distinct experts a step touches.
  {
    std::vector<int32_t> experts;
    const std::string want = "L" + std::to_string(l) + ".moe.router.experts";
    const TapFn tap = [&](const std::string& name, const Tensor& t) {
      if (name == want) experts = backend_.download_i32(t);
    };
    ForwardOptions fo;
    fo.tap = &tap;
    restore(0);
    const BatchInfo batch = batch_for(0);
    model_.forward_layer(backend_, batch, l, streams, fo);
    BENCH_CUDA(cudaDeviceSynchronize());
    reset(0);
    out.experts_touched = static_cast<double>(std::set<int32_t>(experts.begin(), experts.end()).size());
  }

  BatchInfo batch;
  time_steps(
      o,
      [&](int i) {
        restore(i);
        batch = batch_for(i);
      },
      [&](int) { decode_step(batch, l, streams, o.graphs); }, reset, out, /*queued=*/true);
  if (o.breakdown && out.ok)
    profile_step(
        backend_,
        [&](int i) {
          restore(i);
          batch = batch_for(i);
        },
        [&](int) { decode_step(batch, l, streams, o.graphs); }, reset, out,
        /*spin_ms=*/std::max(1.0, 4.0 * out.host_median_ms));  // (profiling adds host time)
  return out;
}

CellTiming LayerBench::prefill(int64_t l, int64_t N, const TimingOptions& o) {
  const ModelConfig& c = model_.config();
  const ModelConfig sc = state_config(c, l);
  CellTiming out;
  const int64_t m = c.compress_ratio[l];
  const int64_t entries = m > 0 ? N / m : 0;
  const double stream_bytes = static_cast<double>(N) * c.hc_mult * c.hidden_size * 4;
  out.state_sets = 1;
  out.state_bytes = sequence_bytes(c, l, entries);
  const double need = out.state_bytes + 2 * stream_bytes + activation_bytes(c, l, N, entries);
  if (std::string why = fits_or_reason(need, "the prefill's state and activations"); !why.empty()) {
    out.skipped = why;
    return out;
  }
  Tensor pristine = backend_.alloc(ElemType::kF32, {N, c.hc_mult, c.hidden_size});
  Tensor streams = backend_.alloc(ElemType::kF32, {N, c.hc_mult, c.hidden_size});
  device_fill_normal(pristine.f32(), pristine.numel(), o.seed * 977, 1.0f);
  BatchInfo batch;
  batch.token_ids = random_ids(N, c.vocab_size, o.seed * 37);
  batch.positions.resize(N);
  for (int64_t t = 0; t < N; ++t) batch.positions[t] = t;
  batch.seq_of_token.assign(N, 0);
  batch.seq_begin = {0};
  batch.seq_end = {N};
  std::unique_ptr<cuda::CudaSequenceState> state;
  time_steps(
      o,
      [&](int) {
        state = std::make_unique<cuda::CudaSequenceState>(sc, cuda::kv_records(backend_));  // a fresh sequence per step
        batch.seqs = {state.get()};
        BENCH_CUDA(cudaMemcpyAsync(streams.f32(), pristine.f32(), static_cast<size_t>(stream_bytes),
                                   cudaMemcpyDeviceToDevice, 0));
      },
      [&](int) { model_.forward_layer(backend_, batch, l, streams); }, [&](int) { state.reset(); }, out);
  if (o.breakdown && out.ok)
    profile_step(
        backend_,
        [&](int) {
          state = std::make_unique<cuda::CudaSequenceState>(sc, cuda::kv_records(backend_));
          batch.seqs = {state.get()};
          BENCH_CUDA(cudaMemcpyAsync(streams.f32(), pristine.f32(), static_cast<size_t>(stream_bytes),
                                     cudaMemcpyDeviceToDevice, 0));
        },
        [&](int) { model_.forward_layer(backend_, batch, l, streams); }, [&](int) { state.reset(); }, out);
  return out;
}

}  // namespace sparrow::bench
