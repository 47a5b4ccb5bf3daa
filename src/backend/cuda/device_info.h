#pragma once
#include <string>

namespace dsv4::cuda {
// One line per visible GPU ("0: NVIDIA H200, 139.8 GiB, sm_90"), or the CUDA error text if none is usable.
std::string describe_devices();
}  // namespace dsv4::cuda
