#pragma once
#include <memory>

#include "model/backend.h"

namespace dsv4 {
// The CUDA backend for Hopper (sm_90a): implements the DeepSeek-V4 op interface on one GPU.
struct CudaOptions {
  // Single-token steps of Forward::forward are captured once per (activation buffers, sequence, with/without LM
  // head) into a CUDA graph and replayed (Backend::begin_decode_step). Off: every step launches its kernels one by one
  // (same kernels in the same order; for A/B tests and benchmarks).
  bool decode_graphs = true;
};
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& opts = {});
// How many decode steps a CUDA backend has captured into graphs and replayed from them (throws for other backends).
struct CudaGraphStats {
  int captures = 0, replays = 0;
};
CudaGraphStats cuda_graph_stats(const Backend& b);
}  // namespace dsv4
