#include "runtime/backend_factory.h"

namespace sparrow {

#ifdef SPARROW_HAS_CUDA
// Defined in src/backends/cuda; fails with a Status when no usable GPU is present.
Expected<std::unique_ptr<Backend>> make_cuda_backend();
#endif

std::string backend_names() {
#ifdef SPARROW_HAS_CUDA
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

Expected<std::unique_ptr<Backend>> backend_create(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
#ifdef SPARROW_HAS_CUDA
  if (name == "cuda") return make_cuda_backend();
#endif
  return Status::invalid_argument("--backend '" + std::string(name) + "' is not available in this build (choose " +
                                  backend_names() + ")");
}

}  // namespace sparrow
