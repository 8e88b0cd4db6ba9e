// `sparrow quantize`: rewrites a checkpoint in exactly the released layout (spec §2.1, §2.2).
//
// The input is anything Model::load accepts (either naming scheme, either config schema, float or
// already quantised weights); every tensor is read through the CPU reader (so its values are what
// the model computes with) and re-encoded by released_checkpoint_write: FP8 + e8m0 128x128 tiles
// for the linears the release stores as FP8, MXFP4 for the routed experts (FP8 + F32 scales and
// FP8 experts for the Flash-Base variant), BF16/F32/I64 elsewhere. Streams tensor by tensor.
#pragma once

#include <filesystem>

#include "sparrow/status.h"
#include "tools/released_checkpoint.h"

namespace sparrow {

// Errors: whatever loading the input gives; InvalidArgument when `out_dir` is the input directory
// or a value is not finite; Unsupported when an expert cannot be MXFP4 (input size % 32 != 0).
// Also copies tokenizer.json, tokenizer_config.json and generation_config.json when present.
Status checkpoint_quantize(const std::filesystem::path& in_dir, const std::filesystem::path& out_dir,
                           const ReleasedWriteOptions& options = {});

}  // namespace sparrow
