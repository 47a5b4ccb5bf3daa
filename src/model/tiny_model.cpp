#include "model/tiny_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint/linear.h"
#include "checkpoint/quantize.h"
#include "core/error.h"

namespace dsv4 {

namespace {

using ckpt::DType;
using nlohmann::json;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }
  float normal() {
    float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
  std::vector<float> normal_vec(size_t n, float std) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal() * std;
    return v;
  }
};

}  // namespace

void write_tiny_model(const std::string& dir, const TinySpec& sp) {
  WeightFormat dense, expert;
  if (sp.format == "bf16") dense = expert = WeightFormat::BF16;
  else if (sp.format == "fp8") dense = WeightFormat::FP8_E8M0, expert = WeightFormat::MXFP4;
  else if (sp.format == "base") dense = expert = WeightFormat::FP8_F32;
  else if (sp.format == "nvfp4") dense = WeightFormat::FP8_E8M0, expert = WeightFormat::NVFP4;
  else fail("make-tiny: unknown format '", sp.format, "' (bf16, fp8, base, nvfp4)");
  if (sp.schedule != "flash" && sp.schedule != "pro") fail("make-tiny: unknown schedule '", sp.schedule, "'");
  if (sp.layers < 2) fail("make-tiny: need at least 2 layers");

  // Dims: small but with every structural feature (several heads/groups, rope on the last dims, >1 hash layer).
  const bool tp = sp.tp_ready;
  if (sp.hidden < 64 || sp.hidden % 64 != 0) fail("make-tiny: --hidden must be a positive multiple of 64 (got ", sp.hidden, ")");
  const int64_t d = sp.hidden, H = tp ? 8 : 4, D = 128, R = 64, ql = tp ? 128 : 64, G = tp ? 8 : 2, ro = tp ? 128 : 32, E = 8, K = 2,
                I = tp ? 1024 : 64, Hi = 4, Di = 128;
  const int L = sp.layers, hc = 4, mix = (2 + hc) * hc, window = 16, topk = 4, hash_layers = 2;
  std::vector<int> ratios;
  for (int i = 0; i < L; ++i) {
    if (i < 2) ratios.push_back(sp.schedule == "flash" ? 0 : 16);
    else ratios.push_back(i % 2 == 0 ? 4 : 16);
  }
  ratios.push_back(0);  // MTP
  std::filesystem::create_directories(dir);
  Rng rng{sp.seed * 7919 + 17};
  ckpt::SafetensorsWriter w;
  auto lin = [&](const std::string& base, int64_t out, int64_t in, WeightFormat f) {
    add_quantized_linear(w, base, rng.normal_vec(static_cast<size_t>(out * in), 1.0f / std::sqrt(float(in))), out, in, f);
  };
  auto bf16 = [&](const std::string& n, std::vector<int64_t> shape, std::vector<float> v) {
    w.add(n, DType::BF16, std::move(shape), to_bf16_bytes(v));
  };
  auto norm_w = [&](const std::string& n, int64_t len) {
    std::vector<float> v(static_cast<size_t>(len));
    for (auto& x : v) x = 1.0f + 0.1f * rng.normal();
    bf16(n, {len}, v);
  };
  auto f32 = [&](const std::string& n, std::vector<int64_t> shape, float std, float mean = 0.0f) {
    size_t cnt = 1;
    for (auto s : shape) cnt *= static_cast<size_t>(s);
    auto v = rng.normal_vec(cnt, std);
    for (auto& x : v) x += mean;
    w.add_f32(n, std::move(shape), v);
  };
  auto hc_w = [&](const std::string& p, int rows, int nscale) {
    f32(p + "fn", {rows, hc * d}, 0.02f);
    f32(p + "base", {rows}, 0.5f);
    f32(p + "scale", {nscale}, 0.2f, 1.0f);
  };
  auto compressor = [&](const std::string& p, int ratio, int64_t c, bool overlap) {
    int64_t co = overlap ? 2 : 1;
    bf16(p + "wkv.weight", {co * c, d}, rng.normal_vec(static_cast<size_t>(co * c * d), 0.125f));
    bf16(p + "wgate.weight", {co * c, d}, rng.normal_vec(static_cast<size_t>(co * c * d), 0.125f));
    f32(p + "ape", {ratio, co * c}, 0.5f);
    norm_w(p + "norm.weight", c);
  };
  auto layer = [&](const std::string& p, int li, bool mtp) {
    int r = ratios[static_cast<size_t>(li)];
    hc_w(p + "hc_attn_", mix, 3);
    hc_w(p + "hc_ffn_", mix, 3);
    norm_w(p + "attn_norm.weight", d);
    norm_w(p + "ffn_norm.weight", d);
    f32(p + "attn.attn_sink", {H}, 1.0f);
    lin(p + "attn.wq_a", ql, d, dense);
    norm_w(p + "attn.q_norm.weight", ql);
    lin(p + "attn.wq_b", H * D, ql, dense);
    lin(p + "attn.wkv", D, d, dense);
    norm_w(p + "attn.kv_norm.weight", D);
    lin(p + "attn.wo_a", G * ro, H * D / G, dense);
    lin(p + "attn.wo_b", d, G * ro, dense);
    if (r > 0) {
      compressor(p + "attn.compressor.", r, D, r == 4);
      if (r == 4) {
        lin(p + "attn.indexer.wq_b", Hi * Di, ql, dense);
        bf16(p + "attn.indexer.weights_proj.weight", {Hi, d}, rng.normal_vec(static_cast<size_t>(Hi * d), 0.125f));
        compressor(p + "attn.indexer.compressor.", r, Di, true);
      }
    }
    bf16(p + "ffn.gate.weight", {E, d}, rng.normal_vec(static_cast<size_t>(E * d), 0.125f));
    if (!mtp && li < hash_layers) {
      std::vector<uint8_t> t(static_cast<size_t>(sp.vocab * K * 8));
      for (int64_t v = 0; v < sp.vocab; ++v) {
        int64_t a = static_cast<int64_t>(rng.next() % E), b = (a + 1 + static_cast<int64_t>(rng.next() % (E - 1))) % E;
        std::memcpy(&t[static_cast<size_t>((v * K) * 8)], &a, 8);
        std::memcpy(&t[static_cast<size_t>((v * K + 1) * 8)], &b, 8);
      }
      w.add(p + "ffn.gate.tid2eid", DType::I64, {sp.vocab, K}, std::move(t));
    } else {
      f32(p + "ffn.gate.bias", {E}, 0.1f);
    }
    WeightFormat ef = mtp && expert == WeightFormat::NVFP4 ? WeightFormat::MXFP4 : expert;  // NVFP4 skips mtp.*
    for (int e = 0; e < E; ++e) {
      std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      lin(ep + "w1", I, d, ef);
      lin(ep + "w3", I, d, ef);
      lin(ep + "w2", d, I, ef);
    }
    lin(p + "ffn.shared_experts.w1", I, d, dense);
    lin(p + "ffn.shared_experts.w3", I, d, dense);
    lin(p + "ffn.shared_experts.w2", d, I, dense);
    if (mtp) {
      lin(p + "e_proj", d, d, dense);
      lin(p + "h_proj", d, d, dense);
      norm_w(p + "enorm.weight", d);
      norm_w(p + "hnorm.weight", d);
      norm_w(p + "norm.weight", d);
      hc_w(p + "hc_head_", hc, 1);
    }
  };
  bf16("embed.weight", {sp.vocab, d}, rng.normal_vec(static_cast<size_t>(sp.vocab * d), 1.0f));
  bf16("head.weight", {sp.vocab, d}, rng.normal_vec(static_cast<size_t>(sp.vocab * d), 0.125f));
  norm_w("norm.weight", d);
  hc_w("hc_head_", hc, 1);
  for (int i = 0; i < L; ++i) layer("layers." + std::to_string(i) + ".", i, false);
  if (sp.with_mtp) layer("mtp.0.", L, true);

  json cfg = {{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"},
              {"vocab_size", sp.vocab}, {"hidden_size", d}, {"num_hidden_layers", L},
              {"num_attention_heads", H}, {"num_key_value_heads", 1}, {"head_dim", D},
              {"q_lora_rank", ql}, {"o_groups", G}, {"o_lora_rank", ro}, {"sliding_window", window},
              {"rope_theta", 10000.0}, {"compress_rope_theta", 160000.0},
              {"index_n_heads", Hi}, {"index_head_dim", Di}, {"index_topk", topk}, {"n_routed_experts", E},
              {"n_shared_experts", 1}, {"num_experts_per_tok", K}, {"moe_intermediate_size", I},
              {"scoring_func", "sqrtsoftplus"}, {"topk_method", "noaux_tc"}, {"norm_topk_prob", true},
              {"routed_scaling_factor", 1.5}, {"swiglu_limit", 10.0}, {"hidden_act", "silu"}, {"hc_mult", hc},
              {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6}, {"bos_token_id", 0},
              {"eos_token_id", 1}, {"tie_word_embeddings", false}, {"max_position_embeddings", 65536},
              {"num_nextn_predict_layers", 1}, {"torch_dtype", "bfloat16"}};
  json yarn = {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 256}, {"beta_fast", 32}, {"beta_slow", 1}};
  {
    cfg["compress_ratios"] = ratios;
    cfg["qk_rope_head_dim"] = R;
    cfg["rope_scaling"] = yarn;
    cfg["num_hash_layers"] = hash_layers;
    if (sp.format != "bf16") {
      cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                                    {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
      cfg["expert_dtype"] = sp.format == "base" ? "fp8" : "fp4";
    }
    if (sp.format == "nvfp4") {
      cfg["quantization_config"]["quant_algo"] = "MIXED_PRECISION";
      cfg["quantization_config"]["moe_quant_algo"] = "NVFP4";
      cfg["quantization_config"]["group_size"] = 16;
      cfg["quantization_config"]["producer"] = "modelopt";
    }
  }
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
  w.write(dir + "/model.safetensors");
}

}  // namespace dsv4
