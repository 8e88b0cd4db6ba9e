// Device-side random fills for `sparrow bench`: synthetic decode state (window rings, compressed
// entries, indexer keys, compressor rows) and activations, written directly instead of prefilling
// 128K real tokens. Values are approximately N(0, scale^2) (the sum of four uniforms), a pure
// function of (seed, index); never zeros (a zero input can run faster than real data).
#pragma once

#include <cstdint>

namespace sparrow::bench {

// p[0 .. n) = approx N(0, scale^2). Asynchronous on the default stream; aborts on a launch error.
void device_fill_normal(float* p, int64_t n, uint64_t seed, float scale);

// One thread that spins on the device's global timer for `ns` nanoseconds: work queued behind it on
// the default stream waits, so the host can enqueue a whole step before the GPU starts it.
// Asynchronous; aborts on a launch error.
void device_spin(uint64_t ns);

}  // namespace sparrow::bench
