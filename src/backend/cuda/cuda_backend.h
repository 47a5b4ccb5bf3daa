#pragma once
#include <memory>

#include "model/backend.h"

namespace dsv4 {
// The CUDA backend for Hopper (sm_90a): implements the DeepSeek-V4 op interface on one GPU.
std::unique_ptr<Backend> make_cuda_backend();
}  // namespace dsv4
