#pragma once
// The DeepSeek-V4 tensor inventory (MODEL.md §3.2–3.3): resolves every tensor the forward pass needs from a
// checkpoint in the official layout (primary) or the HF-transformers layout (§3.7), detects each linear's storage
// format, and validates shapes. Missing, unexpected or mis-shaped tensors are collected and reported in ONE error.
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/linear.h"
#include "checkpoint/safetensors.h"

namespace dsv4 {

using ckpt::TensorView;

struct HcWeights {
  const TensorView* fn = nullptr;     // F32 [mix, hc*d]
  const TensorView* base = nullptr;   // F32 [mix]
  const TensorView* scale = nullptr;  // F32 [3] (or [1] for the head)
};

struct CompressorWeights {
  int ratio = 0;
  int64_t width = 0;  // c: 512-class (main) or index_head_dim (indexer)
  bool overlap = false;
  LinearRef wkv, wgate;          // [coff*c, d]
  const TensorView* ape = nullptr;   // F32 [ratio, coff*c]
  const TensorView* norm = nullptr;  // [c]
};

struct IndexerWeights {
  LinearRef wq_b;          // [n_heads*head_dim, q_lora]
  LinearRef weights_proj;  // [n_heads, d]
  CompressorWeights comp;
};

struct ExpertWeights {
  LinearRef w1, w2, w3;
};

struct LayerWeights {
  int index = 0;  // layer id (L for the MTP block)
  AttnKind kind = AttnKind::SWA;
  bool hash = false;
  HcWeights hc_attn, hc_ffn;
  const TensorView* attn_norm = nullptr;
  const TensorView* ffn_norm = nullptr;
  const TensorView* attn_sink = nullptr;
  LinearRef wq_a, wq_b, wkv, wo_a, wo_b;
  const TensorView* q_norm = nullptr;
  const TensorView* kv_norm = nullptr;
  std::optional<CompressorWeights> compressor;
  std::optional<IndexerWeights> indexer;
  LinearRef gate;                         // router [E, d]
  const TensorView* gate_bias = nullptr;  // score-routed layers
  const TensorView* tid2eid = nullptr;    // hash layers: I64/I32 [vocab, k]
  std::vector<ExpertWeights> experts;
  std::optional<ExpertWeights> shared;
  // MTP block only.
  LinearRef e_proj, h_proj;
  const TensorView* enorm = nullptr;
  const TensorView* hnorm = nullptr;
  const TensorView* mtp_norm = nullptr;
  HcWeights mtp_hc_head;
};

struct ModelWeights {
  std::string layout;  // "official" or "hf"
  const TensorView* embed = nullptr;
  LinearRef head;
  const TensorView* norm = nullptr;
  HcWeights hc_head;
  std::vector<LayerWeights> layers;
  std::optional<LayerWeights> mtp;
  std::vector<const LinearRef*> all_linears() const;
  // Synthetic views (slices of HF stacked expert tensors) live here so TensorView pointers stay valid.
  std::shared_ptr<std::deque<ckpt::HeaderEntry>> synthetic_entries;
  std::shared_ptr<std::deque<TensorView>> synthetic_views;
  // Storage of derived weights (tensor-parallel shards, synthetic benchmark weights) that their views point into.
  std::vector<std::shared_ptr<void>> owned;
};

ModelWeights resolve_model_weights(const ckpt::Checkpoint& ck, const ModelConfig& cfg);

// A hash layer's tid2eid table (I64 or I32 on disk) as int32 [vocab * experts_per_tok], every id checked to be an
// expert of the model (an out-of-range id is an error naming the tensor, not a silent clamp).
std::vector<int32_t> read_tid2eid(const TensorView& t, int n_routed_experts);

}  // namespace dsv4
