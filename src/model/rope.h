// RoPE frequency tables (spec §3.0.4): plain θ for window-only layers, θ' + YaRN (frequencies only,
// no attention factor) for CSA/HCA layers.
#pragma once

#include "core/model_config.h"
#include "ops/backend.h"

namespace sparrow {

// inv_freq for `rope_dim` rotated dims: f_i = θ^(-2i/rope_dim), YaRN-blended when cfg.yarn.
RopeTable rope_table_make(const RopeConfig& cfg, int64_t rope_dim);

}  // namespace sparrow
