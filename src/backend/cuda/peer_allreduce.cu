#include "backend/cuda/peer_allreduce.h"

#include "backend/cuda/ops.h"
#include "core/error.h"

namespace dsv4::cuda {

namespace {

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// One block. Push: my partial -> every peer's slot [parity][my rank]; each thread fences its own writes at system
// scope before the barrier, then thread 0 publishes the epoch in every peer's flag for me (release). Wait: one thread
// per peer polls my flag for that peer (acquire). Sum: the n partials in rank order (mine from buf), the peers' read
// with ld.cv so that no L1 line of the same slot's previous use (two epochs ago) is reused.
__global__ void __launch_bounds__(1024) peer_all_reduce_kernel(PeerReduceRank p, float* buf, size_t count) {
  __shared__ uint32_t ep;
  if (threadIdx.x == 0) {
    ep = *p.epoch + 1;
    *p.epoch = ep;
  }
  __syncthreads();
  const uint32_t e = ep;
  const size_t par = e & 1u;
  const size_t n4 = count / 4;
  const float4* src = reinterpret_cast<const float4*>(buf);
  for (int q = 0; q < p.n; ++q) {
    if (q == p.rank) continue;
    float4* dst = reinterpret_cast<float4*>(p.recv[q] + (par * p.n + p.rank) * p.cap);
    for (size_t i = threadIdx.x; i < n4; i += blockDim.x) dst[i] = src[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    for (int q = 0; q < p.n; ++q)
      if (q != p.rank) store_release_sys(p.flags[q] + p.rank, e);
  if (threadIdx.x < static_cast<unsigned>(p.n) && static_cast<int>(threadIdx.x) != p.rank) {
    const uint32_t* f = p.flags[p.rank] + threadIdx.x;
    const uint64_t t0 = global_ns();
    // Flags only grow (epochs are equal on all ranks: every rank runs the same all-reduces in the same order).
    while (static_cast<int32_t>(load_acquire_sys(f) - e) < 0)
      if (global_ns() - t0 > 20ull * 1000 * 1000 * 1000) __trap();  // a peer never came: error, not a hang
  }
  __syncthreads();
  const float* mine = p.recv[p.rank] + par * p.n * p.cap;
  float4* out = reinterpret_cast<float4*>(buf);
  for (size_t i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int q = 0; q < p.n; ++q) {
      const float4 v = q == p.rank ? src[i] : __ldcv(reinterpret_cast<const float4*>(mine + q * p.cap) + i);
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    out[i] = s;
  }
}

}  // namespace

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
    DSV4_CU(cudaMalloc(&R.recv[r], 2 * static_cast<size_t>(n) * cap_floats * sizeof(float)));
    DSV4_CU(cudaMalloc(&R.flags[r], static_cast<size_t>(n) * sizeof(uint32_t)));
    DSV4_CU(cudaMalloc(&R.epoch, sizeof(uint32_t)));
    DSV4_CU(cudaMemset(R.flags[r], 0, static_cast<size_t>(n) * sizeof(uint32_t)));
    DSV4_CU(cudaMemset(R.epoch, 0, sizeof(uint32_t)));
    DSV4_CU(cudaDeviceSynchronize());
  }
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) {
      ranks_[static_cast<size_t>(r)].recv[q] = ranks_[static_cast<size_t>(q)].recv[q];
      ranks_[static_cast<size_t>(r)].flags[q] = ranks_[static_cast<size_t>(q)].flags[q];
    }
}

PeerReduce::~PeerReduce() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(ranks_[r].recv[r]);
    cudaFree(ranks_[r].flags[r]);
    cudaFree(ranks_[r].epoch);
  }
}

void peer_all_reduce(const PeerReduceRank& p, float* buf, size_t count, cudaStream_t s) {
  if (count == 0) return;
  if (count > p.cap || count % 4 != 0 || (reinterpret_cast<uintptr_t>(buf) & 15u) != 0)
    fail("peer all-reduce: ", count, " floats do not fit (capacity ", p.cap, ", multiple of 4, 16-byte aligned)");
  peer_all_reduce_kernel<<<1, 1024, 0, s>>>(p, buf, count);
  DSV4_CU(cudaGetLastError());
}

}  // namespace dsv4::cuda
