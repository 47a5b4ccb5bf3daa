#include "backend/cuda/peer_allreduce.h"


#include "backend/cuda/ops.h"
#include "core/error.h"

namespace dsv4::cuda {

bool PeerReduce::available(const std::vector<int>& devices) {
  if (devices.size() < 2 || devices.size() > static_cast<size_t>(kPeerMaxRanks)) return false;
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      if (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok) return false;
    }
  return true;
}

PeerReduce::PeerReduce(const std::vector<int>& devices, size_t cap_floats) : devices_(devices) {
  if (!available(devices)) fail("peer all-reduce: not every pair of GPUs has peer access");
  if (cap_floats == 0 || cap_floats % 4 != 0) fail("peer all-reduce: capacity must be a positive multiple of 4");
  const int n = static_cast<int>(devices.size());
  ranks_.resize(devices.size());
  for (int r = 0; r < n; ++r) {
    DSV4_CU(cudaSetDevice(devices[static_cast<size_t>(r)]));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[static_cast<size_t>(q)], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();  // clear the sticky-free status
      else DSV4_CU(e);
    }
    PeerReduceRank& R = ranks_[static_cast<size_t>(r)];
    R.rank = r, R.n = n, R.cap = cap_floats;
    // LL lines: 8 bytes per float (the float and the epoch).
    DSV4_CU(cudaMalloc(&R.recv[r], 2 * static_cast<size_t>(n) * cap_floats * 2 * sizeof(float)));
    DSV4_CU(cudaMalloc(&R.epoch, 2 * sizeof(uint32_t)));
    R.done = R.epoch + 1;
    DSV4_CU(cudaMemset(R.epoch, 0, 2 * sizeof(uint32_t)));
    // Epoch 0 is never used (the first all-reduce is epoch 1): zeroed lines are never taken for data.
    DSV4_CU(cudaMemset(R.recv[r], 0, 2 * static_cast<size_t>(n) * cap_floats * 2 * sizeof(float)));
    DSV4_CU(cudaDeviceSynchronize());
  }
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) {
      ranks_[static_cast<size_t>(r)].recv[q] = ranks_[static_cast<size_t>(q)].recv[q];
    }
}

PeerReduce::~PeerReduce() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(ranks_[r].recv[r]);
    cudaFree(ranks_[r].epoch);
  }
}

}  // namespace dsv4::cuda
