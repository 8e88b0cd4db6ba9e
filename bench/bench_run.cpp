// The `sparrow bench` driver: device check, peaks, per-layer cells, the JSON report (rewritten
// after every cell, so a run cut short keeps what it measured) and the stdout table.
#include "bench/bench_run.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "runtime/backend_factory.h"
#include "runtime/session.h"

namespace sparrow::bench {

using nlohmann::json;

std::string card_slug(const std::string& name) {
  std::string s;
  for (char ch : name) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (std::isalnum(u)) s += static_cast<char>(std::tolower(u));
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s.empty() ? "unknown-gpu" : s;
}

Expected<std::vector<int64_t>> parse_sizes(const std::string& list, const std::string& flag) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
    const std::string original = item;
    int64_t mult = 1;
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) {
      mult = 1024;
      item.pop_back();
    }
    if (item.empty() || item.size() > 12 || !std::all_of(item.begin(), item.end(), ::isdigit))
      return Status::invalid_argument(flag + ": '" + original + "' is not a size (like 8, 4k or 131072)");
    const int64_t v = std::stoll(item) * mult;
    if (v < 1) return Status::invalid_argument(flag + ": sizes must be at least 1, got '" + original + "'");
    out.push_back(v);
  }
  return out;
}

Expected<std::vector<int64_t>> parse_layers(const std::string& list) {
  std::vector<int64_t> out;
  if (list.empty() || list == "all") return out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
    const size_t dash = item.find('-');
    const std::string a = item.substr(0, dash), b = dash == std::string::npos ? a : item.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 6 && std::all_of(s.begin(), s.end(), ::isdigit);
    };
    if (!digits(a) || !digits(b) || std::stoll(b) < std::stoll(a))
      return Status::invalid_argument("--layers: '" + item + "' is not a layer index or range (like 0-7 or 2,3)");
    for (int64_t l = std::stoll(a); l <= std::stoll(b); ++l) out.push_back(l);
  }
  return out;
}

#ifndef SPARROW_BENCH_HAS_CUDA

Status run_bench(const BenchOptions&) {
  return Status::unsupported("sparrow bench: no usable CUDA device (this build has no CUDA backend)");
}

#else

}  // namespace sparrow::bench

#include "backends/cuda/cuda_backend.h"
#include "bench/device_fill.h"

namespace sparrow::bench {

namespace {

// H100/H200 SXM dense tensor-core rates from NVIDIA's datasheet: used only when cuBLASLt could not
// be measured, and the report says so.
constexpr double kDatasheetBf16 = 989.4e12;
constexpr double kDatasheetFp8 = 1978.9e12;

const char* attention_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kSliding: return "swa";
    case AttentionKind::kCsa: return "csa";
    case AttentionKind::kHca: return "hca";
  }
  return "?";
}

const char* moe_name(MoeKind k) { return k == MoeKind::kHash ? "hash" : "scored"; }

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

// The ops' GPU and host milliseconds summed, parts left out (they are inside their op's time).
std::pair<double, double> op_sums(const std::vector<cuda::OpTime>& ops) {
  double gpu = 0, host = 0;
  for (const cuda::OpTime& op : ops) {
    if (op.part) continue;
    gpu += op.gpu_ms;
    host += op.host_ms;
  }
  return {gpu, host};
}

// The top of a cell's per-op profile (TimingOptions::breakdown), under its row.
void print_breakdown(const CellTiming& t) {
  if (t.breakdown.empty()) return;
  const auto [gpu, host] = op_sums(t.breakdown);
  std::printf("         profiled step %.3f ms%s: ops %.3f ms on the GPU, %.3f ms in the host calls\n", t.breakdown_step_ms,
              t.breakdown_queued ? " (queued ahead: GPU time)" : "", gpu, host);
  const size_t shown = std::min<size_t>(t.breakdown.size(), 16);
  for (size_t i = 0; i < shown; ++i) {
    const cuda::OpTime& op = t.breakdown[i];
    std::printf("         %-34s %5lld calls %9.3f ms gpu %9.3f ms host\n", op.op.c_str(), static_cast<long long>(op.calls),
                op.gpu_ms, op.host_ms);
  }
}

json figure_json(const PeakFigure& f) {
  json j = {{"ok", f.ok}, {"method", f.method}};
  if (f.ok) {
    j["value"] = f.value;
    j["median_ms"] = f.median_ms;
    j["shape"] = f.shape;
    j["all_values"] = f.all_values;
  }
  if (!f.note.empty()) j["note"] = f.note;
  return j;
}

json bytes_json(const StepBytes& b) {
  return {{"attn_weights", b.attn_weights},     {"extra_weights", b.extra_weights},
          {"router_weights", b.router_weights}, {"routed_experts", b.routed_experts},
          {"shared_expert", b.shared_expert},   {"norms_mhc", b.norms_mhc},
          {"kv_window", b.kv_window},           {"kv_compressed", b.kv_compressed},
          {"index_keys", b.index_keys},         {"state_writes", b.state_writes},
          {"activations", b.activations},       {"weights", b.weights()},
          {"total", b.total()}};
}

