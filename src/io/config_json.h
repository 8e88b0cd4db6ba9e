// config.json -> ModelConfig: parsing and validation of both DeepSeek-V4 config schemas (spec §1.1).
//
// Two schemas describe the same model and both are accepted:
//   - released (DeepSeek's config.json): `compress_ratios` (one int per layer, trailing entries are
//     the MTP blocks), `num_hash_layers`, `qk_rope_head_dim`, `rope_theta`, `compress_rope_theta`,
//     `rope_scaling` (YaRN for the compressed layers), `quantization_config`, `expert_dtype`;
//   - transformers (what `save_pretrained` writes): `layer_types`, `mlp_layer_types`,
//     `compress_rates`, `rope_parameters` {"main", "compress"}, `partial_rotary_factor`.
// When both spell the same thing, the transformers field wins and the two must agree. Absent
// optional fields take the transformers config-class defaults; the attention schedule has no
// default (transformers' built-in one is V4-Pro's, wrong for every other checkpoint).
//
// Every error names the source, the field (dotted path for nested fields) and the offending value:
//   "config.json: field 'o_groups' = 3 must divide num_attention_heads = 64".
// Codes: Corrupt (not JSON / not an object), InvalidArgument (missing field, wrong type, bad value),
// Unsupported (a valid value this engine does not implement), NotFound / IoError (loading only).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "core/model_config.h"
#include "sparrow/status.h"

namespace sparrow {

// Parses config.json text; `source` (e.g. the file path) prefixes every error message.
Expected<ModelConfig> model_config_from_json(std::string_view json_text, std::string_view source);

// Reads DIR/config.json (or a path to a .json file).
Expected<ModelConfig> model_config_load(const std::filesystem::path& dir_or_file);

// Writes a ModelConfig back as released-schema JSON text (2-space indented), for tools: layer
// ratios plus mtp_compress_ratios as `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
// `rope_theta`, `compress_rope_theta`, `rope_scaling` (YaRN or null), `quantization_config` when
// fp8_weights. model_config_from_json of the result gives back an equal ModelConfig for every
// config that model_config_from_json can produce. Not representable, hence not written: a YaRN
// rope_main (never parsed), `num_nextn_predict_layers` and the DSpark fields (not in ModelConfig),
// quantization_config's `scale_fmt` (ue8m0 on Flash, float32 scales on Flash-Base: unknown here).
std::string model_config_to_released_json(const ModelConfig& c);

}  // namespace sparrow
