// cuBLASLt, opened at run time with dlopen rather than linked: a sparrow binary built on a machine
// without a GPU must start on the GPU machines without carrying the 540 MB library, and a missing
// or old cuBLASLt must only cost the paths that use it. Only the header's types and enums are used
// at compile time. Shared by the FP8 block-scaled linear (fp8_linear.cpp), the bf16 grouped linear (bf16_linear.cpp)
// and `sparrow bench`.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <string>

namespace sparrow::cuda {

struct CublasLtApi {
  std::string error;    // non-empty: unusable, and why
  std::string library;  // the file that was opened
  size_t version = 0;   // cublasLtGetVersion(), e.g. 130100
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// Loaded once per process (thread-safe). Search order: $SPARROW_CUBLASLT alone if set; else
// libcublasLt.so.<major> on the loader's path, the toolkit's usual directories, and the CUDA wheel
// directories of the GPU machines' PyTorch image.
const CublasLtApi& cublaslt_api();

// Destroys cuBLASLt descriptors at scope exit.
struct LtObjects {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtObjects() = default;
  LtObjects(const LtObjects&) = delete;
  LtObjects& operator=(const LtObjects&) = delete;
  ~LtObjects() {
    const CublasLtApi& lt = cublaslt_api();
    if (pref) lt.pref_destroy(pref);
    if (d) lt.layout_destroy(d);
    if (b) lt.layout_destroy(b);
    if (a) lt.layout_destroy(a);
    if (desc) lt.desc_destroy(desc);
  }
};

// cublasLtGetStatusString's text, or the number when the library is not loaded.
std::string cublaslt_status_text(cublasStatus_t s);

}  // namespace sparrow::cuda