json flops_json(const StepFlops& f) {
  return {{"gemm_fp8", f.gemm_fp8}, {"gemm_bf16", f.gemm_bf16}, {"attention", f.attention},
          {"indexer", f.indexer},   {"total", f.total()}};
}

json floor_json(const StepFloor& f, const FloorTime& t) {
  return {{"bytes", f.bytes.total()},
          {"flops", f.flops.total()},
          {"bytes_items", bytes_json(f.bytes)},
          {"flops_items", flops_json(f.flops)},
          {"memory_ms", t.memory_s * 1e3},
          {"compute_ms", t.compute_s * 1e3},
          {"floor_ms", t.floor_s * 1e3},
          {"bound", t.memory_bound ? "memory" : "compute"},
          {"experts_touched_expected", f.experts_touched},
          {"attended_keys", f.attended_keys},
          {"scored_entries", f.scored_entries}};
}

std::string human_size(int64_t n) {
  if (n % 1024 == 0) return std::to_string(n / 1024) + "k";
  return std::to_string(n);
}

// Layers in an order that measures each distinct (attention, MoE) kind first, so a run cut short
// by the time budget still covers every kind.
std::vector<int64_t> priority_order(const ModelConfig& c, const std::vector<int64_t>& layers) {
  std::vector<int64_t> first, rest;
  std::set<std::pair<int, int>> seen;
  for (int64_t l : layers) {
    const auto kind = std::make_pair(static_cast<int>(c.attention[l]), static_cast<int>(c.moe[l]));
    (seen.insert(kind).second ? first : rest).push_back(l);
  }
  first.insert(first.end(), rest.begin(), rest.end());
  return first;
}

class Report {
 public:
  explicit Report(std::string path) : path_(std::move(path)) {}
  json& root() { return root_; }
  // Whole file rewritten through a temporary: a crash leaves the last complete report.
  Status write() {
    std::error_code ec;
    const std::filesystem::path p(path_);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream f(tmp);
      if (!f) return Status::io_error("cannot write " + tmp);
      f << root_.dump(2) << "\n";
      if (!f) return Status::io_error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, p, ec);
    if (ec) return Status::io_error("cannot rename " + tmp + " to " + path_ + ": " + ec.message());
    return Status::ok();
  }

 private:
  std::string path_;
  json root_;
};

// The FP8 GEMM section: linear_fp8_block (activation quantisation, then the block-scaled FP8 GEMM:
// the project's TMA kernel, or cuBLASLt's; docs/cuda.md) on the model's own FP8 matrices at M tokens,
// each time the median of 5 after 2 warm-ups, next to the measured FP8 peaks (issue 6 target: >= 70%
// of the FP8 peak at prefill sizes); and the GEMM alone, the same calls reusing the input's
// quantisation (cuda::fp8_linear_keep_quantised: the codes of one quantising call). Matrices that
// are not 128x128 FP8 are skipped (they take the fallback).
json fp8_gemm_section(Backend& backend, const Model& model, const std::vector<int64_t>& layers, int64_t M,
                      const Peaks& used, const DevicePeaks& peaks) {
  json out = json::array();
  if (M <= 0 || layers.empty()) return out;
  const ModelConfig& c = model.config();
  int64_t csa = -1;
  for (int64_t l : layers)
    if (c.attention[l] == AttentionKind::kCsa) {
      csa = l;
      break;
    }
  const LayerWeights& L0 = model.weights().layers[layers[0]];
  std::vector<std::pair<std::string, const WeightMatrix*>> mats = {
      {"wq_a", &L0.wq_a}, {"wq_b", &L0.wq_b}, {"wkv", &L0.wkv}, {"wo_b", &L0.wo_b},
      {"shared.w1", &L0.shared.w1}, {"shared.w2", &L0.shared.w2}};
  if (csa >= 0) mats.push_back({"index_wq_b", &model.weights().layers[csa].index_wq_b});
  std::printf("\nFP8 GEMMs at M = %lld (linear_fp8_block: activation quantisation + block-scaled GEMM; gemm/fp8: the GEMM alone)\n",
              static_cast<long long>(M));
  std::printf("%-12s %7s %7s %10s %10s %8s %8s %8s  %s\n", "matrix", "N", "K", "time ms", "TFLOP/s", "/fp8", "/fp8-blk",
              "gemm/fp8", "path");
  for (const auto& [name, w] : mats) {
    json g = {{"matrix", name}, {"M", M}, {"N", w->out}, {"K", w->in}};
    if (w->format != WeightFormat::kFp8Block || w->block_out != 128 || w->block_in != 128) {
      g["status"] = "skipped: not a 128x128 FP8 matrix";
      out.push_back(g);
      continue;
    }
    Tensor x = backend.alloc(ElemType::kF32, {M, w->in});
    Tensor y = backend.alloc(ElemType::kF32, {M, w->out});
    device_fill_normal(x.f32(), x.numel(), 17, 1.0f);
    const auto time_linear = [&] {
      return time_events(
          [&](int) {
            backend.linear_fp8_block({.out = y, .in = x, .weight = w});
            return Status::ok();
          },
          /*warmup=*/2, /*reps=*/5);
    };
    auto ms = time_linear();
    if (!ms.is_ok()) {
      g["status"] = "failed: " + ms.status().to_string();
      out.push_back(g);
      continue;
    }
    const double med = median_of(*ms);
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(w->out) * static_cast<double>(w->in);
    const double rate = flops / (med * 1e-3);
    const std::string path = cuda::fp8_linear_last_path(backend);
    g["status"] = "ok";
    g["time_ms"] = med;
    g["flops_per_s"] = rate;
    g["ratio_fp8_peak"] = rate / used.fp8_flops_per_s;
    if (peaks.fp8_gemm_block.ok) g["ratio_fp8_block_peak"] = rate / peaks.fp8_gemm_block.value;
    g["path"] = path;
    // The GEMM alone: the first call (a warm-up) quantises x and keeps its codes, the rest reuse them.
    cuda::fp8_linear_keep_quantised(backend, true);
    auto gemm_ms = time_linear();
    cuda::fp8_linear_keep_quantised(backend, false);
    double gemm_rate = 0.0;
    if (gemm_ms.is_ok()) {
      gemm_rate = flops / (median_of(*gemm_ms) * 1e-3);
      g["gemm_time_ms"] = median_of(*gemm_ms);
      g["gemm_flops_per_s"] = gemm_rate;
      g["gemm_ratio_fp8_peak"] = gemm_rate / used.fp8_flops_per_s;
    }
    std::printf("%-12s %7lld %7lld %10.3f %10.1f %8.2f %8.2f %8.2f  %s\n", name.c_str(), static_cast<long long>(w->out),
                static_cast<long long>(w->in), med, rate * 1e-12, rate / used.fp8_flops_per_s,
                peaks.fp8_gemm_block.ok ? rate / peaks.fp8_gemm_block.value : 0.0, gemm_rate / used.fp8_flops_per_s,
                path.c_str());
    out.push_back(g);
  }
  std::fflush(stdout);
  return out;
}

