#pragma once
#include <string>

namespace dsv4 {
// "dsv4 0.1.0 (CUDA backend: sm_90a)" or "dsv4 0.1.0 (CUDA backend: not compiled)".
std::string version_string();
bool cuda_backend_compiled();
}  // namespace dsv4
