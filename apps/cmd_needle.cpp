// `sparrow needle`: needle-in-a-haystack Recall@1 of a byte-vocabulary model on the prompts of
// tools/train_needle/needle_prompts.py (see src/tools/needle.h for the method).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common.h"
#include "core/quant_sim.h"
#include "tools/needle.h"

namespace sparrow::app {
namespace {

// "1k,2k,4096": plain ints or a k/K suffix (x1024).
Expected<std::vector<int64_t>> parse_lengths(const std::string& arg) {
  std::vector<int64_t> out;
  std::stringstream ss(arg);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string digits = item;
    int64_t scale = 1;
    if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
      digits.pop_back();
      scale = 1024;
    }
    const bool ok =
        !digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos;
    if (!ok)
      return Status::invalid_argument("--lengths: '" + item + "' is not a length (expected a list like 1k,2k,4096)");
    out.push_back(std::stoll(digits) * scale);
  }
  if (out.empty()) return Status::invalid_argument("--lengths: no lengths given");
  return out;
}

}  // namespace

void add_needle_command(CLI::App& app) {
  struct Opts {
    std::string model, lengths = "1k,2k,4k,8k", backend = "cpu", dump_prompts, format = "auto";
    int64_t trials = 20, seed = 1234, batch_tokens = 16384;
    bool json = false;
    ModelRunOptions run;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "needle", "Needle-in-a-haystack Recall@1 on tools/train_needle/needle_prompts.py's prompts (byte vocabulary)");
  cmd->add_option("--model", opts->model, "Checkpoint directory (a byte-level vocabulary: <bos> = 256)")->required();
  cmd->add_option("--lengths", opts->lengths, "Sequence lengths: a list like 1k,2k,4096 (1k = 1024)")
      ->capture_default_str();
  cmd->add_option("--trials", opts->trials, "Prompts per length (needle depths spread evenly)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the prompts (needle_prompts.py --seed)")->capture_default_str();
  cmd->add_option("--batch-tokens", opts->batch_tokens,
                  "Prompt tokens per forward: trials that fit run together; longer prompts prefill in chunks")
      ->capture_default_str();
  cmd->add_option("--needle-format", opts->format,
                  "Needle layout the model was trained on: vk = [ddd K], kvk = [K ddd K] (needle_prompts.py --format); "
                  "auto: args.needle_format of the model's training_summary.json, else vk")
      ->capture_default_str();
  cmd->add_option("--dump-prompts", opts->dump_prompts, "Also write the prompts as JSON lines to FILE");
  cmd->add_flag("--json", opts->json, "Print {\"results\": [...]} instead of a table");
  add_backend_option(cmd, &opts->backend);
  add_model_run_options(cmd, &opts->run);
  cmd->callback([opts] {
    NeedleOptions no;
    auto lengths = parse_lengths(opts->lengths);
    if (!lengths.is_ok()) fail(lengths.status());
    no.lengths = std::move(lengths).value();
    no.trials = opts->trials;
    no.seed = static_cast<uint64_t>(opts->seed);  // two's complement, as needle_prompts.py's `& MASK`
    no.batch_tokens = opts->batch_tokens;
    auto format = opts->format == "auto" ? needle_format_of_model(opts->model) : needle_format_parse(opts->format);
    if (!format.is_ok()) fail(Status::invalid_argument("--needle-format: " + format.status().message()));
    no.format = *format;

    const ModelOverrides overrides = model_overrides_or_fail(opts->run, opts->backend);
    auto backend = make_backend_or_fail(opts->backend);
    auto model = load_model_or_fail(opts->model, overrides);
    if (Status st = needle_options_check(no, model->config()); !st.is_ok()) fail(st);

    if (!opts->dump_prompts.empty()) {
      std::ofstream f(opts->dump_prompts, std::ios::binary);
      if (!f) fail(Status::io_error("--dump-prompts: cannot write " + opts->dump_prompts));
      for (int64_t L : no.lengths)
        for (int64_t t = 0; t < no.trials; ++t) {
          auto p = needle_prompt_make(no.seed, L, t, no.trials, no.format);
          if (!p.is_ok()) fail(p.status());
          f << needle_prompt_json(*p) << '\n';
        }
      if (!f.flush()) fail(Status::io_error("--dump-prompts: cannot write " + opts->dump_prompts));
    }

    auto progress = [](int64_t L, int64_t done, int64_t total, int64_t hits) {
      std::fprintf(stderr, "sparrow: needle length %lld: %lld/%lld trials, %lld hits\n", static_cast<long long>(L),
                   static_cast<long long>(done), static_cast<long long>(total), static_cast<long long>(hits));
    };
    auto rows = needle_recall(*model, *backend, no, progress);
    if (!rows.is_ok()) fail(rows.status());
    if (verbose_flag())
      for (const NeedleLengthResult& r : *rows)
        for (const NeedleTrial& t : r.per_trial) {
          std::string got;
          for (int32_t id : t.predicted) got += id >= 32 && id < 127 ? static_cast<char>(id) : '.';
          std::fprintf(stderr, "sparrow: length %lld trial %lld key %c answer %s got %s (ids %d,%d,%d)%s\n",
                       static_cast<long long>(r.length), static_cast<long long>(t.trial), t.key, t.answer.c_str(),
                       got.c_str(), t.predicted[0], t.predicted[1], t.predicted[2], t.hit ? " hit" : "");
        }
    std::printf("%s", opts->json ? (needle_table_json(*rows) + "\n").c_str() : needle_table_text(*rows).c_str());
    std::fprintf(stderr, "sparrow: %s backend, precision %s, needle format %s, index keys %s%s%s\n", backend->name(),
                 precision_name(overrides.precision), needle_format_name(no.format), key_precision_name(model->index_keys()),
                 opts->run.index_topk > 0 ? (", index_topk " + std::to_string(opts->run.index_topk)).c_str() : "",
                 model->attn_weights_bf16() ? ", attention weights bf16" : ", attention weights fp32");
  });
}

}  // namespace sparrow::app