void print_peaks(const DevicePeaks& p, const Peaks& used, const json& sources) {
  std::printf("HBM copy         %8.0f GB/s   (%s; memcpy %.0f, kernel %.0f GB/s)\n", used.hbm_bytes_per_s * 1e-9,
              p.hbm.shape.c_str(), p.hbm_memcpy.value * 1e-9, p.hbm_kernel.value * 1e-9);
  auto line = [](const char* name, const PeakFigure& f) {
    if (f.ok) std::printf("%-16s %8.1f TFLOP/s (%s)\n", name, f.value * 1e-12, f.shape.c_str());
    else std::printf("%-16s %s\n", name, f.note.c_str());
  };
  line("bf16 GEMM", p.bf16_gemm);
  line("fp8 GEMM", p.fp8_gemm);
  line("fp8 GEMM 128-blk", p.fp8_gemm_block);
  std::printf("floors use: %.0f GB/s, bf16 %.1f TFLOP/s (%s), fp8 %.1f TFLOP/s (%s)\n", used.hbm_bytes_per_s * 1e-9,
              used.bf16_flops_per_s * 1e-12, sources["bf16"].get<std::string>().c_str(), used.fp8_flops_per_s * 1e-12,
              sources["fp8"].get<std::string>().c_str());
}

}  // namespace

