#pragma once
#include <memory>

#include "model/backend.h"

namespace dsv4 {
// The fp32 reference backend: every weight dequantized to fp32 at load, exact math, OpenMP across cores.
std::unique_ptr<Backend> make_cpu_backend();
}  // namespace dsv4
