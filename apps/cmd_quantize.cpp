// `sparrow quantize`: rewrites a checkpoint in the released layout (FP8 + e8m0, MXFP4 experts).
#include <chrono>
#include <cstdio>

#include "common.h"
#include "tools/progress.h"
#include "tools/quantize.h"

namespace sparrow::app {

void add_quantize_command(CLI::App& app) {
  struct Opts {
    std::string in, out, variant = "flash";
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "quantize", "Write a checkpoint in the released DeepSeek-V4-Flash layout: FP8 e4m3 with 128x128 e8m0 scales "
                  "for the linears the release stores as FP8, MXFP4 routed experts, BF16/F32/I64 elsewhere");
  cmd->add_option("--in", opts->in, "Input checkpoint directory (either naming scheme, any stored format)")->required();
  cmd->add_option("--out", opts->out, "Output directory (created; shards and config.json are replaced)")->required();
  cmd->add_option("--variant", opts->variant,
                  "flash: e8m0 scales, MXFP4 experts; flash-base: F32 scales, FP8 experts")
      ->check(CLI::IsMember({"flash", "flash-base"}))
      ->capture_default_str();
  cmd->callback([opts] {
    const auto t0 = std::chrono::steady_clock::now();
    ProgressBar bar("sparrow: writing", stderr_is_terminal());
    ReleasedWriteOptions options;
    options.variant = opts->variant == "flash" ? ReleaseVariant::kFlash : ReleaseVariant::kFlashBase;
    options.progress = [&](uint64_t done, uint64_t total) { bar.update(done, total, "GB", 1e-9); };
    const Status st = checkpoint_quantize(opts->in, opts->out, options);
    bar.finish();
    if (!st.is_ok()) fail(st);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "sparrow: wrote %s (%s layout) in %.2f s\n", opts->out.c_str(), opts->variant.c_str(), s);
    if (verbose_flag())
      std::fprintf(stderr, "sparrow: peak RSS %.1f MiB\n", process_peak_rss_bytes() / 1048576.0);
  });
}

}  // namespace sparrow::app
