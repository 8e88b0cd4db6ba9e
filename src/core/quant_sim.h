// Quantise-then-dequantise in place ("simulation"), to study what a lower-precision cache costs
// while computing everything else in fp32. Each form matches a storage layout real engines use.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sparrow {

// Precision of stored indexer keys (`--index-keys`).
enum class KeyPrecision : uint8_t {
  kF32,   // the reference: no rounding
  kBf16,  // bf16 cache
  kFp8,   // e4m3 with one fp32 scale per key (amax/448): the 132-byte layout (spec §5.1)
  kFp4,   // e2m1 in blocks of 32 with power-of-two scales (spec §3.0.7)
};

std::optional<KeyPrecision> key_precision_from_name(std::string_view name);  // fp32|bf16|fp8|fp4
const char* key_precision_name(KeyPrecision p);

// Rounds x[0..n) as stored in precision p and read back.
void simulate_key_precision(float* x, int64_t n, KeyPrecision p);

}  // namespace sparrow
