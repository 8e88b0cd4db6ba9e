// Row-wise dequantisation of checkpoint weights for the CPU reference backend.
//
// The backend keeps weights as stored (mmap) and decodes one logical row at a time into fp32, so a
// quantised V4-Flash layer never has to exist in fp32 all at once. Formats: spec §2.2.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace sparrow::cpu {

// Decodes element i of a float tensor by its declared dtype (F32/F16/BF16).
float load_float(const TensorView& t, int64_t i);

// Writes logical row `row` of `w` (length w.in) as fp32 into `dst`.
void weight_row(const WeightMatrix& w, int64_t row, float* dst);

}  // namespace sparrow::cpu
