// `sparrow recall`: indexer recall per CSA layer against the exact fp32 top-k, for each key
// precision (see src/runtime/recall.h for the method).
#include <cstdio>
#include <random>
#include <sstream>

#include "common.h"
#include "runtime/recall.h"

namespace sparrow::app {

void add_recall_command(CLI::App& app) {
  struct Opts {
    std::string model, ids, keys = "bf16,fp8,fp4", backend = "cpu", precision = "fp32";
    int64_t synthetic_len = 0, topk = 0;
    uint64_t seed = 0;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("recall", "Indexer top-k overlap with the exact fp32 selection, per CSA layer");
  cmd->add_option("--model", opts->model, "Checkpoint directory")->required();
  auto* ids = cmd->add_option("--ids", opts->ids, "Token ids: a .npy file or a list like 1,2,3");
  auto* syn = cmd->add_option("--synthetic-len", opts->synthetic_len, "Use N random token ids instead of --ids")
                  ->check(CLI::PositiveNumber);
  ids->excludes(syn);
  cmd->add_option("--seed", opts->seed, "Seed of the synthetic ids")->capture_default_str();
  cmd->add_option("--index-keys", opts->keys, "Key precisions to measure: a list of fp32, bf16, fp8, fp4")
      ->capture_default_str();
  cmd->add_option("--index-topk", opts->topk, "Override index_topk")->check(CLI::PositiveNumber);
  cmd->add_option("--precision", opts->precision,
                  "Numerics of the measured side (fp32, deepseek-ref or fast); the reference is always fp32")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print JSON");
  add_backend_option(cmd, &opts->backend);
  cmd->callback([opts] {
    if (opts->ids.empty() && opts->synthetic_len == 0) fail(Status::invalid_argument("give --ids or --synthetic-len"));
    RecallOptions ro{.keys = {}, .topk = opts->topk};
    auto precision = precision_from_name(opts->precision);
    if (!precision)
      fail(Status::invalid_argument("--precision '" + opts->precision + "' is not fp32, deepseek-ref or fast"));
    ro.precision = *precision;
    std::stringstream ss(opts->keys);
    std::string k;
    while (std::getline(ss, k, ',')) {
      auto p = key_precision_from_name(k);
      if (!p) fail(Status::invalid_argument("--index-keys: '" + k + "' is not one of fp32, bf16, fp8, fp4"));
      ro.keys.push_back(*p);
    }
    auto backend = make_backend_or_fail(opts->backend);
    std::vector<int32_t> tokens;
    if (opts->synthetic_len > 0) {
      auto model = load_model_or_fail(opts->model);
      std::mt19937_64 rng(opts->seed);
      std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(model->config().vocab_size - 1));
      for (int64_t i = 0; i < opts->synthetic_len; ++i) tokens.push_back(d(rng));
    } else {
      auto parsed = parse_ids(opts->ids);
      if (!parsed.is_ok()) fail(parsed.status());
      tokens = std::move(parsed).value();
    }
    auto rows = indexer_recall(opts->model, *backend, tokens, ro);
    if (!rows.is_ok()) fail(rows.status());
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::printf("%s", opts->json ? (recall_table_json(*rows, n) + "\n").c_str() : recall_table_text(*rows, n).c_str());
  });
}

}  // namespace sparrow::app
