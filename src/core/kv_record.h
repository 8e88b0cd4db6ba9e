// The fast profile's KV entry as bytes (spec §5.1, §3.0.6): the window and compressed K = V entries
// of V4 are stored by the released serving stacks as a 584-byte record, 448 e4m3 codes of the nope
// dims in 7 blocks of 64 with power-of-two (ue8m0) scales, and the 64 RoPE dims in bf16. The CPU
// reference keeps each entry in fp32 after rounding it to exactly those values
// (fp8_pow2_quant_sim(block 64) on the nope dims, bf16 on the rest); this codec is the storage form
// of the same values: kv_record_decode(kv_record_encode(x)) gives the simulation's values bit for
// bit, so a cache that keeps the bytes reads back what the reference computes with.
//
// Byte order (the composition is the release's; the order within it is this project's, spec open
// question 6): the nope dims' codes in order, then one e8m0 byte per block of 64, then padding to an
// even offset, then the RoPE dims as little-endian bf16.
#pragma once

#include <cstdint>

namespace sparrow {

inline constexpr int64_t kKvRecordBlock = 64;  // nope values a scale

struct KvRecordLayout {
  int64_t dim = 0, rope_dim = 0;  // an entry's values: the nope dims first, then the RoPE dims
  int64_t nope = 0, blocks = 0;   // dim - rope_dim, nope / kKvRecordBlock
  int64_t scales_at = 0, rope_at = 0, bytes = 0;
};
// REQUIRES 0 <= rope_dim < dim, (dim - rope_dim) a positive multiple of kKvRecordBlock. V4-Flash
// (dim 512, rope 64): 448 + 7 + 1 + 128 = 584 bytes.
KvRecordLayout kv_record_layout(int64_t dim, int64_t rope_dim);

// entry [l.dim] -> out [l.bytes]. Each nope block's codes and scale by fp8_pow2_block_encode (core/
// quant.h, the encoder fp8_pow2_quant_sim rounds with); the RoPE dims rounded to bf16 (to nearest
// even). REQUIRES every value finite or NaN (an infinite value has no scale, as in the simulation).
void kv_record_encode(const float* entry, const KvRecordLayout& l, uint8_t* out);
// rec [l.bytes] -> entry [l.dim]: code x scale (exact in fp32), bf16 widened.
void kv_record_decode(const uint8_t* rec, const KvRecordLayout& l, float* entry);

}  // namespace sparrow
