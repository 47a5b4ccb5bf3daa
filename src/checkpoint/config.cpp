#include "checkpoint/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

using nlohmann::json;

std::string ModelConfig::layer_kind(int layer) const {
  switch (kind(layer)) {
    case AttnKind::SWA: return "SWA";
    case AttnKind::CSA: return "CSA";
    case AttnKind::HCA: return "HCA";
  }
  return "?";
}

namespace {

// Reads j[key] as T if present; returns false if absent. Wrong JSON type -> error naming the key.
template <typename T>
bool get_opt(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    fail("config.json: key '", key, "' has the wrong type (", it->type_name(), ")");
  }
  return true;
}

template <typename T>
T get_req(const json& j, const char* key) {
  T v{};
  if (!get_opt(j, key, v)) fail("config.json: required key '", key, "' is missing");
  return v;
}

template <typename T>
T first_of(const json& j, std::initializer_list<const char*> keys, T dflt, bool required = false) {
  for (const char* k : keys) {
    T v{};
    if (get_opt(j, k, v)) return v;
  }
  if (required) {
    std::ostringstream os;
    for (const char* k : keys) os << "'" << k << "' ";
    fail("config.json: required key missing (one of ", os.str(), ")");
  }
  return dflt;
}

void read_yarn(const json& r, YarnConfig& y) {
  std::string type = r.value("type", r.value("rope_type", std::string("default")));
  if (type == "default" || type == "none") return;
  if (type != "yarn") fail("config.json: unsupported rope scaling type '", type, "' (only yarn is supported)");
  y.enabled = true;
  y.factor = r.value("factor", 1.0);
  y.original_max_position_embeddings = r.value("original_max_position_embeddings", int64_t{0});
  if (r.contains("beta_fast") && !r["beta_fast"].is_null()) y.beta_fast = r["beta_fast"].get<double>();
  if (r.contains("beta_slow") && !r["beta_slow"].is_null()) y.beta_slow = r["beta_slow"].get<double>();
  if (r.contains("mscale") && !r["mscale"].is_null() && r["mscale"].get<double>() != 0.0 &&
      r["mscale"].get<double>() != 1.0)
    fail("config.json: YaRN mscale is not used by DeepSeek-V4 and is not supported");
  if (y.factor <= 0 || y.original_max_position_embeddings <= 0)
    fail("config.json: yarn rope scaling needs factor > 0 and original_max_position_embeddings > 0");
}

}  // namespace

