// The cache key of a device copy made from several weights (src/backends/cuda/cuda_state.h
// stack_fingerprint), plain C++: stacks are cached under their first weight, so two stacks sharing
// it must get different fingerprints, also when the views carry ids as a checkpoint's do
// (view_fingerprint is 0 for those); the same stack the same one; order and contents count.
#include "backends/cuda/cuda_state.h"

#include <gtest/gtest.h>

#include <vector>

namespace sparrow::cuda {
namespace {

struct Stored {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
};

Stored weight(uint8_t fill, uint64_t id) {
  Stored s;
  s.bytes.assign(64, fill);
  s.w.format = WeightFormat::kFloat;
  s.w.out = 4;
  s.w.in = 16;
  s.w.data.dtype = DType::kI8;
  s.w.data.shape = {4, 16};
  s.w.data.data = s.bytes.data();
  s.w.data.nbytes = s.bytes.size();
  s.w.data.id = id;
  return s;
}

uint64_t fp(std::initializer_list<const Stored*> ws) {
  std::vector<const WeightMatrix*> v;
  for (const Stored* s : ws) v.push_back(&s->w);
  return stack_fingerprint(v);
}

TEST(StackFingerprint, StacksSharingAFirstWeightDiffer) {
  for (const uint64_t base : {uint64_t{0}, uint64_t{500}}) {  // by address and bytes, then by id
    SCOPED_TRACE(base ? "views with ids" : "views without ids");
    const Stored a = weight(1, base ? base + 1 : 0), b = weight(2, base ? base + 2 : 0), c = weight(3, base ? base + 3 : 0);
    EXPECT_NE(fp({&a, &b}), fp({&a, &c}));
    EXPECT_NE(fp({&a, &b}), fp({&b, &a}));
    EXPECT_NE(fp({&a, &b}), fp({&a, &b, &c}));
    EXPECT_EQ(fp({&a, &b}), fp({&a, &b}));
  }
}

TEST(StackFingerprint, NewBytesWithoutAnIdChangeIt) {
  Stored a = weight(1, 0), b = weight(2, 0);
  const uint64_t before = fp({&a, &b});
  b.bytes[7] = 9;  // the same address, other contents (a freed model's storage reused)
  EXPECT_NE(fp({&a, &b}), before);
}

}  // namespace
}  // namespace sparrow::cuda
