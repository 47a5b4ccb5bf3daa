// Probe: what does one token's logits download (129,280 floats = 517 KB, Backend::download_f32 into the session's
// pageable std::vector) cost, and what would the alternatives cost? Median of 200 of each, after warm-up:
//   pageable   cudaMemcpyAsync into pageable memory + stream sync (what download_f32 does)
//   pinned     into a cudaMallocHost buffer + sync (the copy alone)
//   pin+copy   into pinned + sync, then memcpy into the pageable vector (a staging buffer in the backend)
//   pin+pipe   4 chunks into pinned with an event each, each memcpy'd as soon as its event completes
//   registered into the pageable vector after cudaHostRegister (registration excluded)
//   argmax     a one-block argmax kernel over the device logits + a 4-byte download (greedy on the GPU, lower bound)
// Build/run on the GPU machine: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a logits_download_probe.cu -o p && ./p
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__global__ void fill(float* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = __sinf(i * 0.37f) * 7.0f;
}

// One block of 1024 threads: the max and its lowest index.
__global__ void argmax1(const float* p, int n, int* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  float bv = -INFINITY;
  int bi = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = p[i];
    if (v > bv) bv = v, bi = i;
  }
  for (int o = 16; o; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int j = __shfl_xor_sync(0xffffffffu, bi, o);
    if (v > bv || (v == bv && j < bi)) bv = v, bi = j;
  }
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x < 32) {
    bv = sv[threadIdx.x], bi = si[threadIdx.x];
    for (int o = 16; o; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, bv, o);
      const int j = __shfl_xor_sync(0xffffffffu, bi, o);
      if (v > bv || (v == bv && j < bi)) bv = v, bi = j;
    }
    if (threadIdx.x == 0) *out = bi;
  }
}

static double median_us(const std::function<void()>& f, int reps = 200) {
  for (int i = 0; i < 20; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const int V = 129280;
  const size_t bytes = static_cast<size_t>(V) * 4;
  float* d = nullptr;
  int* di = nullptr;
  float* pin = nullptr;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMalloc(&di, 4));
  CK(cudaMallocHost(&pin, bytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill<<<264, 256, 0, s>>>(d, V);
  CK(cudaStreamSynchronize(s));
  std::vector<float> host(V), reg(V);
  int id = -1;
  cudaEvent_t ev[4];
  for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  bool ok = true;
  auto chk = [&](cudaError_t e) { if (e != cudaSuccess) ok = false; };

  const double t_page = median_us([&] { chk(cudaMemcpyAsync(host.data(), d, bytes, cudaMemcpyDeviceToHost, s)); chk(cudaStreamSynchronize(s)); });
  const double t_pin = median_us([&] { chk(cudaMemcpyAsync(pin, d, bytes, cudaMemcpyDeviceToHost, s)); chk(cudaStreamSynchronize(s)); });
  const double t_pincopy = median_us([&] {
    chk(cudaMemcpyAsync(pin, d, bytes, cudaMemcpyDeviceToHost, s));
    chk(cudaStreamSynchronize(s));
    std::memcpy(host.data(), pin, bytes);
  });
  const double t_pipe = median_us([&] {
    const size_t c = bytes / 4;  // V is a multiple of 4 floats x 4
    for (int k = 0; k < 4; ++k) {
      chk(cudaMemcpyAsync(reinterpret_cast<char*>(pin) + k * c, reinterpret_cast<const char*>(d) + k * c, c, cudaMemcpyDeviceToHost, s));
      chk(cudaEventRecord(ev[k], s));
    }
    for (int k = 0; k < 4; ++k) {
      chk(cudaEventSynchronize(ev[k]));
      std::memcpy(reinterpret_cast<char*>(host.data()) + k * c, reinterpret_cast<const char*>(pin) + k * c, c);
    }
  });
  const double t_memcpy = median_us([&] { std::memcpy(host.data(), pin, bytes); });
  CK(cudaHostRegister(reg.data(), bytes, cudaHostRegisterDefault));
  const double t_reg = median_us([&] { chk(cudaMemcpyAsync(reg.data(), d, bytes, cudaMemcpyDeviceToHost, s)); chk(cudaStreamSynchronize(s)); });
  const double t_arg = median_us([&] {
    argmax1<<<1, 1024, 0, s>>>(d, V, di);
    chk(cudaMemcpyAsync(&id, di, 4, cudaMemcpyDeviceToHost, s));
    chk(cudaStreamSynchronize(s));
  });
  const double t_empty = median_us([&] { chk(cudaMemcpyAsync(&id, di, 4, cudaMemcpyDeviceToHost, s)); chk(cudaStreamSynchronize(s)); });
  CK(cudaHostUnregister(reg.data()));
  if (!ok) { std::printf("a CUDA call failed in the timed loops\n"); return 1; }
  // The copies must have moved the right values.
  std::vector<float> ref(V);
  CK(cudaMemcpy(ref.data(), d, bytes, cudaMemcpyDeviceToHost));
  if (std::memcmp(ref.data(), host.data(), bytes) != 0 || std::memcmp(ref.data(), reg.data(), bytes) != 0) { std::printf("copy mismatch\n"); return 1; }
  const int want = static_cast<int>(std::max_element(ref.begin(), ref.end()) - ref.begin());
  if (id != want) { std::printf("argmax mismatch: %d vs %d\n", id, want); return 1; }
  std::printf("[logits-download] %d floats (%zu KB), median of 200, us:\n", V, bytes / 1024);
  std::printf("  pageable %.1f | pinned %.1f | pinned + memcpy %.1f | pinned 4-chunk pipeline %.1f | host memcpy alone %.1f | registered %.1f\n",
              t_page, t_pin, t_pincopy, t_pipe, t_memcpy, t_reg);
  std::printf("  argmax kernel + 4-byte download %.1f | 4-byte download alone %.1f\n", t_arg, t_empty);
  return 0;
}
