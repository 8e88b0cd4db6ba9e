// `sparrow bench`: per-layer decode and prefill times of a (synthetic) V4-Flash on the GPU, each
// next to its floor (bytes over the measured HBM bandwidth, FLOPs over the measured tensor-core
// peaks). The work is in bench/ (bench_run.h); bench/README.md says how to run it on the device.
#include "bench/bench_run.h"
#include "common.h"

namespace sparrow::app {

void add_bench_command(CLI::App& app) {
  struct Opts {
    bench::BenchOptions b;
    std::string layers = "all", batches = "1,8,32,128,256", contexts = "4k,32k,128k", prefill = "8k";
    std::string model_step = "4k";
    std::string index_keys = "fp8";
    std::string attn_weights = "auto";
    double copy_gib = 2.0;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "bench", "Time each layer's decode (batch x context) and prefill on the GPU against its memory/compute floor");
  cmd->add_flag("--peaks-only", opts->b.peaks_only, "Only measure HBM bandwidth and the bf16/FP8 GEMM peaks");
  cmd->add_option("--model", opts->b.model_dir, "Checkpoint directory (a `sparrow synth --preset v4-flash` model)");
  cmd->add_option("--layers", opts->layers, "Layers to time: all, or indices and ranges like 0-3,5")
      ->capture_default_str();
  cmd->add_option("--batches", opts->batches, "Decode batch sizes (sequences, one token each)")->capture_default_str();
  cmd->add_option("--contexts", opts->contexts, "Decode context lengths (tokens already in each sequence)")
      ->capture_default_str();
  cmd->add_option("--prefill", opts->prefill, "Prefill length in tokens (0: no prefill cells)")->capture_default_str();
  cmd->add_option("--backend", opts->b.backend, "Compute backend (cuda only)")
      ->check(CLI::IsMember({"cuda"}))
      ->capture_default_str();
  cmd->add_option("--precision", opts->b.precision, "Numerics profile of the timed model: fp32, deepseek-ref or fast (fast: bf16 activations, FP8 linears and W4A8 experts on the tensor cores; docs/cuda.md)")
      ->check(CLI::IsMember({"fp32", "deepseek-ref", "fast"}))
      ->capture_default_str();
  cmd->add_option("--attn-weights", opts->attn_weights,
                  "Attention softmax weights of the timed model: fp32 (exact: three bf16 terms a weight on the "
                  "tensor cores), bf16 (one term), or auto: the profile's (bf16 under fast and deepseek-ref, fp32 under fp32)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--index-keys", opts->index_keys, "Indexer key format the floor assumes: fp8 (132 B), fp4 (68 B), bf16")
      ->check(CLI::IsMember({"fp8", "fp4", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--out", opts->b.out, "JSON report file, or a directory for the default name (default bench/results/<card>-<date>.json, date UTC)");
  cmd->add_option("--time-budget", opts->b.time_budget_s,
                  "Seconds after which the remaining cells are recorded as skipped (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--warmup", opts->b.timing.warmup, "Untimed steps before each cell")->capture_default_str();
  cmd->add_option("--min-reps", opts->b.timing.min_reps, "Timed steps per cell, at least")->capture_default_str();
  cmd->add_option("--max-reps", opts->b.timing.max_reps, "Timed steps per cell, at most")->capture_default_str();
  cmd->add_option("--target-s", opts->b.timing.target_s, "Timed seconds per cell after which no step starts (past --min-reps)")
      ->capture_default_str();
  cmd->add_option("--peak-reps", opts->b.peaks.reps, "Timed repetitions of each peak measurement")->capture_default_str();
  cmd->add_option("--copy-gib", opts->copy_gib, "Size of each buffer of the bandwidth copy, GiB")->capture_default_str();
  cmd->add_option("--gemm-tokens", opts->b.gemm_tokens,
                  "M of the FP8 GEMM section (the model's FP8 matrices through linear_fp8_block against the FP8 peaks; 0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--model-step", opts->model_step,
                  "Prompt lengths after which the whole model's decode step is timed (every layer and the head, one "
                  "sequence, as `sparrow generate` runs it: CUDA graphs), against the layers' floors summed and the "
                  "head's bytes (0: none)")
      ->capture_default_str();
  cmd->add_option("--model-step-tokens", opts->b.model_step_tokens, "Timed decode steps of each model-step cell")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--model-step-segments", opts->b.model_step_segments,
                "After each model-step cell, 8 more steps with events around every graph segment's launch: each "
                "layer's (and the head's) GPU time inside the captured step, and its cuBLASLt kernels");
  cmd->add_flag("--kernel-trace", opts->b.kernel_trace,
                "After each model-step cell, 8 more steps with every kernel of the graph segments reading the GPU's "
                "timer around its wait for the kernel before it: per segment and kernel, the time it held the chain, "
                "how long it sat resident before its predecessor finished, and its blocks' start spread (medians; "
                "\"kernel_trace\" in the JSON)");
  cmd->add_flag("--graphs", opts->b.timing.graphs,
                "Decode cells: run each step as a backend step, which the CUDA backend captures as a CUDA graph "
                "(the timed figure then holds the host's capture before the GPU's work; \"queued\" the graph's GPU time)");
  cmd->add_flag("--breakdown", opts->b.timing.breakdown,
                "After each cell's timing, profile one more step per op (CUDA events and host time per op; "
                "printed under the row, \"breakdown\" in the JSON)");
  cmd->add_option("--seed", opts->b.timing.seed, "Seed of the synthetic state and inputs")->capture_default_str();
  cmd->callback([opts] {
    bench::BenchOptions b = opts->b;
    auto layers = bench::parse_layers(opts->layers);
    if (!layers.is_ok()) fail(layers.status());
    b.layers = *layers;
    auto batches = bench::parse_sizes(opts->batches, "--batches");
    if (!batches.is_ok()) fail(batches.status());
    b.batches = *batches;
    auto contexts = bench::parse_sizes(opts->contexts, "--contexts");
    if (!contexts.is_ok()) fail(contexts.status());
    b.contexts = *contexts;
    if (opts->prefill == "0") {
      b.prefill_tokens = 0;
    } else {
      auto prefill = bench::parse_sizes(opts->prefill, "--prefill");
      if (!prefill.is_ok()) fail(prefill.status());
      if (prefill->size() != 1) fail(Status::invalid_argument("--prefill takes one length"));
      b.prefill_tokens = prefill->front();
    }
    if (opts->model_step == "0") {
      b.model_step_contexts.clear();
    } else {
      auto steps = bench::parse_sizes(opts->model_step, "--model-step");
      if (!steps.is_ok()) fail(steps.status());
      b.model_step_contexts = *steps;
    }
    b.attn_weights_bf16 = attn_weights_from_name(opts->attn_weights).value();  // (checked above)
    b.index_keys = opts->index_keys == "fp4"    ? bench::IndexKeyFormat::kFp4
                   : opts->index_keys == "bf16" ? bench::IndexKeyFormat::kBf16
                                                : bench::IndexKeyFormat::kFp8;
    if (opts->copy_gib <= 0 || opts->copy_gib > 32) fail(Status::invalid_argument("--copy-gib must be in (0, 32]"));
    b.peaks.copy_bytes = static_cast<int64_t>(opts->copy_gib * 1073741824.0);
    if (b.timing.min_reps < 1 || b.timing.max_reps < b.timing.min_reps || b.timing.warmup < 0 || b.peaks.reps < 1)
      fail(Status::invalid_argument("--warmup >= 0, 1 <= --min-reps <= --max-reps and --peak-reps >= 1 are required"));
    // The options as parsed (defaults included), so the report says exactly what ran.
    b.command_line = "sparrow bench" + std::string(b.peaks_only ? " --peaks-only" : "") +
                     (b.model_dir.empty() ? "" : " --model " + b.model_dir) + " --layers " + opts->layers +
                     " --batches " + opts->batches + " --contexts " + opts->contexts + " --prefill " + opts->prefill +
                     " --precision " + b.precision + " --attn-weights " + opts->attn_weights +
                     " --index-keys " + opts->index_keys +
                     " --gemm-tokens " + std::to_string(b.gemm_tokens) + " --model-step " + opts->model_step + (b.timing.breakdown ? " --breakdown" : "") + (b.timing.graphs ? " --graphs" : "") + " --time-budget " + std::to_string(b.time_budget_s);
    const Status st = bench::run_bench(b);
    if (!st.is_ok()) fail(st);
  });
}

}  // namespace sparrow::app
