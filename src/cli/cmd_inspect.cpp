// dsv4 inspect MODEL_DIR: what a checkpoint holds, validated against its config (issue 2 contract).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "cli/command.h"
#include "cli/parse_args.h"
#include "model/model_weights.h"

namespace {

std::string gib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB (%llu bytes)", static_cast<double>(b) / (1ull << 30),
                static_cast<unsigned long long>(b));
  return buf;
}

int cmd_inspect(const std::vector<std::string>& args) {
  CLI::App app{"Print dims, layer schedule, storage formats and memory of a checkpoint", "dsv4 inspect"};
  std::string dir;
  app.add_option("MODEL_DIR", dir, "model directory (config.json + safetensors)")->required();
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  using namespace dsv4;
  ModelConfig c = load_model_config(dir + "/config.json");
  ckpt::Checkpoint ck = ckpt::Checkpoint::open(dir);
  ModelWeights w = resolve_model_weights(ck, c);

  std::printf("model: %s\n", dir.c_str());
  std::printf("layout: %s tensor names, %s config keys, %zu shard(s), %zu tensors\n", w.layout.c_str(),
              c.source_style.c_str(), ck.files().size(), ck.tensor_count());
  std::printf("architecture: vocab %lld, hidden %lld, layers %d (+%d MTP%s), heads %d x %lld (rope %lld), "
              "q_lora %lld, o_groups %d x %lld, window %d\n",
              (long long)c.vocab_size, (long long)c.hidden, c.n_layers, c.n_mtp_layers, w.mtp ? ", loaded" : ", absent",
              c.n_heads, (long long)c.head_dim, (long long)c.rope_dim, (long long)c.q_lora_rank, c.o_groups,
              (long long)c.o_lora_rank, c.window);
  std::printf("moe: %d routed experts (top %d, scale %.3g, swiglu limit %.3g), %d shared, inter %lld, %d hash layers\n",
              c.n_routed_experts, c.n_experts_per_tok, c.routed_scaling_factor, c.swiglu_limit, c.n_shared_experts,
              (long long)c.moe_inter, c.n_hash_layers);
  std::printf("indexer: %d heads x %lld, top-k %d; mHC %d streams, %d Sinkhorn iters\n", c.index_n_heads,
              (long long)c.index_head_dim, c.index_topk, c.hc_mult, c.hc_sinkhorn_iters);
  std::printf("rope: main theta %g; compress theta %g", c.rope_theta, c.compress_rope_theta);
  if (c.yarn.enabled)
    std::printf(" + YaRN(factor %g, original %lld, beta %g/%g)", c.yarn.factor,
                (long long)c.yarn.original_max_position_embeddings, c.yarn.beta_fast, c.yarn.beta_slow);
  std::printf("\nlayer schedule:\n");
  for (int l = 0; l < c.n_layers + c.n_mtp_layers; ++l) {
    bool mtp = l >= c.n_layers;
    std::printf("  %s%-3d %s", mtp ? "mtp." : "layer ", mtp ? l - c.n_layers : l, c.layer_kind(l).c_str());
    if (c.kind(l) != AttnKind::SWA) std::printf(" ratio %d", c.ratio(l));
    std::printf("%s, %s routing\n", c.kind(l) == AttnKind::SWA ? "" : "", (!mtp && c.is_hash_layer(l)) ? "hash" : "score");
  }
  // Storage formats: linears by detected format, every other tensor by dtype.
  std::map<std::string, std::pair<size_t, uint64_t>> fmt;
  for (const LinearRef* r : w.all_linears()) {
    if (!r->weight) continue;
    auto& e = fmt[std::string("linear ") + weight_format_name(r->fmt)];
    e.first++;
    e.second += r->stored_bytes();
  }
  uint64_t total = ck.total_tensor_bytes();
  std::printf("tensors per storage format:\n");
  for (const auto& [k, v] : fmt) std::printf("  %-28s %6zu  %s\n", k.c_str(), v.first, gib(v.second).c_str());
  std::map<std::string, size_t> dt;
  for (const auto& n : ck.names()) dt[std::string(ckpt::dtype_name(ck.get(n).dtype()))]++;
  std::printf("tensors per dtype:");
  for (const auto& [k, v] : dt) std::printf(" %s=%zu", k.c_str(), v);
  std::printf("\ntotal tensor bytes: %s\n", gib(total).c_str());
  // GPU plan: weights stay in their stored formats on the GPU (CUDA backend policy); MTP counted if present.
  std::printf("estimated GPU memory for weights: %s\n", gib(total).c_str());
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("inspect", "describe and validate a checkpoint", cmd_inspect);
