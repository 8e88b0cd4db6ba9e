// `sparrow generate`: greedy continuation of a prompt given as token ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "common.h"
#include "runtime/session.h"

namespace sparrow::app {

void add_generate_command(CLI::App& app) {
  struct Opts {
    std::string model, ids, backend = "cpu";
    int64_t n = 16;
    ModelRunOptions run;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("generate", "Greedy-decode N tokens after the prompt and print their ids");
  cmd->add_option("--model", opts->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--ids", opts->ids, "Prompt token ids: a .npy file or a list like 1,2,3")->required();
  cmd->add_option("-n", opts->n, "Number of tokens to generate")->check(CLI::NonNegativeNumber)->capture_default_str();
  add_backend_option(cmd, &opts->backend);
  add_model_run_options(cmd, &opts->run);
  cmd->callback([opts] {
    auto [ids, backend, model] = load_run_or_fail(opts->ids, opts->backend, opts->model, opts->run);
    Session session(*model, *backend);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> steps;
    auto out = session.generate(ids, opts->n, &steps);
    if (!out.is_ok()) fail(out.status());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < out->size(); ++i) std::printf("%s%d", i ? "," : "", (*out)[i]);
    std::printf("\n");
    std::fprintf(stderr, "sparrow: %zu prompt + %lld generated tokens in %.2f s (%s backend)\n", ids.size(),
                 static_cast<long long>(opts->n), s, backend->name());
    // The prompt's forward, then the decode steps (each the host's time from one step's start to
    // the next's: the steps are queued ahead, so a single step's time is not the device's, but the
    // median is, and the mean adds up to the wall time): the first two left out as warm-up when
    // there are more.
    if (!steps.empty()) {
      std::fprintf(stderr, "sparrow: prompt forward %.2f ms\n", 1e3 * steps[0]);
      std::vector<double> decode(steps.begin() + 1, steps.end());
      if (decode.size() > 4) decode.erase(decode.begin(), decode.begin() + 2);
      if (!decode.empty()) {
        const double mean = std::accumulate(decode.begin(), decode.end(), 0.0) / static_cast<double>(decode.size());
        std::sort(decode.begin(), decode.end());
        const double median = decode[decode.size() / 2];
        std::fprintf(stderr, "sparrow: decode step median %.3f ms (%.1f tokens/s), mean %.3f ms over %zu steps\n",
                     1e3 * median, 1.0 / median, 1e3 * mean, decode.size());
      }
    }
  });
}

}  // namespace sparrow::app
