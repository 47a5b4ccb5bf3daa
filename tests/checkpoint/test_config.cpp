// ModelConfig from the official keys and from the HF-transformers keys; inconsistent configs are refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "core/error.h"

namespace dsv4 {
namespace {

using nlohmann::json;

// The real V4-Flash root config.json values (MODEL.md §1.1).
json flash_official() {
  std::vector<int> ratios{0, 0};
  for (int i = 2; i < 43; ++i) ratios.push_back(i % 2 == 0 ? 4 : 128);
  ratios.push_back(0);
  return json{{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}, {"hidden_size", 4096},
              {"num_hidden_layers", 43}, {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512},
              {"qk_rope_head_dim", 64}, {"q_lora_rank", 1024}, {"o_groups", 8}, {"o_lora_rank", 1024},
              {"sliding_window", 128}, {"compress_ratios", ratios}, {"compress_rope_theta", 160000},
              {"rope_theta", 10000},
              {"rope_scaling", {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                                {"beta_fast", 32}, {"beta_slow", 1}}},
              {"max_position_embeddings", 1048576}, {"index_n_heads", 64}, {"index_head_dim", 128},
              {"index_topk", 512}, {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 6},
              {"moe_intermediate_size", 2048}, {"num_hash_layers", 3}, {"scoring_func", "sqrtsoftplus"},
              {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"routed_scaling_factor", 1.5},
              {"swiglu_limit", 10.0}, {"hidden_act", "silu"}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20},
              {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6}, {"vocab_size", 129280}, {"num_nextn_predict_layers", 1},
              {"bos_token_id", 0}, {"eos_token_id", 1}, {"tie_word_embeddings", false},
              {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                                       {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}}},
              {"expert_dtype", "fp4"}};
}

TEST(Config, FlashOfficial) {
  ModelConfig c = parse_model_config(flash_official());
  EXPECT_EQ(c.n_layers, 43);
  EXPECT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.kind(0), AttnKind::SWA);
  EXPECT_EQ(c.kind(1), AttnKind::SWA);
  EXPECT_EQ(c.kind(2), AttnKind::CSA);
  EXPECT_EQ(c.kind(3), AttnKind::HCA);
  EXPECT_EQ(c.ratio(3), 128);
  EXPECT_EQ(c.kind(42), AttnKind::CSA);  // pitfall 13: layer 42 is CSA
  EXPECT_EQ(c.kind(43), AttnKind::SWA);  // MTP
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_FALSE(c.is_hash_layer(43));  // the MTP block is score-routed
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.nope_dim(), 448);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.factor, 16.0);
  EXPECT_EQ(c.yarn.original_max_position_embeddings, 65536);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.heads_per_group(), 8);
  EXPECT_EQ(c.hc_mix(), 24);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.source_style, "official");
}

TEST(Config, ProScheduleStartsWithHca) {
  json j = flash_official();
  std::vector<int> ratios{128, 128};
  for (int i = 2; i < 61; ++i) ratios.push_back(i % 2 == 0 ? 4 : 128);
  ratios.push_back(0);
  j["num_hidden_layers"] = 61;
  j["compress_ratios"] = ratios;
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.kind(0), AttnKind::HCA);
  EXPECT_EQ(c.kind(1), AttnKind::HCA);
  EXPECT_EQ(c.kind(60), AttnKind::CSA);
}

TEST(Config, HfKeys) {
  json j = flash_official();
  for (const char* k : {"compress_ratios", "num_hash_layers", "rope_scaling", "qk_rope_head_dim"}) j.erase(k);
  j["layer_types"] = {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"};
  j["num_hidden_layers"] = 3;
  j["mlp_layer_types"] = {"hash_moe", "moe", "moe"};
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 16}};
  j["partial_rotary_factor"] = 0.125;
  j["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                          {"compress", {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"factor", 16},
                                        {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
                                        {"beta_slow", 1}, {"attention_factor", 1.0}}}};
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.source_style, "hf");
  ASSERT_EQ(c.compress_ratios.size(), 4u);  // + MTP
  EXPECT_EQ(c.ratio(2), 16);
  EXPECT_EQ(c.kind(1), AttnKind::CSA);
  EXPECT_EQ(c.n_hash_layers, 1);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.yarn.original_max_position_embeddings, 4096);
}

void expect_error(json j, const std::string& needle) {
  try {
    parse_model_config(j);
    ADD_FAILURE() << "accepted a config that should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Config, RefusesInconsistentConfigs) {
  json j = flash_official();
  j["compress_ratios"].erase(j["compress_ratios"].size() - 1);  // L entries instead of L + 1
  expect_error(j, "compress_ratios");
  j = flash_official();
  j["num_attention_heads"] = 60;  // not divisible by o_groups 8
  expect_error(j, "o_groups");
  j = flash_official();
  j["scoring_func"] = "softmax_v2";
  expect_error(j, "scoring_func");
  j = flash_official();
  j.erase("hidden_size");
  expect_error(j, "hidden_size");
  j = flash_official();
  j["hidden_size"] = "4096";
  expect_error(j, "hidden_size");
  j = flash_official();
  j["qk_rope_head_dim"] = 63;
  expect_error(j, "rope");
  j = flash_official();
  j["num_key_value_heads"] = 8;
  expect_error(j, "num_key_value_heads");
  j = flash_official();
  j["rope_scaling"]["type"] = "longrope";
  expect_error(j, "rope scaling");
  j = flash_official();
  j["num_experts_per_tok"] = 300;
  expect_error(j, "num_experts_per_tok");
  expect_error(json::array(), "not an object");
}

}  // namespace
}  // namespace dsv4
