// sparrow_npy_compare GOT.npy REF.npy [MAX_REL]: compares two float .npy arrays with the project's
// comparator (core/compare.h) and prints one summary line; exit status 0 when max|d|/max|ref| <=
// MAX_REL (default 1e-4) and shapes and NaN/Inf positions agree, 1 otherwise, 2 on a usage or file
// error. scripts/gpu-check.sh uses it for the `sparrow logits --backend cuda` parity checks.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/compare.h"
#include "core/npy.h"

int main(int argc, char** argv) {
  using namespace sparrow;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s GOT.npy REF.npy [MAX_REL]\n", argv[0]);
    return 2;
  }
  const double max_rel = argc == 4 ? std::atof(argv[3]) : 1e-4;
  auto got = npy_read(argv[1]);
  auto ref = npy_read(argv[2]);
  if (!got.is_ok() || !ref.is_ok()) {
    std::fprintf(stderr, "%s\n", (!got.is_ok() ? got.status() : ref.status()).to_string().c_str());
    return 2;
  }
  if (got->shape != ref->shape) {
    std::printf("shape mismatch\n");
    return 1;
  }
  auto g = npy_to_f32(*got);
  auto r = npy_to_f32(*ref);
  if (!g.is_ok() || !r.is_ok()) {
    std::fprintf(stderr, "%s\n", (!g.is_ok() ? g.status() : r.status()).to_string().c_str());
    return 2;
  }
  // Only the global bar here; the gtest parity suite checks the per-element tolerances.
  const CompareResult c = compare_f32(*g, *r, {.atol = 1e30, .rtol = 0, .max_rel_to_max = max_rel}, ref->shape);
  std::printf("%s%s\n", c.summary().c_str(), c.ok ? "" : ("  FAIL: " + c.message).c_str());
  return c.ok ? 0 : 1;
}
