// `sparrow dump`: one forward, the matching taps written to a safetensors file.
#include <cstdio>

#include "common.h"
#include "runtime/taps.h"

namespace sparrow::app {

void add_dump_command(CLI::App& app) {
  struct Opts {
    std::string model, ids, taps = "*", out, backend = "cpu";
    ModelRunOptions run;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("dump", "Run one forward and write the named intermediates (taps) to a .safetensors");
  cmd->add_option("--model", opts->model, "Checkpoint directory")->required();
  cmd->add_option("--ids", opts->ids, "Token ids: a .npy file or a list like 1,2,3")->required();
  cmd->add_option("--taps", opts->taps, "Comma-separated globs of tap names, e.g. 'L3.attn.*,logits'")
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "Output .safetensors path")->required();
  add_backend_option(cmd, &opts->backend);
  add_model_run_options(cmd, &opts->run);
  cmd->callback([opts] {
    auto [ids, backend, model] = load_run_or_fail(opts->ids, opts->backend, opts->model, opts->run);
    auto records = taps_run(*model, *backend, ids, opts->taps);
    if (!records.is_ok()) fail(records.status());
    if (records->empty()) fail(Status::invalid_argument("--taps '" + opts->taps + "' matches no tap name"));
    Status st = taps_write_safetensors(opts->out, *records);
    if (!st.is_ok()) fail(st);
    std::fprintf(stderr, "sparrow: wrote %zu taps to %s\n", records->size(), opts->out.c_str());
  });
}

}  // namespace sparrow::app
