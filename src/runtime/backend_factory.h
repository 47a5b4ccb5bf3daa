#pragma once
#include <memory>
#include <string>

#include "model/backend.h"

namespace dsv4 {
// "cpu" or "cuda"; tp > 1 (cuda only) drives GPUs 0..tp-1 with tensor parallelism over NCCL. Throws dsv4::Error if
// the CUDA backend (or NCCL) was not compiled in, or the GPUs are not there.
std::unique_ptr<Backend> make_backend(const std::string& name, int tp = 1);
}  // namespace dsv4