Status run_bench(const BenchOptions& o) {
  if (o.backend != "cuda") return Status::invalid_argument("--backend: only cuda is benchmarked, got '" + o.backend + "'");
  const std::optional<Precision> precision = precision_from_name(o.precision);
  if (!precision)
    return Status::invalid_argument("--precision: '" + o.precision + "' (choose fp32, deepseek-ref or fast)");
  if (!o.peaks_only && o.model_dir.empty()) return Status::invalid_argument("--model DIR is required (or --peaks-only)");
  if (o.kernel_trace && !cuda::kernel_trace_compiled())
    return Status::invalid_argument("--kernel-trace: this build has no kernel timestamps (configure with "
                                    "-DSPARROW_KERNEL_TRACE=ON; they cost every kernel a little, so they are off by default)");
  const auto t_start = std::chrono::steady_clock::now();

  // The device first: without one nothing else is worth loading.
  SPARROW_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, backend_create("cuda"));
  SPARROW_ASSIGN_OR_RETURN(DeviceInfo dev, device_info());
  const std::string date = utc_now("%Y-%m-%d");
  // --out: a file, or a directory (existing, or ending in '/') to put the default name in.
  const std::string default_name = card_slug(dev.name) + "-" + date + ".json";
  std::string out = o.out.empty() ? "bench/results/" + default_name : o.out;
  {
    std::error_code ec;
    if (out.back() == '/' || std::filesystem::is_directory(out, ec))
      out = (std::filesystem::path(out) / default_name).string();
  }
  Report report(out);
  json& r = report.root();
  r["schema"] = "sparrow-bench/1";
  r["card"] = dev.name;
  r["date"] = date;
  r["started_utc"] = utc_now("%Y-%m-%dT%H:%M:%SZ");
  r["command"] = o.command_line;
  // The switched-off and opted-in paths (docs/cuda.md), so that an A/B's two records say which side
  // they are.
  const char* disabled = std::getenv("SPARROW_CUDA_DISABLE");
  r["cuda_disable"] = disabled != nullptr ? disabled : "";
  const char* enabled = std::getenv("SPARROW_CUDA_ENABLE");
  r["cuda_enable"] = enabled != nullptr ? enabled : "";
  r["device"] = {{"compute_capability", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor)},
                 {"sms", dev.sms},
                 {"l2_bytes", dev.l2_bytes},
                 {"memory_bytes", dev.memory_bytes},
                 {"cuda_driver_version", dev.cuda_driver_version},
                 {"cuda_runtime_version", dev.cuda_runtime_version},
                 {"nvidia_driver", dev.nvidia_driver}};
  std::printf("sparrow bench: %s (sm %d.%d, %d SMs, %.0f GiB), CUDA driver %s, runtime %s\n", dev.name.c_str(),
              dev.cc_major, dev.cc_minor, dev.sms, dev.memory_bytes / 1073741824.0, dev.cuda_driver_version.c_str(),
              dev.cuda_runtime_version.c_str());
  if (!dev.nvidia_driver.empty()) std::printf("%s\n", dev.nvidia_driver.c_str());
  std::fflush(stdout);

  // Ceilings.
  SPARROW_ASSIGN_OR_RETURN(DevicePeaks peaks, measure_device_peaks(o.peaks));
  Peaks used;
  json sources;
  used.hbm_bytes_per_s = peaks.hbm.value;
  sources["hbm"] = "measured: " + peaks.hbm.method;
  if (peaks.bf16_gemm.ok) {
    used.bf16_flops_per_s = peaks.bf16_gemm.value;
    sources["bf16"] = "measured";
  } else {
    used.bf16_flops_per_s = kDatasheetBf16;
    sources["bf16"] = "datasheet (not measured: " + peaks.bf16_gemm.note + ")";
  }
  const double fp8_best = std::max(peaks.fp8_gemm.ok ? peaks.fp8_gemm.value : 0.0,
                                   peaks.fp8_gemm_block.ok ? peaks.fp8_gemm_block.value : 0.0);
  if (fp8_best > 0) {
    used.fp8_flops_per_s = fp8_best;
    sources["fp8"] = "measured (best of per-tensor and block-scaled)";
  } else {
    used.fp8_flops_per_s = kDatasheetFp8;
    sources["fp8"] = "datasheet (not measured: " + peaks.fp8_gemm.note + ")";
  }
  r["peaks"] = {{"hbm", figure_json(peaks.hbm)},
                {"hbm_memcpy", figure_json(peaks.hbm_memcpy)},
                {"hbm_kernel", figure_json(peaks.hbm_kernel)},
                {"bf16_gemm", figure_json(peaks.bf16_gemm)},
                {"fp8_gemm", figure_json(peaks.fp8_gemm)},
                {"fp8_gemm_block_scaled", figure_json(peaks.fp8_gemm_block)},
                {"cublaslt", peaks.cublaslt},
                {"used", {{"hbm_bytes_per_s", used.hbm_bytes_per_s},
                          {"bf16_flops_per_s", used.bf16_flops_per_s},
                          {"fp8_flops_per_s", used.fp8_flops_per_s},
                          {"sources", sources}}}};
  print_peaks(peaks, used, sources);
  std::fflush(stdout);
  SPARROW_RETURN_IF_ERROR(report.write());
  if (o.peaks_only) {
    std::printf("wrote %s\n", out.c_str());
    return Status::ok();
  }

  // The model and its cells.
  ModelOverrides overrides{.index_topk = {}, .index_keys = {}, .precision = *precision};
  overrides.attn_weights_bf16 = o.attn_weights_bf16;
  SPARROW_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(o.model_dir, overrides));
  SPARROW_RETURN_IF_ERROR(model->check_backend(*backend));
  const ModelConfig& c = model->config();
  std::vector<int64_t> layers = o.layers;
  if (layers.empty())
    for (int64_t l = 0; l < c.num_layers; ++l) layers.push_back(l);
  for (int64_t l : layers)
    if (l < 0 || l >= c.num_layers)
      return Status::invalid_argument("--layers: layer " + std::to_string(l) + " is outside the model's " +
                                      std::to_string(c.num_layers) + " layers");
  FloorOptions fo = floor_options_for(c);
  fo.index_keys = o.index_keys;
  json schedule = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    schedule.push_back(std::string(attention_name(c.attention[l])) + "/" + moe_name(c.moe[l]));
  r["model"] = {{"dir", o.model_dir},       {"layers", c.num_layers},  {"experts", c.num_experts},
                {"experts_per_token", c.experts_per_token},          {"hidden", c.hidden_size},
                {"expert_dtype", c.expert_dtype}, {"schedule", schedule}};
  r["options"] = {{"batches", o.batches},
                  {"contexts", o.contexts},
                  {"prefill_tokens", o.prefill_tokens},
                  {"precision", o.precision},
                  {"attention_softmax_weights", model->attn_weights_bf16() ? "bf16" : "fp32"},
                  {"backend", o.backend},
                  {"warmup", o.timing.warmup},
                  {"min_reps", o.timing.min_reps},
                  {"max_reps", o.timing.max_reps},
                  {"target_s", o.timing.target_s},
                  {"input_sets", o.timing.input_sets},
                  {"breakdown", o.timing.breakdown},
                  {"graphs", o.timing.graphs},
                  {"model_step_contexts", o.model_step_contexts},
                  {"model_step_tokens", o.model_step_tokens},
                  {"model_step_segments", o.model_step_segments},
                  {"kernel_trace", o.kernel_trace},
                  {"time_budget_s", o.time_budget_s}};
  r["floor_assumptions"] = {
      {"kv_record_bytes", kv_record_bytes(c)},
      {"kv_record_source",
       "spec §5.1 (vLLM's FP8 layout): nope dims e4m3 + one e8m0 scale per 64 + pad to 8 bytes + rope dims bf16"},
      {"index_key_format", index_key_format_name(fo.index_keys)},
      {"index_key_bytes", index_key_bytes(c, fo.index_keys)},
      {"expert_format", fo.experts == ExpertFormat::kMxfp4 ? "mxfp4" : "fp8 128x128"},
      {"experts_touched",
       "expected distinct experts E(1-(1-K/E)^B): each token's K experts a uniform random K-subset, independent "
       "across tokens"},
      {"flop_classes", "gemm_fp8 and indexer at the fp8 peak; gemm_bf16 and attention at the bf16 peak"},
      {"not_counted", "norms, RoPE, softmax, Sinkhorn, SwiGLU FLOPs; the entry a compressor emits every m tokens"},
      {"time_is", "events around the layer's whole forward on the fp32 CUDA backend (host planning included)"}};
  r["layers"] = json::array();
  r["decode"] = json::array();
  r["prefill"] = json::array();
  r["fp8_gemms"] = fp8_gemm_section(*backend, *model, layers, o.gemm_tokens, used, peaks);
  SPARROW_RETURN_IF_ERROR(report.write());

  const auto deadline_passed = [&] {
    if (o.time_budget_s <= 0) return false;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() > o.time_budget_s;
  };
  char budget_reason[96];
  std::snprintf(budget_reason, sizeof budget_reason, "skipped: time budget of %.0f s spent", o.time_budget_s);

  std::printf("\n%-6s %-10s %5s %6s %11s %11s %8s %7s  %s\n", "layer", "kind", "B", "ctx", "time ms", "floor ms",
              "ratio", "bound", "note");
  std::fflush(stdout);
  std::map<int64_t, std::map<std::pair<int64_t, int64_t>, std::string>> summary;  // layer -> (B, C) -> ratio
  std::map<int64_t, std::string> prefill_summary;

  auto layer_bench = std::make_unique<LayerBench>(*model, *backend);
  LayerBench& bench = *layer_bench;
  for (int64_t l : priority_order(c, layers)) {
    const std::string kind = std::string(attention_name(c.attention[l])) + "/" + moe_name(c.moe[l]);
    json lj = {{"layer", l}, {"kind", kind}, {"weights_bytes", LayerBench::layer_weight_bytes(c, l)}};
    std::string layer_skip;
    if (deadline_passed()) {
      layer_skip = budget_reason;
    } else {
      auto warm = bench.warm(l, std::min(o.warm_tokens, std::max<int64_t>(o.prefill_tokens, 64)), o.timing.seed + l);
      if (warm.is_ok()) lj["warm_s"] = *warm;
      else layer_skip = "skipped: " + warm.status().message();
    }
    if (!layer_skip.empty()) lj["skipped"] = layer_skip;
    r["layers"].push_back(lj);

    // Records one cell (floor, time, ratio) and prints its row; returns the cell and its ratio.
    auto emit = [&](json cell, const StepFloor& f, const CellTiming& t, int64_t B, const std::string& ctx) {
      const FloorTime ft = floor_time(f, used);
      cell["floor"] = floor_json(f, ft);
      std::string note;
      if (t.ok) {
        cell["status"] = "ok";
        cell["time_ms"] = t.median_ms;
        cell["min_ms"] = t.min_ms;
        cell["max_ms"] = t.max_ms;
        cell["host_ms"] = t.host_median_ms;
        if (t.queued_reps > 0 || t.queued_median_ms < 0) {
          cell["queued_ms"] = t.queued_median_ms;
          cell["queued_reps"] = t.queued_reps;
        }
        cell["reps"] = t.reps;
        cell["ratio"] = t.median_ms / (ft.floor_s * 1e3);
        cell["tokens_per_s"] = f.tokens / (t.median_ms * 1e-3);
        cell["floor_tokens_per_s"] = f.tokens / ft.floor_s;
        cell["state_sets"] = t.state_sets;
        cell["state_bytes"] = t.state_bytes;
        if (!t.breakdown.empty()) {
          json ops = json::array();
          for (const cuda::OpTime& op : t.breakdown)
            ops.push_back({{"op", op.op}, {"part", op.part}, {"calls", op.calls}, {"gpu_ms", op.gpu_ms}, {"host_ms", op.host_ms}});
          const auto [gpu, host] = op_sums(t.breakdown);
          cell["breakdown"] = {{"step_ms", t.breakdown_step_ms}, {"queued", t.breakdown_queued}, {"ops_gpu_ms", gpu},
                               {"ops_host_ms", host}, {"ops", ops}};
        }
        {
          char buf[48];
          std::snprintf(buf, sizeof buf, "host %.3f ms", t.host_median_ms);
          note = buf;
          if (t.queued_reps > 0) {
            std::snprintf(buf, sizeof buf, ", queued %.3f ms", t.queued_median_ms);
            note += buf;
          }
        }
        if (t.experts_touched >= 0) {
          cell["experts_touched_measured"] = t.experts_touched;
          char buf[64];
          std::snprintf(buf, sizeof buf, ", experts %.0f (exp. %.1f)", t.experts_touched, f.experts_touched);
          note += buf;
        }
        std::printf("%-6lld %-10s %5lld %6s %11.3f %11.4f %8.1f %7s  %s\n", static_cast<long long>(l), kind.c_str(),
                    static_cast<long long>(B), ctx.c_str(), t.median_ms, ft.floor_s * 1e3,
                    t.median_ms / (ft.floor_s * 1e3), ft.memory_bound ? "memory" : "compute", note.c_str());
        print_breakdown(t);
      } else {
        cell["status"] = t.skipped;
        std::printf("%-6lld %-10s %5lld %6s %11s %11.4f %8s %7s  %s\n", static_cast<long long>(l), kind.c_str(),
                    static_cast<long long>(B), ctx.c_str(), "-", ft.floor_s * 1e3, "-",
                    ft.memory_bound ? "memory" : "compute", t.skipped.c_str());
      }
      std::fflush(stdout);
      char ratio[32] = "-";
      if (t.ok) std::snprintf(ratio, sizeof ratio, "%.1f", t.median_ms / (ft.floor_s * 1e3));
      return std::make_pair(cell, std::string(ratio));
    };

    for (int64_t B : o.batches)
      for (int64_t C : o.contexts) {
        const StepFloor f = decode_floor(c, l, B, C, fo);
        CellTiming t;
        if (!layer_skip.empty()) t.skipped = layer_skip;
        else if (deadline_passed()) t.skipped = budget_reason;
        else {
          t = bench.decode(l, B, C, o.timing);
          if (!t.ok) t.skipped = "skipped: " + t.skipped;
        }
        auto [cell, ratio] = emit({{"layer", l}, {"kind", kind}, {"batch", B}, {"context", C}}, f, t, B, human_size(C));
        r["decode"].push_back(cell);
        summary[l][{B, C}] = ratio;
        SPARROW_RETURN_IF_ERROR(report.write());
      }
    if (o.prefill_tokens > 0) {
      const StepFloor f = prefill_floor(c, l, o.prefill_tokens, fo);
      CellTiming t;
      if (!layer_skip.empty()) t.skipped = layer_skip;
      else if (deadline_passed()) t.skipped = budget_reason;
      else {
        t = bench.prefill(l, o.prefill_tokens, o.timing);
        if (!t.ok) t.skipped = "skipped: " + t.skipped;
      }
      auto [cell, ratio] =
          emit({{"layer", l}, {"kind", kind}, {"tokens", o.prefill_tokens}}, f, t, o.prefill_tokens, "pre");
      r["prefill"].push_back(cell);
      prefill_summary[l] = ratio;
      SPARROW_RETURN_IF_ERROR(report.write());
    }
  }

  // Summary: the ratio to the floor of every cell, one line per layer.
  std::printf("\nratio = measured / floor (decode B x context; prefill %s tokens)\n%-6s %-10s",
              human_size(o.prefill_tokens).c_str(), "layer", "kind");
  for (int64_t B : o.batches)
    for (int64_t C : o.contexts) std::printf(" %9s", (std::to_string(B) + "x" + human_size(C)).c_str());
  if (o.prefill_tokens > 0) std::printf(" %9s", "prefill");
  std::printf("\n");
  for (int64_t l : layers) {
    std::printf("%-6lld %-10s", static_cast<long long>(l),
                (std::string(attention_name(c.attention[l])) + "/" + moe_name(c.moe[l])).c_str());
    for (int64_t B : o.batches)
      for (int64_t C : o.contexts) std::printf(" %9s", summary[l][{B, C}].c_str());
    if (o.prefill_tokens > 0) std::printf(" %9s", prefill_summary[l].c_str());
    std::printf("\n");
  }
  // The whole model's decode step, as `sparrow generate` runs it (the prompt in one forward, then a
  // token a step, each step's id fed to the next on the device, the steps timed on the host as it
  // queues them: Session::generate), against the layers' batch-1 floors summed and the head's bytes.
  layer_bench.reset();  // its states and inputs
  r["model_step"] = json::array();
  if (!o.model_step_contexts.empty())
    std::printf("\n%-26s %6s %11s %11s %8s  %s\n", "model step (B = 1)", "ctx", "time ms", "floor ms", "ratio", "note");
  const double head_bytes =
      static_cast<double>(model->weights().head.data.nbytes + model->weights().head.scale.nbytes);
  constexpr int64_t kUntimed = 3;  // the first step of a size runs op by op; captures follow
  // The cell's prompt: C synthetic ids.
  const auto prompt_of = [&](int64_t C) {
    std::vector<int32_t> prompt(static_cast<size_t>(C));
    for (int64_t i = 0; i < C; ++i)
      prompt[i] = static_cast<int32_t>((i * 7919 + 13 + static_cast<int64_t>(o.timing.seed)) % c.vocab_size);
    return prompt;
  };
  for (int64_t C : o.model_step_contexts) {
    const ModelStepFloor f = model_step_floor(c, C, head_bytes, fo, used);
    json cell = {{"context", C},
                 {"layers", c.num_layers},
                 {"floor_ms", f.total_s() * 1e3},
                 {"floor_layers_ms", f.layers_s * 1e3},
                 {"floor_head_ms", f.head_s * 1e3},
                 {"head_bytes", head_bytes}};
    std::string status;
    std::vector<double> steps;
    double prompt_s = 0;
    if (deadline_passed()) {
      status = budget_reason;
    } else {
      std::vector<double> secs;
      Session session(*model, *backend);
      // n tokens are n forwards: the prompt's, then n - 1 decode steps.
      auto ids = session.generate(prompt_of(C), 1 + kUntimed + o.model_step_tokens, &secs);
      if (!ids.is_ok()) {
        status = "skipped: " + ids.status().message();
      } else {
        prompt_s = secs.front();
        steps.assign(secs.begin() + 1 + kUntimed, secs.end());
      }
    }
    if (steps.empty()) {
      cell["status"] = status.empty() ? "skipped: no steps timed" : status;
      std::printf("%-26s %6s %11s %11.4f %8s  %s\n", "all layers + head", human_size(C).c_str(), "-", f.total_s() * 1e3,
                  "-", cell["status"].get<std::string>().c_str());
    } else {
      std::vector<double> sorted = steps;
      std::sort(sorted.begin(), sorted.end());
      const double med = sorted[sorted.size() / 2] * 1e3;
      cell["status"] = "ok";
      cell["time_ms"] = med;
      // (The steps are the host's as it queues them: a single one is not the device's step, the
      // median and the mean are.)
      const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size()) * 1e3;
      cell["mean_ms"] = mean;
      cell["min_ms"] = sorted.front() * 1e3;
      cell["max_ms"] = sorted.back() * 1e3;
      cell["reps"] = sorted.size();
      cell["prompt_s"] = prompt_s;
      cell["ratio"] = med / (f.total_s() * 1e3);
      cell["ratio_layers_only"] = med / (f.layers_s * 1e3);
      cell["tokens_per_s"] = 1e3 / med;
      std::printf("%-26s %6s %11.3f %11.4f %8.1f  %zu steps (mean %.3f), floor: layers %.4f + head %.4f ms; prompt %.2f s\n",
                  "all layers + head", human_size(C).c_str(), med, f.total_s() * 1e3, med / (f.total_s() * 1e3),
                  sorted.size(), mean, f.layers_s * 1e3, f.head_s * 1e3, prompt_s);
    }
    // The prompt and `n` more steps with an instrument switched on around them (`set`), in a short
    // run of their own so that the instrument stays out of the timed steps.
    const auto instrumented = [&](auto set, int64_t n) {
      set(true);
      Session session(*model, *backend);
      auto ids = session.generate(prompt_of(C), 1 + kUntimed + n, nullptr);
      set(false);
      return ids;
    };
    // Each segment's GPU time inside the captured step (events around its graph's launch).
    if (o.model_step_segments && !steps.empty() && !deadline_passed()) {
      constexpr int64_t kSegmentSteps = 8;
      cuda::step_segment_times(*backend);  // (nothing earlier counts)
      auto ids = instrumented([&](bool on) { cuda::set_step_segment_timing(*backend, on); }, kSegmentSteps);
      std::vector<SegmentSample> samples;
      for (const cuda::StepSegmentTime& t : cuda::step_segment_times(*backend))
        samples.push_back({.segment = t.segment, .ms = t.ms, .nodes = t.nodes, .kernels = t.kernels,
                           .driver_kernels = t.driver_kernels});
      const std::vector<SegmentSummary> seg = summarise_segments(samples, kSegmentSteps);
      if (ids.is_ok() && !seg.empty()) {
        json js = json::array();
        double sum = 0;
        int driver = 0;
        std::string line;
        for (const SegmentSummary& g : seg) {
          js.push_back({{"segment", g.segment},
                        {"median_ms", g.median_ms},
                        {"nodes", g.nodes},
                        {"kernels", g.kernels},
                        {"driver_kernels", g.driver_kernels}});
          sum += g.median_ms;
          driver += g.driver_kernels;
          char buf[64];
          std::snprintf(buf, sizeof buf, " %d:%.3f(%d/%d)", g.segment, g.median_ms, g.driver_kernels, g.kernels);
          line += buf;
        }
        cell["segments"] = js;
        cell["segments_sum_ms"] = sum;
        std::printf("%-26s %6s %11.3f %11s %8s  segments' own GPU time summed (%d of their kernels cuBLASLt's); "
                    "segment:ms(cuBLASLt/kernels)%s\n",
                    "  graph segments", human_size(C).c_str(), sum, "", "", driver, line.c_str());
      } else {
        cell["segments_status"] = ids.is_ok() ? "no graph segments (steps ran op by op)" : ids.status().message();
      }
    }
    // Where each segment's time goes kernel by kernel (the GPU's timer around every kernel's wait:
    // cuda_backend.h set_kernel_trace).
    if (o.kernel_trace && !steps.empty() && !deadline_passed()) {
      constexpr int64_t kTraceSteps = 8;
      cuda::kernel_trace(*backend);  // (nothing earlier counts)
      auto ids = instrumented([&](bool on) { cuda::set_kernel_trace(*backend, on); }, kTraceSteps);
      std::vector<TracedLaunch> launches;
      for (cuda::KernelTraceLaunch& l : cuda::kernel_trace(*backend)) {
        TracedLaunch t{.segment = l.segment, .kernels = l.kernels, .complete = l.complete()};
        for (const cuda::KernelTraceRecord& r : l.records)
          t.records.push_back({.first_at_wait = r.first_at_wait, .first_past_wait = r.first_past_wait,
                               .last_past_wait = r.last_past_wait, .blocks = r.blocks});
        launches.push_back(std::move(t));
      }
      json js = json::array();
      for (const TracedSegment& g : summarise_kernel_trace(launches)) {
        std::printf("  kernel trace, segment %d: %d launches (%d skipped), first to last kernel %.1f us\n", g.segment,
                    g.launches, g.skipped, g.span_us);
        json ks = json::array();
        for (size_t k = 0; k < g.kernels.size(); ++k) {
          const TracedKernel& t = g.kernels[k];
          std::printf("    %3zu %-44s blocks %6lld  chain %7.2f us  resident %7.2f us  spread %6.2f us\n", k,
                      t.name.c_str(), static_cast<long long>(t.blocks), t.chain_us, t.resident_us, t.spread_us);
          ks.push_back({{"name", t.name},
                        {"blocks", t.blocks},
                        {"chain_us", t.chain_us},
                        {"resident_us", t.resident_us},
                        {"spread_us", t.spread_us}});
        }
        json names = json::array();
        std::string top;
        for (size_t i = 0; i < g.by_name.size(); ++i) {
          const TracedSegment::ByName& b = g.by_name[i];
          names.push_back({{"name", b.name}, {"chain_us", b.chain_us}, {"count", b.count}});
          if (i < 8) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "%s %s %.1f (%d)", i ? "," : "", b.name.c_str(), b.chain_us, b.count);
            top += buf;
          }
        }
        std::printf("    chain time by kernel (us, launches):%s\n", top.c_str());
        js.push_back({{"segment", g.segment},
                      {"launches", g.launches},
                      {"skipped", g.skipped},
                      {"span_us", g.span_us},
                      {"kernels", ks},
                      {"by_name", names}});
      }
      cell["kernel_trace"] = js;
      if (!ids.is_ok()) cell["kernel_trace_status"] = ids.status().message();
    }
    std::fflush(stdout);
    r["model_step"].push_back(cell);
    SPARROW_RETURN_IF_ERROR(report.write());
  }

  r["finished_utc"] = utc_now("%Y-%m-%dT%H:%M:%SZ");
  r["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  SPARROW_RETURN_IF_ERROR(report.write());
  std::printf("wrote %s (%.0f s)\n", out.c_str(), r["wall_s"].get<double>());
  return Status::ok();
}

#endif  // SPARROW_BENCH_HAS_CUDA

}  // namespace sparrow::bench
