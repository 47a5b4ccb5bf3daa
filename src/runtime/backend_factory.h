#pragma once
#include <memory>
#include <string>

#include "model/backend.h"

namespace dsv4 {
// "cpu" or "cuda". Throws dsv4::Error if the CUDA backend was not compiled in or no GPU is usable.
std::unique_ptr<Backend> make_backend(const std::string& name);
}  // namespace dsv4
