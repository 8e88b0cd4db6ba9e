// The KV record codec: see kv_record.h.
#include "core/kv_record.h"

#include "core/check.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace sparrow {

KvRecordLayout kv_record_layout(int64_t dim, int64_t rope_dim) {
  SPARROW_CHECK(rope_dim >= 0 && rope_dim < dim);
  KvRecordLayout l{.dim = dim, .rope_dim = rope_dim, .nope = dim - rope_dim};
  SPARROW_CHECK(l.nope % kKvRecordBlock == 0);
  l.blocks = l.nope / kKvRecordBlock;
  l.scales_at = l.nope;
  l.rope_at = (l.scales_at + l.blocks + 1) / 2 * 2;  // bf16 at an even offset
  l.bytes = l.rope_at + 2 * rope_dim;
  return l;
}

void kv_record_encode(const float* entry, const KvRecordLayout& l, uint8_t* out) {
  for (int64_t b = 0; b < l.blocks; ++b)
    out[l.scales_at + b] = e8m0_from_exponent(
        fp8_pow2_block_encode(entry + b * kKvRecordBlock, kKvRecordBlock, out + b * kKvRecordBlock));
  for (int64_t p = l.scales_at + l.blocks; p < l.rope_at; ++p) out[p] = 0;
  for (int64_t i = 0; i < l.rope_dim; ++i) {
    const uint16_t h = f32_to_bf16(entry[l.nope + i]);
    out[l.rope_at + 2 * i] = static_cast<uint8_t>(h & 0xffu);
    out[l.rope_at + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
}

void kv_record_decode(const uint8_t* rec, const KvRecordLayout& l, float* entry) {
  for (int64_t b = 0; b < l.blocks; ++b) {
    const float s = e8m0_to_f32(rec[l.scales_at + b]);
    for (int64_t i = 0; i < kKvRecordBlock; ++i)
      entry[b * kKvRecordBlock + i] = e4m3_to_f32(rec[b * kKvRecordBlock + i]) * s;
  }
  for (int64_t i = 0; i < l.rope_dim; ++i)
    entry[l.nope + i] = bf16_to_f32(static_cast<uint16_t>(rec[l.rope_at + 2 * i] | (rec[l.rope_at + 2 * i + 1] << 8)));
}

}  // namespace sparrow
