// `sparrow synth`: a random checkpoint with real V4-Flash dimensions in the released formats.
#include <chrono>
#include <cstdio>

#include "common.h"
#include "tools/progress.h"
#include "tools/synth.h"

namespace sparrow::app {

void add_synth_command(CLI::App& app) {
  struct Opts {
    std::string preset = "v4-flash", out, variant = "flash";
    int64_t layers = 4, experts = 256;
    uint64_t seed = 0;
    double hc_scale_std = 0.0;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "synth", "Write a random checkpoint with real V4-Flash dimensions and the released formats, streamed to disk");
  cmd->add_option("--preset", opts->preset, "Model preset (v4-flash)")->capture_default_str();
  cmd->add_option("--layers", opts->layers, "Main layers: the real schedule (SWA, SWA, CSA, HCA, ...) truncated")
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "Output directory")->required();
  cmd->add_option("--experts", opts->experts, "Routed experts per layer (V4-Flash has 256)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Random seed (values depend only on seed, tensor name and row)")
      ->capture_default_str();
  cmd->add_option("--hc-scale-std", opts->hc_scale_std,
                  "Spread of the mHC sites' scales around 1 (0: exactly 1, where mix * scale is exact and an fma "
                  "and a rounded product then sum agree; the GPU checks use 0.1 so that bit checks see the difference)")
      ->capture_default_str();
  cmd->add_option("--variant", opts->variant, "flash: e8m0 scales, MXFP4 experts; flash-base: F32 scales, FP8 experts")
      ->check(CLI::IsMember({"flash", "flash-base"}))
      ->capture_default_str();
  cmd->callback([opts] {
    auto config = synth_preset_config(opts->preset, opts->layers, opts->experts);
    if (!config.is_ok()) fail(config.status());
    const auto t0 = std::chrono::steady_clock::now();
    ProgressBar bar("sparrow: writing", stderr_is_terminal());
    ReleasedWriteOptions options;
    options.variant = opts->variant == "flash" ? ReleaseVariant::kFlash : ReleaseVariant::kFlashBase;
    uint64_t total = 0;
    options.progress = [&](uint64_t done, uint64_t all) {
      total = all;
      bar.update(done, all, "GB", 1e-9);
    };
    const Status st = checkpoint_synthesize(opts->out, *config, opts->seed, options, opts->hc_scale_std);
    bar.finish();
    if (!st.is_ok()) fail(st);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "sparrow: wrote %s: %s, %lld layers, %lld experts, %.2f GB in %.1f s\n", opts->out.c_str(),
                 opts->preset.c_str(), static_cast<long long>(opts->layers), static_cast<long long>(opts->experts),
                 total * 1e-9, s);
    if (verbose_flag())
      std::fprintf(stderr, "sparrow: peak RSS %.1f MiB\n", process_peak_rss_bytes() / 1048576.0);
  });
}

}  // namespace sparrow::app
