#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/backend.h"

namespace dsv4 {
// The CUDA backend for Hopper (sm_90a): implements the DeepSeek-V4 op interface on one GPU.
struct CudaOptions {
  // Single-token steps of Forward::forward are captured once per (activation buffers, sequence, with/without LM
  // head) into a CUDA graph and replayed (Backend::begin_decode_step). Off: every step launches its kernels one by one
  // (same kernels in the same order; for A/B tests and benchmarks).
  bool decode_graphs = true;
  int device = 0;  // CUDA device ordinal the backend allocates on and launches to
  // Tensor parallelism (set by make_tp_backend): this backend is rank tp_rank of tp_size, is loaded with that rank's
  // weight shards (model/shard_weights.h) and completes the split ops through NCCL on nccl_comm (an ncclComm_t):
  // all-reduce after wo_b and after the experts, all-gather of the vocabulary-split logits.
  int tp_rank = 0, tp_size = 1;
  void* nccl_comm = nullptr;
  // TP with peer access between all GPUs: this rank's cuda::PeerReduceRank (peer_allreduce.h). All-reduces of up to
  // its capacity (every decode all-reduce) run as one peer-to-peer kernel instead of ncclAllReduce.
  const void* peer_reduce = nullptr;
  // Benchmarks: time every op of a decode step with CUDA events (also inside replayed graphs); see cuda_op_profile.
  bool profile_ops = false;
};
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& opts = {});
// How many decode steps a CUDA backend has captured into graphs and replayed from them (throws for other backends).
struct CudaGraphStats {
  int captures = 0, replays = 0;
};
CudaGraphStats cuda_graph_stats(const Backend& b);

// One process driving `devices` GPUs with tensor parallelism (issue 8): the Backend interface of a single GPU, each op
// issued to every rank from the calling thread (CUDA launches are asynchronous; collectives of all ranks are issued
// in one NCCL group). Loading slices the weights per rank. Throws if the model does not split tp ways or the build
// has no NCCL.
std::unique_ptr<Backend> make_tp_backend(const std::vector<int>& devices, const CudaOptions& opts = {});
bool tp_available();  // the build has NCCL
// GPU milliseconds per op class of the last decode step (profile_ops on; rank 0 under TP), in op order.
std::vector<std::pair<std::string, double>> cuda_op_profile(Backend& b);
// Turns op profiling on/off for decode steps recorded from now on (every rank under TP). A recording keeps its events:
// use a separate Forward (its own graph) for profiled and unprofiled timing.
void cuda_set_op_profiling(Backend& b, bool on);
// Eager (non-graph) ops, e.g. prefill chunks: GPU milliseconds per op class summed over every op issued since
// cuda_set_eager_profiling(b, true) (events around each op; rank 0 under TP), in first-seen order.
void cuda_set_eager_profiling(Backend& b, bool on);
std::vector<std::pair<std::string, double>> cuda_eager_profile(Backend& b);
// Tensor parallelism: median microseconds of one all-reduce of `floats` fp32 values across all ranks, issued
// back to back (as in a decode graph), through the path the backend uses for that size (cuda_allreduce_kind);
// 0 for a single GPU.
double cuda_allreduce_us(Backend& b, size_t floats, int reps = 200);
const char* cuda_allreduce_kind(Backend& b, size_t floats);  // "peer one-shot" or "ncclAllReduce"
// Streaming-read bandwidth of `device` in bytes/s: median of 10 reads of `bytes`.
double cuda_read_bandwidth(int device, size_t bytes);
// cudaProfilerStart / cudaProfilerStop: brackets work for an external profiler started with collection off
// (`ncu --profile-from-start off`, tools/gpu/profile_decode.sh).
void cuda_profiler_range(bool start);
// Decode tracing (cuda::trace_* in ops.h), per GPU (under TP: per rank's device): the kernels launched while
// recording (names, in order), and each kernel's dependency-release time stamp while tracing (`dsv4 bench
// --trace-steps`).
void cuda_trace_record_launches(bool on);
std::vector<std::string> cuda_trace_launch_names(int device);
void cuda_trace_begin(int64_t capacity, const std::vector<int>& devices);
std::vector<uint64_t> cuda_trace_end(int device);

namespace cuda_detail {  // between the single-GPU backend and the TP backend
std::vector<std::pair<std::string, double>> op_profile(Backend& rank);
void set_profiling(Backend& rank, bool on);
void set_eager_profiling(Backend& rank, bool on);
std::vector<std::pair<std::string, double>> eager_profile(Backend& rank);
void gather_logits(Backend& rank, float* logits);  // after the NCCL group that ran head()/mtp_head()
void finish_collective(Backend& rank);              // after the NCCL group that ran attn_out()/moe()
void launch_deferred_collective(Backend& rank);     // the peer all-reduce those ops deferred (before finish_collective)
uint64_t weight_bytes(const Backend& rank);
}  // namespace cuda_detail

// Bytes of device memory the backend's weights occupy (stored formats, FP8 scales as fp32) on its GPU; per rank for TP.
std::vector<uint64_t> cuda_weight_bytes(const Backend& b);
}  // namespace dsv4
