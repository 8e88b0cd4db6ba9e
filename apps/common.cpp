#include "common.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/npy.h"
#include "runtime/backend_factory.h"
#include "tools/progress.h"

namespace sparrow::app {

Expected<std::vector<int32_t>> parse_ids(const std::string& arg) {
  std::vector<int32_t> ids;
  if (arg.size() > 4 && arg.substr(arg.size() - 4) == ".npy") {
    SPARROW_ASSIGN_OR_RETURN(NpyArray a, npy_read(arg));
    if (a.shape.size() != 1)
      return Status::invalid_argument(arg + ": token ids must be a 1-D array, got " + std::to_string(a.shape.size()) +
                                      " dimensions");
    SPARROW_ASSIGN_OR_RETURN(std::vector<int64_t> wide, npy_to_i64(a));
    for (int64_t v : wide) {
      if (v < INT32_MIN || v > INT32_MAX)
        return Status::invalid_argument(arg + ": token id " + std::to_string(v) + " out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) return Status::invalid_argument(arg + ": no token ids");
    return ids;
  }
  std::stringstream ss(arg);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < INT32_MIN || v > INT32_MAX)
      return Status::invalid_argument("--ids: '" + item +
                                      "' is not a token id (expected a .npy file or a list like 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Status::invalid_argument("--ids: no token ids given");
  return ids;
}

void fail(const Status& s) {
  std::fprintf(stderr, "sparrow: %s\n", s.to_string().c_str());
  throw CLI::RuntimeError(1);
}

bool& verbose_flag() {
  static bool verbose = false;
  return verbose;
}

std::unique_ptr<Model> load_model_or_fail(const std::string& dir, const ModelOverrides& overrides) {
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "sparrow: loading %s ...\n", dir.c_str());
  ProgressBar bar("sparrow: checking tensors", stderr_is_terminal());
  auto model = Model::load(dir, overrides, [&](int64_t done, int64_t total) { bar.update(done, total, "layers"); });
  bar.finish();
  if (!model.is_ok()) fail(model.status());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = (*model)->config();
  std::fprintf(stderr, "sparrow: loaded %lld layers, hidden %lld, vocab %lld in %.2f s\n",
               static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
               static_cast<long long>(c.vocab_size), s);
  if (verbose_flag())
    std::fprintf(stderr, "sparrow: load time %.3f s, peak RSS %.1f MiB, RSS now %.1f MiB\n", s,
                 process_peak_rss_bytes() / 1048576.0, process_rss_bytes() / 1048576.0);
  return std::move(model).value();
}

void add_model_run_options(CLI::App* cmd, ModelRunOptions* o, const std::string& suffix) {
  const std::string side = suffix.empty() ? "" : " of side " + suffix.substr(1);
  cmd->add_option("--precision" + suffix, o->precision,
                  "Numerics profile" + side + ": fp32, deepseek-ref or fast; auto: fast on cuda, fp32 on cpu")
      ->capture_default_str();
  cmd->add_option("--index-keys" + suffix, o->index_keys, "Indexer key storage" + side +
                                                   ": fp32, bf16, fp8 or fp4; auto: the profile's (bf16 under fast, "
                                                   "else fp32)")
      ->capture_default_str();
  cmd->add_option("--index-topk" + suffix, o->index_topk, "Override index_topk" + side)->check(CLI::PositiveNumber);
  cmd->add_option("--attn-weights" + suffix, o->attn_weights,
                  "Attention softmax weights" + side +
                      ": fp32 (exact) or bf16 (each rounded where it weights its key, as DeepSeek's sparse attention "
                      "kernel does); auto: the profile's (bf16 under fast and deepseek-ref, fp32 under fp32)")
      ->capture_default_str();
}

ModelOverrides model_overrides_or_fail(const ModelRunOptions& o, const std::string& backend) {
  ModelOverrides ov;
  auto precision = o.precision == "auto" ? std::optional<Precision>(default_precision(backend)) : precision_from_name(o.precision);
  if (!precision)
    fail(Status::invalid_argument("--precision '" + o.precision + "' is not auto, fp32, deepseek-ref or fast"));
  ov.precision = *precision;
  if (o.index_keys != "auto") {
    auto keys = key_precision_from_name(o.index_keys);
    if (!keys)
      fail(Status::invalid_argument("--index-keys '" + o.index_keys + "' is not auto, fp32, bf16, fp8 or fp4"));
    ov.index_keys = *keys;
  }
  if (o.index_topk > 0) ov.index_topk = o.index_topk;
  auto weights = attn_weights_from_name(o.attn_weights);
  if (!weights.is_ok()) fail(weights.status().with_context("--attn-weights"));
  ov.attn_weights_bf16 = *weights;
  return ov;
}

LoadedRun load_run_or_fail(const std::string& ids, const std::string& backend, const std::string& model_dir,
                           const ModelRunOptions& run) {
  LoadedRun r;
  auto parsed = parse_ids(ids);
  if (!parsed.is_ok()) fail(parsed.status());
  r.ids = std::move(parsed).value();
  r.backend = make_backend_or_fail(backend);
  r.model = load_model_or_fail(model_dir, model_overrides_or_fail(run, backend));
  return r;
}

void add_backend_option(CLI::App* cmd, std::string* backend) {
  cmd->add_option("--backend", *backend, "Compute backend: " + backend_names())->capture_default_str();
}

std::unique_ptr<Backend> make_backend_or_fail(const std::string& name) {
  auto be = backend_create(name);
  if (!be.is_ok()) fail(be.status());
  return std::move(be).value();
}

}  // namespace sparrow::app
