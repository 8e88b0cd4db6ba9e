// CHECK: internal invariants only (a failure is a bug in Sparrow, never bad user input).
// User- or file-caused problems return a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define SPARROW_CHECK(cond)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

// CHECK with the two values printed, e.g. SPARROW_CHECK_EQ(x.size(), n).
#define SPARROW_CHECK_OP(a, op, b)                                                            \
  do {                                                                                        \
    const auto _va = (a);                                                                     \
    const auto _vb = (b);                                                                     \
    if (!(_va op _vb)) {                                                                      \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s %s %s (%lld vs %lld)\n", __FILE__, __LINE__, \
                   #a, #op, #b, static_cast<long long>(_va), static_cast<long long>(_vb));    \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
#define SPARROW_CHECK_EQ(a, b) SPARROW_CHECK_OP(a, ==, b)
#define SPARROW_CHECK_LT(a, b) SPARROW_CHECK_OP(a, <, b)
#define SPARROW_CHECK_LE(a, b) SPARROW_CHECK_OP(a, <=, b)
