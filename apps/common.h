// Helpers shared by the sparrow subcommands (one file per subcommand: apps/cmd_*.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow::app {

// IDS is a .npy file of int32/int64 [T] or a comma-separated list.
Expected<std::vector<int32_t>> parse_ids(const std::string& arg);

// Prints "sparrow: <status>" on stderr and ends the subcommand with exit status 1.
[[noreturn]] void fail(const Status& s);

// Loads a model, printing progress on stderr (a progress bar when stderr is a terminal; with
// --verbose, the load time and peak RSS).
std::unique_ptr<Model> load_model_or_fail(const std::string& dir, const ModelOverrides& overrides = {});

// --precision, --index-keys, --index-topk, --attn-weights (with a suffix: --precision-a, ...):
// run-time numerics.
struct ModelRunOptions {
  // index_keys "auto": the profile's default (fp32 under fp32 and deepseek-ref, bf16 under fast).
  // precision "auto": fast on the cuda backend, fp32 on the cpu one (default_precision).
  std::string precision = "auto", index_keys = "auto";
  int64_t index_topk = 0;
  // --attn-weights: fp32 (exact), bf16 (each rounded where it weights its key), or auto: the
  // profile's (precision_default_attn_weights_bf16: bf16 under fast and deepseek-ref, exact under
  // fp32; ModelOverrides::attn_weights_bf16).
  std::string attn_weights = "auto";
};
void add_model_run_options(CLI::App* cmd, ModelRunOptions* o, const std::string& suffix = "");
// The run options as overrides for a model run on `backend` (which resolves --precision auto).
ModelOverrides model_overrides_or_fail(const ModelRunOptions& o, const std::string& backend);

// What the one-forward commands (logits, generate, dump) share: parsed --ids, the backend and the
// model loaded with the run options; fails the command on any error.
struct LoadedRun {
  std::vector<int32_t> ids;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
LoadedRun load_run_or_fail(const std::string& ids, const std::string& backend, const std::string& model_dir,
                           const ModelRunOptions& run);

// The global -v/--verbose flag (sparrow_main.cpp); accepted before or after the subcommand.
bool& verbose_flag();

// Adds --backend (cpu, or cuda in CUDA builds) to a subcommand.
void add_backend_option(CLI::App* cmd, std::string* backend);
std::unique_ptr<Backend> make_backend_or_fail(const std::string& name);

// Each subcommand registers itself here.
void add_logits_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_dump_command(CLI::App& app);
void add_diff_command(CLI::App& app);
void add_recall_command(CLI::App& app);
void add_needle_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);  // tokenize, detokenize
void add_run_command(CLI::App& app);
void add_render_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace sparrow::app
