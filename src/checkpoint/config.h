#pragma once
// ModelConfig: one validated description of a DeepSeek-V4 model, parsed from either the official config.json keys
// (compress_ratios, rope_scaling, num_hash_layers, qk_rope_head_dim, ...) or the HF-transformers keys (layer_types,
// mlp_layer_types, compress_rates, rope_parameters, partial_rotary_factor). MODEL.md §1.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

enum class ScoringFunc { SqrtSoftplus, Softmax, Sigmoid };

// SWA: sliding window only. CSA: overlapping compressor (ratio 4 in the releases) + lightning indexer top-k.
// HCA: non-overlapping compressor, attend to every compressed entry.
enum class AttnKind { SWA, CSA, HCA };

struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden = 0;        // d
  int n_layers = 0;          // L (main layers, MTP excluded)
  int n_heads = 0;           // H
  int64_t head_dim = 0;      // D (K = V width)
  int64_t rope_dim = 0;      // R: RoPE on the last R dims of every head
  int64_t q_lora_rank = 0;
  int o_groups = 0;          // G
  int64_t o_lora_rank = 0;
  int window = 0;            // sliding window incl. the current token
  std::vector<int> compress_ratios;  // L + n_mtp entries (the last ones describe MTP blocks)
  std::vector<AttnKind> attn_kinds;  // same length; official configs: 0 -> SWA, 4 -> CSA, other -> HCA
  double rope_theta = 10000.0;            // main profile (ratio-0 layers and MTP)
  double compress_rope_theta = 160000.0;  // compress profile (ratio > 0 layers)
  YarnConfig yarn;                        // applies to the compress profile only
  int index_n_heads = 0;
  int64_t index_head_dim = 0;
  int index_topk = 0;
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_experts_per_tok = 0;
  int64_t moe_inter = 0;     // I
  int n_hash_layers = 0;
  ScoringFunc scoring_func = ScoringFunc::SqrtSoftplus;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;  // 0 = no clamp
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  int n_mtp_layers = 0;
  int bos_token_id = 0;
  int eos_token_id = 1;
  std::string expert_dtype;   // "fp4", "fp8" or "" (absent)
  std::string quant_method;   // quantization_config.quant_method or ""
  std::string source_style;   // "official" or "hf"

  // Derived helpers.
  int ratio(int layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
  AttnKind kind(int layer) const { return attn_kinds.at(static_cast<size_t>(layer)); }
  bool is_hash_layer(int layer) const { return layer < n_hash_layers; }  // MTP (layer >= L) is never hash-routed
  int64_t nope_dim() const { return head_dim - rope_dim; }
  int heads_per_group() const { return n_heads / o_groups; }
  int hc_mix() const { return (2 + hc_mult) * hc_mult; }
  std::string layer_kind(int layer) const;  // "SWA", "CSA", "HCA"
};

// Parses and validates; throws dsv4::Error with a clear message on inconsistent configs.
ModelConfig parse_model_config(const nlohmann::json& j);
ModelConfig load_model_config(const std::string& config_json_path);

}  // namespace dsv4
