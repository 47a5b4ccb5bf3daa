#include "model/inventory.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using ckpt::DType;

int64_t InventoryTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
uint64_t InventoryTensor::bytes() const { return static_cast<uint64_t>(numel()) * ckpt::dtype_size(dtype); }

namespace {

struct Builder {
  std::vector<InventoryTensor>& out;
  void add(std::string name, std::vector<int64_t> shape, DType t) { out.push_back({std::move(name), std::move(shape), t}); }
  // A linear "<base>.weight" [o, i] and its scale companions in format f.
  void linear(const std::string& base, int64_t o, int64_t i, WeightFormat f) {
    switch (f) {
      case WeightFormat::F32: add(base + ".weight", {o, i}, DType::F32); break;
      case WeightFormat::BF16: add(base + ".weight", {o, i}, DType::BF16); break;
      case WeightFormat::F16: add(base + ".weight", {o, i}, DType::F16); break;
      case WeightFormat::FP8_E8M0:
      case WeightFormat::FP8_F32:
        add(base + ".weight", {o, i}, DType::F8_E4M3);
        add(base + ".scale", {(o + 127) / 128, (i + 127) / 128}, f == WeightFormat::FP8_E8M0 ? DType::F8_E8M0 : DType::F32);
        break;
      case WeightFormat::MXFP4:
        add(base + ".weight", {o, i / 2}, DType::I8);
        add(base + ".scale", {o, i / 32}, DType::F8_E8M0);
        break;
      case WeightFormat::NVFP4:
        add(base + ".weight", {o, i / 2}, DType::U8);
        add(base + ".weight_scale", {o, i / 16}, DType::F8_E4M3);
        add(base + ".weight_scale_2", {}, DType::F32);
        add(base + ".input_scale", {}, DType::F32);
        break;
    }
  }
};

void layer(Builder& b, const ModelConfig& c, const ReleaseFormat& f, int li, const std::string& p, bool mtp) {
  const int64_t d = c.hidden, hc = c.hc_mult, mix = c.hc_mix();
  for (const char* site : {"attn", "ffn"}) {
    b.add(p + "hc_" + site + "_fn", {mix, hc * d}, DType::F32);
    b.add(p + "hc_" + site + "_base", {mix}, DType::F32);
    b.add(p + "hc_" + site + "_scale", {3}, DType::F32);
  }
  b.add(p + "attn_norm.weight", {d}, DType::BF16);
  b.add(p + "ffn_norm.weight", {d}, DType::BF16);
  b.add(p + "attn.attn_sink", {c.n_heads}, DType::F32);
  b.linear(p + "attn.wq_a", c.q_lora_rank, d, f.dense);
  b.add(p + "attn.q_norm.weight", {c.q_lora_rank}, DType::BF16);
  b.linear(p + "attn.wq_b", c.n_heads * c.head_dim, c.q_lora_rank, f.dense);
  b.linear(p + "attn.wkv", c.head_dim, d, f.dense);
  b.add(p + "attn.kv_norm.weight", {c.head_dim}, DType::BF16);
  b.linear(p + "attn.wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups, f.dense);
  b.linear(p + "attn.wo_b", d, c.o_groups * c.o_lora_rank, f.dense);
  auto compressor = [&](const std::string& q, int64_t width, bool overlap) {
    const int64_t co = overlap ? 2 : 1;
    b.add(q + "wkv.weight", {co * width, d}, DType::BF16);
    b.add(q + "wgate.weight", {co * width, d}, DType::BF16);
    b.add(q + "ape", {c.ratio(li), co * width}, DType::F32);
    b.add(q + "norm.weight", {width}, DType::BF16);
  };
  if (c.kind(li) != AttnKind::SWA) compressor(p + "attn.compressor.", c.head_dim, c.kind(li) == AttnKind::CSA);
  if (c.kind(li) == AttnKind::CSA) {
    b.linear(p + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, f.dense);
    b.add(p + "attn.indexer.weights_proj.weight", {c.index_n_heads, d}, DType::BF16);
    compressor(p + "attn.indexer.compressor.", c.index_head_dim, true);
  }
  b.add(p + "ffn.gate.weight", {c.n_routed_experts, d}, DType::BF16);
  if (!mtp && c.is_hash_layer(li)) b.add(p + "ffn.gate.tid2eid", {c.vocab_size, c.n_experts_per_tok}, DType::I64);
  else b.add(p + "ffn.gate.bias", {c.n_routed_experts}, DType::F32);
  const WeightFormat ef = mtp && f.experts == WeightFormat::NVFP4 ? WeightFormat::MXFP4 : f.experts;
  for (int e = 0; e < c.n_routed_experts; ++e) {
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    b.linear(q + "w1", c.moe_inter, d, ef);
    b.linear(q + "w2", d, c.moe_inter, ef);
    b.linear(q + "w3", c.moe_inter, d, ef);
  }
  if (c.n_shared_experts > 0) {
    const int64_t I = c.moe_inter * c.n_shared_experts;
    b.linear(p + "ffn.shared_experts.w1", I, d, f.dense);
    b.linear(p + "ffn.shared_experts.w2", d, I, f.dense);
    b.linear(p + "ffn.shared_experts.w3", I, d, f.dense);
  }
  if (mtp) {
    b.linear(p + "e_proj", d, d, f.dense);
    b.linear(p + "h_proj", d, d, f.dense);
    b.add(p + "enorm.weight", {d}, DType::BF16);
    b.add(p + "hnorm.weight", {d}, DType::BF16);
    b.add(p + "norm.weight", {d}, DType::BF16);
    b.add(p + "hc_head_fn", {hc, hc * d}, DType::F32);
    b.add(p + "hc_head_base", {hc}, DType::F32);
    b.add(p + "hc_head_scale", {1}, DType::F32);
  }
}

}  // namespace

std::vector<InventoryTensor> official_inventory(const ModelConfig& c, const ReleaseFormat& f) {
  std::vector<InventoryTensor> out;
  Builder b{out};
  const int64_t d = c.hidden, hc = c.hc_mult;
  b.add("embed.weight", {c.vocab_size, d}, DType::BF16);
  b.add("head.weight", {c.vocab_size, d}, DType::BF16);
  b.add("norm.weight", {d}, DType::BF16);
  b.add("hc_head_fn", {hc, hc * d}, DType::F32);
  b.add("hc_head_base", {hc}, DType::F32);
  b.add("hc_head_scale", {1}, DType::F32);
  for (int i = 0; i < c.n_layers; ++i) layer(b, c, f, i, "layers." + std::to_string(i) + ".", false);
  if (f.with_mtp)
    for (int k = 0; k < c.n_mtp_layers; ++k) layer(b, c, f, c.n_layers + k, "mtp." + std::to_string(k) + ".", true);
  return out;
}

static ModelConfig release_config(bool pro) {
  using nlohmann::json;
  const int L = pro ? 61 : 43;
  std::vector<int> ratios;
  for (int i = 0; i < L; ++i) ratios.push_back(i < 2 ? (pro ? 128 : 0) : (i % 2 == 0 ? 4 : 128));
  ratios.push_back(0);
  json j = {{"vocab_size", 129280}, {"hidden_size", pro ? 7168 : 4096}, {"num_hidden_layers", L},
            {"num_attention_heads", pro ? 128 : 64}, {"num_key_value_heads", 1}, {"head_dim", 512},
            {"qk_rope_head_dim", 64}, {"q_lora_rank", pro ? 1536 : 1024}, {"o_groups", pro ? 16 : 8},
            {"o_lora_rank", 1024}, {"sliding_window", 128}, {"compress_ratios", ratios},
            {"compress_rope_theta", 160000}, {"rope_theta", 10000},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                              {"beta_fast", 32}, {"beta_slow", 1}}},
            {"max_position_embeddings", 1048576}, {"index_n_heads", 64}, {"index_head_dim", 128},
            {"index_topk", pro ? 1024 : 512}, {"n_routed_experts", pro ? 384 : 256}, {"n_shared_experts", 1},
            {"num_experts_per_tok", 6}, {"moe_intermediate_size", pro ? 3072 : 2048}, {"num_hash_layers", 3},
            {"scoring_func", "sqrtsoftplus"}, {"routed_scaling_factor", pro ? 2.5 : 1.5}, {"swiglu_limit", 10.0},
            {"hc_mult", 4}, {"hc_sinkhorn_iters", 20}, {"num_nextn_predict_layers", 1}, {"expert_dtype", "fp4"}};
  return parse_model_config(j);
}

ModelConfig flash_config() { return release_config(false); }
ModelConfig pro_config() { return release_config(true); }

}  // namespace dsv4
