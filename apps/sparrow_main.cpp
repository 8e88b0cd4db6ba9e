// `sparrow`: the command-line program. One subcommand per file (apps/cmd_*.cpp). Every error is
// one line on stderr naming what is wrong, with exit status 1; bad command-line usage exits 2+.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "common.h"

int main(int argc, char** argv) {
  CLI::App app{"Sparrow: a DeepSeek-V4 inference engine"};
  app.require_subcommand(1);
  // Subcommands inherit fallthrough, so --verbose also works after the subcommand's name.
  app.fallthrough();
  app.add_flag("-v,--verbose", sparrow::app::verbose_flag(), "Print load time and peak RSS");
  sparrow::app::add_logits_command(app);
  sparrow::app::add_generate_command(app);
  sparrow::app::add_dump_command(app);
  sparrow::app::add_diff_command(app);
  sparrow::app::add_recall_command(app);
  sparrow::app::add_needle_command(app);
  sparrow::app::add_quantize_command(app);
  sparrow::app::add_synth_command(app);
  sparrow::app::add_tokenize_commands(app);
  sparrow::app::add_run_command(app);
  sparrow::app::add_render_chat_command(app);
  sparrow::app::add_serve_command(app);
  sparrow::app::add_bench_command(app);
  // A backend's refusal of a call it cannot run (a std::exception from inside an op: e.g. the CUDA
  // attention's) ends the run with its message, as every other error does, not with std::terminate.
  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparrow: %s\n", e.what());
    return 1;
  }
  return 0;
}