ModelConfig parse_model_config(const json& j) {
  if (!j.is_object()) fail("config.json: top level is not an object");
  ModelConfig c;
  c.vocab_size = first_of<int64_t>(j, {"vocab_size"}, 0, true);
  c.hidden = first_of<int64_t>(j, {"hidden_size", "dim"}, 0, true);
  c.n_layers = first_of<int>(j, {"num_hidden_layers", "n_layers"}, 0, true);
  c.n_heads = first_of<int>(j, {"num_attention_heads", "n_heads"}, 0, true);
  c.head_dim = first_of<int64_t>(j, {"head_dim"}, 0, true);
  c.q_lora_rank = first_of<int64_t>(j, {"q_lora_rank"}, 0, true);
  c.o_groups = first_of<int>(j, {"o_groups"}, 0, true);
  c.o_lora_rank = first_of<int64_t>(j, {"o_lora_rank"}, 0, true);
  c.window = first_of<int>(j, {"sliding_window", "window_size"}, 0, true);
  c.index_n_heads = first_of<int>(j, {"index_n_heads"}, 0, true);
  c.index_head_dim = first_of<int64_t>(j, {"index_head_dim"}, 0, true);
  c.index_topk = first_of<int>(j, {"index_topk"}, 0, true);
  c.n_routed_experts = first_of<int>(j, {"n_routed_experts", "num_local_experts"}, 0, true);
  c.n_shared_experts = first_of<int>(j, {"n_shared_experts"}, 1);
  c.n_experts_per_tok = first_of<int>(j, {"num_experts_per_tok", "n_activated_experts"}, 0, true);
  c.moe_inter = first_of<int64_t>(j, {"moe_intermediate_size", "moe_inter_dim", "intermediate_size"}, 0, true);
  c.routed_scaling_factor = first_of<double>(j, {"routed_scaling_factor", "route_scale"}, 1.0);
  c.swiglu_limit = first_of<double>(j, {"swiglu_limit"}, 0.0);
  c.norm_topk_prob = first_of<bool>(j, {"norm_topk_prob"}, true);
  c.hc_mult = first_of<int>(j, {"hc_mult"}, 4);
  c.hc_sinkhorn_iters = first_of<int>(j, {"hc_sinkhorn_iters"}, 20);
  c.hc_eps = first_of<double>(j, {"hc_eps"}, 1e-6);
  c.rms_eps = first_of<double>(j, {"rms_norm_eps", "norm_eps"}, 1e-6);
  c.max_position_embeddings = first_of<int64_t>(j, {"max_position_embeddings"}, 1048576);
  c.n_mtp_layers = first_of<int>(j, {"num_nextn_predict_layers", "n_mtp_layers"}, 0);
  c.bos_token_id = first_of<int>(j, {"bos_token_id"}, 0);
  c.eos_token_id = j.contains("eos_token_id") && j["eos_token_id"].is_array()
                       ? j["eos_token_id"].at(0).get<int>()
                       : first_of<int>(j, {"eos_token_id"}, 1);
  c.expert_dtype = first_of<std::string>(j, {"expert_dtype"}, "");
  if (j.contains("quantization_config") && j["quantization_config"].is_object())
    c.quant_method = j["quantization_config"].value("quant_method", std::string());

  std::string act = first_of<std::string>(j, {"hidden_act"}, "silu");
  if (act != "silu") fail("config.json: hidden_act '", act, "' is not supported (DeepSeek-V4 uses silu)");
  std::string sf = first_of<std::string>(j, {"scoring_func", "score_func"}, "sqrtsoftplus");
  if (sf == "sqrtsoftplus") c.scoring_func = ScoringFunc::SqrtSoftplus;
  else if (sf == "softmax") c.scoring_func = ScoringFunc::Softmax;
  else if (sf == "sigmoid") c.scoring_func = ScoringFunc::Sigmoid;
  else fail("config.json: unknown scoring_func '", sf, "'");
  std::string topk_method = first_of<std::string>(j, {"topk_method"}, "noaux_tc");
  if (topk_method != "noaux_tc") fail("config.json: unsupported topk_method '", topk_method, "'");
  if (first_of<int>(j, {"num_key_value_heads"}, 1) != 1)
    fail("config.json: num_key_value_heads must be 1 (DeepSeek-V4 has a single latent KV head)");
  if (first_of<bool>(j, {"tie_word_embeddings"}, false)) fail("config.json: tie_word_embeddings=true is not supported");

  // Layer schedule: official compress_ratios (L + MTP entries) or HF layer_types + compress_rates.
  bool hf_style = j.contains("layer_types") && !j.contains("compress_ratios");
  c.source_style = hf_style ? "hf" : "official";
  if (j.contains("compress_ratios")) {
    c.compress_ratios = get_req<std::vector<int>>(j, "compress_ratios");
    size_t want = static_cast<size_t>(c.n_layers + c.n_mtp_layers);
    if (c.compress_ratios.size() == static_cast<size_t>(c.n_layers) && c.n_mtp_layers > 0)
      fail("config.json: compress_ratios has ", c.compress_ratios.size(), " entries; expected num_hidden_layers + ",
           c.n_mtp_layers, " MTP = ", want, " (the last entries describe the MTP blocks)");
    if (c.compress_ratios.size() != want)
      fail("config.json: compress_ratios has ", c.compress_ratios.size(), " entries, expected ", want,
           " (num_hidden_layers ", c.n_layers, " + MTP ", c.n_mtp_layers, ")");
    for (int r : c.compress_ratios)
      c.attn_kinds.push_back(r == 0 ? AttnKind::SWA : r == 4 ? AttnKind::CSA : AttnKind::HCA);
  } else if (j.contains("layer_types")) {
    auto types = get_req<std::vector<std::string>>(j, "layer_types");
    int csa = 4, hca = 128;
    if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
      csa = j["compress_rates"].value("compressed_sparse_attention", 4);
      hca = j["compress_rates"].value("heavily_compressed_attention", 128);
    }
    if (static_cast<int>(types.size()) < c.n_layers)
      fail("config.json: layer_types has ", types.size(), " entries, expected ", c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
      const auto& t = types[static_cast<size_t>(i)];
      if (t == "sliding_attention") c.compress_ratios.push_back(0), c.attn_kinds.push_back(AttnKind::SWA);
      else if (t == "compressed_sparse_attention") c.compress_ratios.push_back(csa), c.attn_kinds.push_back(AttnKind::CSA);
      else if (t == "heavily_compressed_attention") c.compress_ratios.push_back(hca), c.attn_kinds.push_back(AttnKind::HCA);
      else fail("config.json: unknown layer type '", t, "' at layer ", i);
    }
    for (int i = 0; i < c.n_mtp_layers; ++i)  // MTP blocks are SWA-only
      c.compress_ratios.push_back(0), c.attn_kinds.push_back(AttnKind::SWA);
  } else {
    fail("config.json: neither compress_ratios nor layer_types present: the layer schedule is unknown");
  }
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int r = c.compress_ratios[i];
    if (r < 0) fail("config.json: compress ratio ", r, " at layer ", i, " is negative");
    if (r == 1) fail("config.json: compress ratio 1 at layer ", i, " is not valid");
  }

  // Hash layers: official num_hash_layers, or HF mlp_layer_types (a prefix of hash_moe).
  if (j.contains("mlp_layer_types") && !j.contains("num_hash_layers")) {
    auto t = get_req<std::vector<std::string>>(j, "mlp_layer_types");
    int n = 0;
    while (n < static_cast<int>(t.size()) && t[static_cast<size_t>(n)] == "hash_moe") ++n;
    for (size_t i = static_cast<size_t>(n); i < t.size(); ++i)
      if (t[i] == "hash_moe") fail("config.json: hash_moe layers must come first (layer ", i, ")");
    c.n_hash_layers = n;
  } else {
    c.n_hash_layers = first_of<int>(j, {"num_hash_layers", "n_hash_layers"}, 0);
  }

  // RoPE: official (rope_theta, compress_rope_theta, rope_scaling, qk_rope_head_dim) or HF rope_parameters.
  c.rope_theta = first_of<double>(j, {"rope_theta"}, 10000.0);
  c.compress_rope_theta = first_of<double>(j, {"compress_rope_theta"}, 160000.0);
  if (j.contains("qk_rope_head_dim")) {
    c.rope_dim = get_req<int64_t>(j, "qk_rope_head_dim");
  } else if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    double f = j["partial_rotary_factor"].get<double>();
    c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * f + 0.5);
  } else if (j.contains("rope_dim")) {
    c.rope_dim = get_req<int64_t>(j, "rope_dim");
  } else {
    c.rope_dim = 64;
  }
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("main")) {
    const json& rp = j["rope_parameters"];
    c.rope_theta = rp["main"].value("rope_theta", c.rope_theta);
    if (rp.contains("compress")) {
      c.compress_rope_theta = rp["compress"].value("rope_theta", c.compress_rope_theta);
      read_yarn(rp["compress"], c.yarn);
      if (c.yarn.enabled && rp["compress"].contains("attention_factor") &&
          rp["compress"]["attention_factor"].get<double>() != 1.0)
        fail("config.json: compress rope attention_factor must be 1.0 (DeepSeek-V4 uses no YaRN mscale)");
    }
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    read_yarn(j["rope_scaling"], c.yarn);
  } else if (j.contains("rope_factor")) {  // inference/config.json style
    c.yarn.enabled = true;
    c.yarn.factor = get_req<double>(j, "rope_factor");
    c.yarn.original_max_position_embeddings = first_of<int64_t>(j, {"original_seq_len"}, 0, true);
    c.yarn.beta_fast = first_of<double>(j, {"beta_fast"}, 32.0);
    c.yarn.beta_slow = first_of<double>(j, {"beta_slow"}, 1.0);
  }

  // Consistency.
  auto pos = [](int64_t v, const char* what) {
    if (v <= 0) fail("config.json: ", what, " must be positive (got ", v, ")");
  };
  pos(c.vocab_size, "vocab_size");
  pos(c.hidden, "hidden_size");
  pos(c.n_layers, "num_hidden_layers");
  pos(c.n_heads, "num_attention_heads");
  pos(c.head_dim, "head_dim");
  pos(c.q_lora_rank, "q_lora_rank");
  pos(c.o_groups, "o_groups");
  pos(c.o_lora_rank, "o_lora_rank");
  pos(c.window, "sliding_window");
  pos(c.n_routed_experts, "n_routed_experts");
  pos(c.n_experts_per_tok, "num_experts_per_tok");
  pos(c.moe_inter, "moe_intermediate_size");
  pos(c.hc_mult, "hc_mult");
  pos(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  if (c.rope_dim <= 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
    fail("config.json: rope dim ", c.rope_dim, " must be even, positive and <= head_dim ", c.head_dim);
  if (c.n_heads % c.o_groups != 0)
    fail("config.json: num_attention_heads ", c.n_heads, " is not divisible by o_groups ", c.o_groups);
  if (c.n_experts_per_tok > c.n_routed_experts)
    fail("config.json: num_experts_per_tok ", c.n_experts_per_tok, " > n_routed_experts ", c.n_routed_experts);
  if (c.n_hash_layers < 0 || c.n_hash_layers > c.n_layers)
    fail("config.json: num_hash_layers ", c.n_hash_layers, " out of range [0, ", c.n_layers, "]");
  if (c.n_shared_experts != 0 && c.n_shared_experts != 1)
    fail("config.json: n_shared_experts must be 0 or 1 (got ", c.n_shared_experts, ")");
  bool any_csa = false;
  for (AttnKind k : c.attn_kinds) any_csa |= (k == AttnKind::CSA);
  if (any_csa) {
    pos(c.index_n_heads, "index_n_heads");
    pos(c.index_topk, "index_topk");
    if (c.index_head_dim <= c.rope_dim || c.index_head_dim % 2 != 0)
      fail("config.json: index_head_dim ", c.index_head_dim, " must be even and > rope dim ", c.rope_dim);
  }
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int r = c.compress_ratios[i];
    if (c.attn_kinds[i] != AttnKind::SWA && r < 2) fail("config.json: compress ratio ", r, " at layer ", i, " is not supported");
  }
  if (c.yarn.enabled && c.yarn.beta_fast <= c.yarn.beta_slow)
    fail("config.json: yarn beta_fast must exceed beta_slow");
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open");
  json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(path, ": not valid JSON");
  try {
    return parse_model_config(j);
  } catch (const Error& e) {
    std::string m = e.what();
    const std::string pre = "config.json: ";
    fail(path, ": ", m.rfind(pre, 0) == 0 ? m.substr(pre.size()) : m);
  } catch (const json::exception& e) {
    fail(path, ": ", e.what());
  }
}

}  // namespace dsv4
