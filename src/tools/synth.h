// `sparrow synth`: a random checkpoint with real DeepSeek-V4-Flash dimensions in the released
// layout and formats, for load and speed work without downloading 160 GB.
//
// Values are a pure function of (seed, tensor name, row): a model with fewer layers or experts holds
// exactly the leading layers/experts of a larger one, and the bytes do not depend on the thread
// count. Rows come from an approximately normal generator (Irwin-Hall: the sum of four 16-bit
// uniforms, rescaled; bounded at ±3.46 sigma), then go through the same encoders as the quantiser,
// except the MXFP4 routed experts (97% of the bytes), whose codes are drawn directly: normal
// quantiles rounded to e2m1 under per-block power-of-two scales (see RandomSource::fp4_rows).
//
// Initialisation, chosen so activations neither explode nor vanish through the layers (every
// projection preserves the RMS of a unit-RMS input, the norms reset it, the mHC mixes average):
//   embed N(0, 1); every linear (head, attention, compressor, indexer, gate, experts) N(0, 1/in)
//   (MXFP4 experts: RMS about 1/sqrt(in));
//   norm weights 1 + N(0, 0.02^2); hc fn N(0, (0.5^2)/(S*D)) so the mixes are about N(0, 0.25);
//   hc base: pre = logit(1/S) (the sub-layer input is about the mean of the streams), post 0
//   (post = 2 sigmoid(0) = 1), comb 1 on the diagonal and 0 elsewhere (each stream mostly keeps
//   itself), plus N(0, 0.1^2) noise; hc scale 1; attn_sink N(0, 0.5^2); ape N(0, 0.1^2);
//   gate.bias N(0, 0.01^2); tid2eid K distinct uniformly drawn experts per token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/model_config.h"
#include "sparrow/status.h"
#include "tools/released_checkpoint.h"

namespace sparrow {

// DeepSeek-V4-Flash's config (spec §1.1) with the layer schedule (§1.2: SWA, SWA, then CSA/HCA
// alternating from layer 2) truncated to `layers` main layers, `experts` routed experts and the
// hash layers min(3, layers). Errors: InvalidArgument for layers outside [1, 43] or experts below
// num_experts_per_tok (6).
Expected<ModelConfig> v4_flash_config(int64_t layers, int64_t experts);

// The config of a named preset ("v4-flash"); InvalidArgument for an unknown name.
Expected<ModelConfig> synth_preset_config(const std::string& preset, int64_t layers, int64_t experts);

// Writes a random checkpoint for `c` (any DeepSeek-V4 config) to `dir`. The mHC sites' scales are
// exactly 1 unless `hc_scale_std` > 0 draws them from N(1, hc_scale_std^2): at 1 a product
// mix * scale is exact, so a kernel that rounds `mix * scale + base` once (an fma) and one that
// rounds twice give the same bits there, and bit-for-bit checks on such a model cannot tell them
// apart (the GPU checks use 0.1).
Status checkpoint_synthesize(const std::filesystem::path& dir, const ModelConfig& c, uint64_t seed,
                             const ReleasedWriteOptions& options = {}, double hc_scale_std = 0.0);

}  // namespace sparrow
