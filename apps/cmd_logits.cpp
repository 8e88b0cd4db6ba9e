// `sparrow logits`: float32 [T, vocab] logits of every position, for parity checks.
#include <cstdio>

#include "common.h"
#include "core/npy.h"
#include "runtime/session.h"

namespace sparrow::app {

void add_logits_command(CLI::App& app) {
  struct Opts {
    std::string model, ids, out, backend = "cpu";
    int64_t chunk = 0;
    ModelRunOptions run;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("logits", "Write the logits of every position as a float32 [T, vocab] .npy");
  cmd->add_option("--model", opts->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--ids", opts->ids, "Token ids: a .npy file of int32/int64 [T] or a list like 1,2,3")->required();
  cmd->add_option("--out", opts->out, "Output .npy path")->required();
  cmd->add_option("--chunk", opts->chunk, "Feed the prompt N tokens at a time (1 = token-by-token decode; 0 = all)")
      ->check(CLI::NonNegativeNumber);
  add_backend_option(cmd, &opts->backend);
  add_model_run_options(cmd, &opts->run);
  cmd->callback([opts] {
    auto [ids, backend, model] = load_run_or_fail(opts->ids, opts->backend, opts->model, opts->run);
    Session session(*model, *backend);
    auto logits = session.logits(ids, opts->chunk);
    if (!logits.is_ok()) fail(logits.status());
    const int64_t T = static_cast<int64_t>(ids.size()), V = model->config().vocab_size;
    Status st = npy_write_f32(opts->out, {T, V}, *logits);
    if (!st.is_ok()) fail(st);
    std::fprintf(stderr, "sparrow: wrote logits [%lld, %lld] to %s\n", static_cast<long long>(T),
                 static_cast<long long>(V), opts->out.c_str());
  });
}

}  // namespace sparrow::app
