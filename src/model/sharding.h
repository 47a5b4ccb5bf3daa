#pragma once
// Tensor-parallel sharding of DeepSeek-V4 for batch-1 latency (GPU_KERNELS.md §7, issue 8): query heads split (wq_b,
// attn_sink and wo_a by head groups, wo_b by its input + all-reduce), every routed and shared expert split along its
// intermediate dim (w1/w3 rows, w2 columns + all-reduce) so each token's experts stay balanced, LM head split by
// vocabulary; everything else replicated. Plus the memory plan per GPU (weights + KV state) for any TP degree.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "model/inventory.h"

namespace dsv4 {

enum class Split { Replicated, Rows, Cols };
const char* split_name(Split s);

// How the named tensor (official name, weight or scale companion) is split across TP ranks.
Split shard_split(const std::string& name);
// Rank-independent shard shape for `tp` ranks. Throws dsv4::Error if the split dim does not divide evenly or would
// cut a 128x128 FP8 scale tile (checked on the scale companions, whose rows/cols are tiles).
std::vector<int64_t> shard_shape(const InventoryTensor& t, int tp);
// Checks the config can be split tp ways at all (heads, o_groups, vocab, expert widths).
void check_tp(const ModelConfig& c, int tp);

struct KvLayout {
  const char* name;
  int64_t main_entry_bytes;     // one compressed / window KV entry
  int64_t indexer_entry_bytes;  // one indexer key
};
// The reference BF16 layout (1024 + 256 B), the FP8 layout with FP8 indexer keys (584 + 132 B), and the lossless
// compact layout (584 + 68 B MXFP4 indexer keys), MODEL.md §6.1-6.2.
std::vector<KvLayout> kv_layouts();
// The layout the CUDA backend uses today: fp32 entries (head_dim x 4 B, index_head_dim x 4 B).
KvLayout cuda_kv_layout(const ModelConfig& c);

struct MemoryPlan {
  int tp = 1;
  uint64_t weights_replicated = 0;   // bytes every rank holds
  uint64_t weights_sharded = 0;      // bytes of one rank's shards
  uint64_t weights_per_gpu() const { return weights_replicated + weights_sharded; }
  // What the CUDA backend holds today: FP8 block-scale tensors widened to fp32 (4 B per scale instead of 1), FP4 block
  // scales and everything else as stored. Its KV state is fp32 too (see cuda_kv_layout).
  uint64_t weights_device_per_gpu = 0;
  int64_t kv_bytes_per_token = 0;    // compressed KV + indexer keys per context token (replicated on every rank)
  uint64_t kv_fixed_per_sequence = 0;  // window rings + compressor running state (fp32)
  int64_t max_context = 0;
  int sequences = 1;
  uint64_t kv_per_gpu() const {
    return (static_cast<uint64_t>(kv_bytes_per_token) * static_cast<uint64_t>(max_context) + kv_fixed_per_sequence) *
           static_cast<uint64_t>(sequences);
  }
  uint64_t total_per_gpu() const { return weights_per_gpu() + kv_per_gpu(); }
  int allreduces_per_layer = 0;
};

MemoryPlan plan_memory(const ModelConfig& c, const std::vector<InventoryTensor>& inv, int tp, int64_t max_context,
                       int sequences, const KvLayout& kv);

}  // namespace dsv4
