// Creates a backend by name ("cpu"; "cuda" in builds with SPARROW_CUDA).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

Expected<std::unique_ptr<Backend>> backend_create(std::string_view name);
// "cpu" or "cpu, cuda": the names this build accepts.
std::string backend_names();

}  // namespace sparrow
