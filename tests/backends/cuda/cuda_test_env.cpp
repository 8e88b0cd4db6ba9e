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

#include "backends/cuda/cuda_backend.h"
#include "ops/backend.h"
#include "runtime/backend_factory.h"
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

// SPARROW_CUDA_DISABLE / SPARROW_CUDA_ENABLE name only this build's switches and opt-ins: a
// misspelt name, or one given to the wrong variable, is refused with what it may be instead (no
// GPU needed).
TEST(CudaTestEnv, FeatureNamesAreCheckedAgainstTheBuildsLists) {
  EXPECT_TRUE(cuda::check_feature_names(nullptr, nullptr).is_ok());
  EXPECT_TRUE(cuda::check_feature_names("", ",").is_ok());
  EXPECT_TRUE(cuda::check_feature_names("graphs,pdl,,w4a8_ring,w4a8_ring_bulk", "kv_record,w4a8_expand,").is_ok());
  const auto refused = [](const char* disable, const char* enable, const std::string& says) {
    const Status st = cuda::check_feature_names(disable, enable);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << (disable ? disable : "-") << " / " << (enable ? enable : "-");
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  };
  refused("pdl,graph", nullptr, "SPARROW_CUDA_DISABLE names 'graph', which is none of this build's switches");
  refused("graph", nullptr, "graphs");  // the list it prints
  refused("kv_record", nullptr, "SPARROW_CUDA_ENABLE=kv_record turns it on");
  refused(nullptr, "w4a8_ring", "SPARROW_CUDA_DISABLE=w4a8_ring turns it off");
  // (ring form 4, the persistent W4A8 prefill, is a default since 2026-12-06: the opt-in of before
  // is refused with the switch that turns it off)
  EXPECT_TRUE(cuda::check_feature_names("w4a8_persistent", nullptr).is_ok());
  refused(nullptr, "w4a8_persistent", "SPARROW_CUDA_DISABLE=w4a8_persistent turns it off");
  refused("pdl", "kv_recrod", "SPARROW_CUDA_ENABLE names 'kv_recrod', which is none of this build's opt-in paths");
  refused(nullptr, "Graphs", "none of this build's opt-in paths");  // (names are case-sensitive)
}

// The backend refuses to start on such a name, before it looks for a device (so the same on a
// machine without one), and starts (or is refused for want of a device) once the name is mended.
TEST(CudaTestEnv, TheBackendRefusesAnUnknownSwitch) {
  const char* had = std::getenv("SPARROW_CUDA_DISABLE");
  const std::string before = had ? had : "";
  setenv("SPARROW_CUDA_DISABLE", "pdl,grpahs", 1);
  auto be = backend_create("cuda");
  if (had) setenv("SPARROW_CUDA_DISABLE", before.c_str(), 1);
  else unsetenv("SPARROW_CUDA_DISABLE");
  ASSERT_FALSE(be.is_ok());
  EXPECT_EQ(be.status().code(), StatusCode::kInvalidArgument) << be.status().message();
  EXPECT_NE(be.status().message().find("'grpahs'"), std::string::npos) << be.status().message();
  auto mended = backend_create("cuda");
  if (!mended.is_ok()) {
    EXPECT_NE(mended.status().code(), StatusCode::kInvalidArgument) << mended.status().message();
  }
}

}  // namespace
}  // namespace sparrow
