// `sparrow generate`: greedy continuation of a prompt given as token ids.
#include <chrono>
#include <cstdio>

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
    auto out = session.generate(ids, opts->n);
    if (!out.is_ok()) fail(out.status());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < out->size(); ++i) std::printf("%s%d", i ? "," : "", (*out)[i]);
    std::printf("\n");
    std::fprintf(stderr, "sparrow: %zu prompt + %lld generated tokens in %.2f s (%s backend)\n", ids.size(),
                 static_cast<long long>(opts->n), s, backend->name());
  });
}

}  // namespace sparrow::app
