// `sparrow bench`: measures the device's ceilings, then times each layer of a (synthetic)
// DeepSeek-V4 checkpoint on the CUDA backend, decode at every (batch, context) and prefill, next
// to its floor (bench/floors.h). Writes the JSON report and prints a table; see bench/README.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/device_peaks.h"
#include "bench/floors.h"
#include "bench/layer_bench.h"
#include "sparrow/status.h"

namespace sparrow::bench {

struct BenchOptions {
  std::string model_dir;                         // required unless peaks_only
  bool peaks_only = false;
  std::vector<int64_t> layers;                   // empty: every layer of the model
  std::vector<int64_t> batches = {1, 8, 32, 128, 256};
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int64_t prefill_tokens = 8192;                 // 0: no prefill cells
  int64_t gemm_tokens = 8192;                    // M of the FP8 GEMM section (0: none)
  // The whole model's decode step (every layer and the head, one sequence, the engine's own
  // forward: CUDA graphs where the backend captures) after a prompt of each of these lengths.
  std::vector<int64_t> model_step_contexts = {4096};
  int64_t model_step_tokens = 32;                // timed decode steps of that cell (after 3 untimed)
  bool model_step_segments = false;              // then each graph segment's GPU time (a second, short run)
  bool kernel_trace = false;                     // then each segment's kernels' timestamps (a third, short run)
  std::string backend = "cuda";
  std::string precision = "fp32";
  std::optional<bool> attn_weights_bf16;          // --attn-weights (ModelOverrides::attn_weights_bf16; unset: the profile's)
  IndexKeyFormat index_keys = IndexKeyFormat::kFp8;  // the floor's indexer key format
  std::string out;                               // "": bench/results/<card>-<date>.json
  double time_budget_s = 0;                      // 0: none; cells past it are skipped, saying so
  int64_t warm_tokens = 1024;                    // the untimed forward that uploads a layer's weights
  TimingOptions timing;
  PeakOptions peaks;
  std::string command_line;                      // recorded in the report
};

// Errors: no usable CUDA device, a bad option, a model that does not load. Cells that cannot run
// are recorded as skipped, not errors.
Status run_bench(const BenchOptions& options);

// "NVIDIA H200" -> "nvidia-h200": lower case, runs of other characters become one '-'.
std::string card_slug(const std::string& name);
// "4k" -> 4096, "128K" -> 131072, "8192" -> 8192, comma-separated; InvalidArgument names the item.
Expected<std::vector<int64_t>> parse_sizes(const std::string& list, const std::string& flag);
// "0-3,5" -> {0, 1, 2, 3, 5}; "all" or "" -> {}.
Expected<std::vector<int64_t>> parse_layers(const std::string& list);

}  // namespace sparrow::bench
