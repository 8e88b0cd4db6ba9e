// `sparrow`: the command-line program. One subcommand per job; every error is one line on stderr
// naming what is wrong, and exit status 1 (2 for bad command-line usage).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/npy.h"
#include "model/model.h"
#include "ops/backend.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

// IDS is a .npy file of int32/int64 [T] or a comma-separated list.
Expected<std::vector<int32_t>> parse_ids(const std::string& arg) {
  std::vector<int32_t> ids;
  if (arg.size() > 4 && arg.substr(arg.size() - 4) == ".npy") {
    SPARROW_ASSIGN_OR_RETURN(NpyArray a, npy_read(arg));
    if (a.shape.size() != 1)
      return Status::invalid_argument(arg + ": token ids must be a 1-D array, got " + std::to_string(a.shape.size()) +
                                      " dimensions");
    SPARROW_ASSIGN_OR_RETURN(std::vector<int64_t> wide, npy_to_i64(a));
    for (int64_t v : wide) {
      if (v < INT32_MIN || v > INT32_MAX) return Status::invalid_argument(arg + ": token id " + std::to_string(v) + " out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
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
      return Status::invalid_argument("--ids: '" + item + "' is not a token id (expected a .npy file or a list like 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Status::invalid_argument("--ids: no token ids given");
  return ids;
}

int fail(const Status& s) {
  std::fprintf(stderr, "sparrow: %s\n", s.to_string().c_str());
  return 1;
}

Expected<std::unique_ptr<Model>> load_model(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "sparrow: loading %s ...\n", dir.c_str());
  auto model = Model::load(dir);
  if (model.is_ok()) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ModelConfig& c = (*model)->config();
    std::fprintf(stderr, "sparrow: loaded %lld layers, hidden %lld, vocab %lld in %.2f s\n",
                 static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
                 static_cast<long long>(c.vocab_size), s);
  }
  return model;
}

int run_logits(const std::string& model_dir, const std::string& ids_arg, const std::string& out, int64_t chunk) {
  auto ids = parse_ids(ids_arg);
  if (!ids.is_ok()) return fail(ids.status());
  auto model = load_model(model_dir);
  if (!model.is_ok()) return fail(model.status());
  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  auto logits = session.logits(*ids, chunk);
  if (!logits.is_ok()) return fail(logits.status());
  const int64_t T = static_cast<int64_t>(ids->size()), V = (*model)->config().vocab_size;
  Status st = npy_write_f32(out, {T, V}, *logits);
  if (!st.is_ok()) return fail(st);
  std::fprintf(stderr, "sparrow: wrote logits [%lld, %lld] to %s\n", static_cast<long long>(T),
               static_cast<long long>(V), out.c_str());
  return 0;
}

int run_generate(const std::string& model_dir, const std::string& ids_arg, int64_t n) {
  auto ids = parse_ids(ids_arg);
  if (!ids.is_ok()) return fail(ids.status());
  auto model = load_model(model_dir);
  if (!model.is_ok()) return fail(model.status());
  auto backend = make_cpu_backend();
  Session session(**model, *backend);
  const auto t0 = std::chrono::steady_clock::now();
  auto out = session.generate(*ids, n);
  if (!out.is_ok()) return fail(out.status());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < out->size(); ++i) std::printf("%s%d", i ? "," : "", (*out)[i]);
  std::printf("\n");
  std::fprintf(stderr, "sparrow: %zu prompt + %lld generated tokens in %.2f s (cpu backend)\n", ids->size(),
               static_cast<long long>(n), s);
  return 0;
}

}  // namespace
}  // namespace sparrow

int main(int argc, char** argv) {
  using namespace sparrow;
  CLI::App app{"Sparrow: a DeepSeek-V4 inference engine (CPU reference backend)"};
  app.require_subcommand(1);

  std::string model_dir, ids, out;
  int64_t chunk = 0, n = 16;

  auto* logits = app.add_subcommand("logits", "Write the logits of every position as float32 [T, vocab] .npy");
  logits->add_option("--model", model_dir, "Checkpoint directory (config.json + safetensors)")->required();
  logits->add_option("--ids", ids, "Token ids: a .npy file of int32/int64 [T] or a list like 1,2,3")->required();
  logits->add_option("--out", out, "Output .npy path")->required();
  logits->add_option("--chunk", chunk, "Feed the prompt N tokens at a time (1 = token-by-token decode; default all)")
      ->check(CLI::NonNegativeNumber);

  auto* gen = app.add_subcommand("generate", "Greedy-decode N tokens after the prompt and print their ids");
  gen->add_option("--model", model_dir, "Checkpoint directory (config.json + safetensors)")->required();
  gen->add_option("--ids", ids, "Prompt token ids: a .npy file or a list like 1,2,3")->required();
  gen->add_option("-n", n, "Number of tokens to generate")->check(CLI::NonNegativeNumber);

  CLI11_PARSE(app, argc, argv);
  if (*logits) return run_logits(model_dir, ids, out, chunk);
  if (*gen) return run_generate(model_dir, ids, n);
  return 2;
}
