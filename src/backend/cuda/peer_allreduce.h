// One-shot all-reduce over peer-to-peer memory (NVLink) for the small all-reduces of tensor-parallel decode.
//
// Why: `ncclAllReduce` of the 16 KB / 112 KB decode buffers measured 23-27 us on the H200 pair (with any NCCL_PROTO /
// NCCL_ALGO; NVLink multicast is off there), two per layer = ~46 us of a ~273 us layer. Here each rank writes its
// partial sums straight into every peer's receive area as LL lines (each value next to the all-reduce's epoch, so a
// landed line is its own flag), waits for every peer's lines and sums the N partials in rank order: one kernel, one
// NVLink write per peer, and the same bits on every rank.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4::cuda {

constexpr int kPeerMaxRanks = 8;

// What one rank's kernel needs (plain pointers; passed by value to the kernel).
struct PeerReduceRank {
  float* recv[kPeerMaxRanks] = {};      // rank q's receive area on GPU q: [2 parities][n ranks][cap / 2] 16-byte lines
                                        // {v0, epoch, v1, epoch}
  uint32_t* epoch = nullptr;            // this rank's all-reduce counter (device memory: graph replays advance it)
  uint32_t* done = nullptr;             // blocks of the current all-reduce that finished (the last one bumps epoch)
  int rank = 0, n = 0;
  size_t cap = 0;                       // floats per (parity, rank) slot; larger all-reduces use NCCL
};

// The areas of all ranks. Created by the tensor-parallel backend when every pair of its GPUs has peer access.
class PeerReduce {
 public:
  // Enables peer access between all pairs and allocates the areas; throws if a pair has no peer access.
  PeerReduce(const std::vector<int>& devices, size_t cap_floats);
  ~PeerReduce();
  PeerReduce(const PeerReduce&) = delete;
  PeerReduce& operator=(const PeerReduce&) = delete;
  const PeerReduceRank& rank(size_t r) const { return ranks_[r]; }
  static bool available(const std::vector<int>& devices);  // 2..8 GPUs and every ordered pair has peer access

 private:
  std::vector<int> devices_;
  std::vector<PeerReduceRank> ranks_;
};

// What the all-reduce kernel does with the sums (in place of a kernel after it): None: buf = the sums; Round: buf =
// BF16(sums) (round_bf16); SumRows (the MoE's slots of one decode token): buf is rows x (count / rows) and out[j] =
// moe_reduce's sum over rows r of [official: BF16] sums[r][j] in double, [official] BF16 -- buf is left as it was.
struct PeerEpilogue {
  enum Kind { None, Round, SumRows } kind = None;
  float* out = nullptr;
  int rows = 1;
  bool official = false;
};

// buf[0..count) = the sum over ranks of every rank's buf, on the calling rank's stream. Every rank must call it, in the
// same order, with the same count (<= cap, a multiple of 4; buf 16-byte aligned). Capturable in CUDA graphs. A peer
// that never arrives traps the kernel after ~20 s (a CUDA error instead of a hang).
void peer_all_reduce(const PeerReduceRank& p, float* buf, size_t count, cudaStream_t s, const PeerEpilogue& ep = {});

}  // namespace dsv4::cuda
