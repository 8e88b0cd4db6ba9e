// The GPU test binary allocates poisoned by default: SPARROW_CUDA_POISON_ALLOC=1 (every tensor and
// unfilled scratch buffer starts as 0xff bytes, NaN floats) unless the environment sets the variable
// itself (SPARROW_CUDA_POISON_ALLOC=0: the production allocations). A test that compares two GPU runs
// bit for bit could otherwise pass on a pooled buffer still holding the first run's values:
// CudaOps.AttentionInPassesGivesTheOnePassBits did, with a kernel that skipped every pass but the
// first (H100, 2026-12-05). The backend reads the variable at its first allocation, after this.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "cuda_test_util.h"

namespace sparrow {
namespace {

const bool kPoisonedByDefault = setenv("SPARROW_CUDA_POISON_ALLOC", "1", /*overwrite=*/0) == 0;

// The default took, and (on a GPU, unless the caller set the variable otherwise) a fresh tensor
// reads back as NaN in every element.
TEST(CudaTestEnv, AllocationsArePoisonedUnlessTheCallerSaysOtherwise) {
  EXPECT_TRUE(kPoisonedByDefault);
  const char* v = std::getenv("SPARROW_CUDA_POISON_ALLOC");
  ASSERT_NE(v, nullptr) << "the test binary's default was not set";
  if (std::string(v) != "1") GTEST_SKIP() << "SPARROW_CUDA_POISON_ALLOC=" << v << ", set by the caller";
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  const Tensor t = gpu->alloc(ElemType::kF32, {1037});
  const std::vector<float> got = gpu->download_f32(t);
  int64_t not_nan = 0;
  for (float x : got) not_nan += !std::isnan(x);
  EXPECT_EQ(not_nan, 0) << "of " << got.size() << " elements of a fresh tensor";
}

}  // namespace
}  // namespace sparrow
