#include <cuda_runtime.h>

#include <sstream>

#include "backend/cuda/device_info.h"

namespace dsv4::cuda {
std::string describe_devices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  std::ostringstream os;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    os << i << ": " << p.name << ", " << (double(p.totalGlobalMem) / (1ull << 30)) << " GiB, sm_" << p.major << p.minor
       << "\n";
  }
  return os.str();
}
}  // namespace dsv4::cuda
