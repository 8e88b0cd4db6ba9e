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

// The reference's power-of-two FP8 quantisation (spec §3.0.5, §3.0.6), in place: per block of
// `block` values, amax = max(|x|, 1e-4), s = 2^ceil(log2(amax/448)), x <- e4m3(clamp(x/s)) * s.
// Block 128 before FP8/FP4 GEMMs, block 64 for the KV "simulation".
void fp8_pow2_quant_sim(float* x, int64_t n, int64_t block);

// The reference's FP4 simulation (spec §3.0.7), in place: blocks of 32, amax floored at 6*2^-126,
// s = 2^ceil(log2(amax/6)), x <- e2m1(clamp(x/s, ±6)) * s.
void fp4_pow2_quant_sim(float* x, int64_t n);

// y = x H_n / sqrt(n), H_n the Sylvester (natural-order) Walsh-Hadamard matrix (spec §3.0.8), in
// place. REQUIRES n a power of two.
void hadamard_transform(float* x, int64_t n);

// bf16 round-to-nearest-even of every value, in place.
void bf16_round_inplace(float* x, int64_t n);

}  // namespace sparrow
