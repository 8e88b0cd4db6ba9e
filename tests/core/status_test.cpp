// Expected<T>: the value, or the Status that explains why there is none.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "sparrow/status.h"

namespace sparrow {
namespace {

TEST(Expected, GivesTheValueOrTheStatus) {
  Expected<int> ok(7);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.value(), 7);
  EXPECT_EQ(std::move(ok).value(), 7);
  Expected<int> bad(Status::not_found("model directory 'x' does not exist"));
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().to_string(), "Not found: model directory 'x' does not exist");
  // An OK status is not a value: it becomes an internal error.
  EXPECT_FALSE(Expected<int>(Status::ok()).is_ok());
}

// value() on an error stops the process with the error's message, as a failed CHECK does, instead of
// reading a value that is not there (a test that loaded a missing model used to end in a
// segmentation fault with no word of why).
TEST(ExpectedDeathTest, ValueOnAnErrorStopsWithItsMessage) {
  EXPECT_DEATH((void)Expected<int>(Status::not_found("model directory 'x'")).value(),
               "Expected::value\\(\\) on an error: Not found: model directory 'x'");
  const Expected<std::string> bad(Status::invalid_argument("--attn-weights 'q'"));
  EXPECT_DEATH((void)bad.value(), "Invalid argument: --attn-weights 'q'");
  Expected<std::unique_ptr<int>> none(Status::unsupported("no"));
  EXPECT_DEATH((void)none.value(), "Unsupported: no");
}

}  // namespace
}  // namespace sparrow
