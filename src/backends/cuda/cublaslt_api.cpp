#include "backends/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace sparrow::cuda {
namespace {

template <class F>
void resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("symbol ") + name + " missing";
}

CublasLtApi load() {
  CublasLtApi api;
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("SPARROW_CUBLASLT"); env && *env) {
    candidates = {env};
  } else {
    candidates = {soname, "/usr/local/cuda/lib64/" + soname, "/usr/local/cuda/targets/x86_64-linux/lib/" + soname,
                  "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/" + soname,
                  "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib/" + soname};
  }
  void* lib = nullptr;
  std::string tried;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      api.library = c;
      break;
    }
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : c);
  }
  if (!lib) {
    api.error = "cuBLASLt not found (" + tried + "; set SPARROW_CUBLASLT=/path/to/" + soname + ")";
    return api;
  }
  std::string& err = api.error;
  resolve(lib, "cublasLtCreate", api.create, err);
  resolve(lib, "cublasLtDestroy", api.destroy, err);
  resolve(lib, "cublasLtGetVersion", api.get_version, err);
  resolve(lib, "cublasLtGetStatusString", api.status_string, err);
  resolve(lib, "cublasLtMatmulDescCreate", api.desc_create, err);
  resolve(lib, "cublasLtMatmulDescDestroy", api.desc_destroy, err);
  resolve(lib, "cublasLtMatmulDescSetAttribute", api.desc_set, err);
  resolve(lib, "cublasLtMatrixLayoutCreate", api.layout_create, err);
  resolve(lib, "cublasLtMatrixLayoutDestroy", api.layout_destroy, err);
  resolve(lib, "cublasLtMatrixLayoutSetAttribute", api.layout_set, err);
  resolve(lib, "cublasLtMatmulPreferenceCreate", api.pref_create, err);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", api.pref_destroy, err);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", api.pref_set, err);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", api.heuristic, err);
  resolve(lib, "cublasLtMatmul", api.matmul, err);
  if (!err.empty()) {
    err = api.library + ": " + err;
    return api;
  }
  api.version = api.get_version();
  return api;
}

}  // namespace

const CublasLtApi& cublaslt_api() {
  static const CublasLtApi api = load();
  return api;
}

std::string cublaslt_status_text(cublasStatus_t s) {
  const CublasLtApi& api = cublaslt_api();
  const char* t = api.status_string ? api.status_string(s) : nullptr;
  return t ? t : "cublasStatus " + std::to_string(static_cast<int>(s));
}

}  // namespace sparrow::cuda
