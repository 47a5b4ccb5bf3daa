#include "model/sharding.h"

#include <set>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

const char* split_name(Split s) {
  switch (s) {
    case Split::Replicated: return "replicated";
    case Split::Rows: return "rows";
    case Split::Cols: return "cols";
  }
  return "?";
}

namespace {
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
// The linear a tensor belongs to ("…attn.wq_b" for "…attn.wq_b.scale"), or the name itself.
std::string linear_of(const std::string& n) {
  for (const char* suf : {".weight_scale_2", ".weight_scale", ".input_scale", ".weight", ".scale"})
    if (ends_with(n, suf)) return n.substr(0, n.size() - std::string(suf).size());
  return n;
}
bool is_scalar_companion(const std::string& n) { return ends_with(n, ".weight_scale_2") || ends_with(n, ".input_scale"); }
}  // namespace

Split shard_split(const std::string& name) {
  if (is_scalar_companion(name)) return Split::Replicated;  // per-tensor NVFP4 scalars apply to every shard
  const std::string lin = linear_of(name);
  if (lin == "head") return Split::Rows;  // vocabulary-parallel LM head
  if (contains(lin, ".indexer.")) return Split::Replicated;
  if (ends_with(lin, "attn.wq_b") || ends_with(lin, "attn.wo_a") || ends_with(name, "attn.attn_sink")) return Split::Rows;
  if (ends_with(lin, "attn.wo_b")) return Split::Cols;
  if (contains(lin, ".ffn.experts.") || contains(lin, ".ffn.shared_experts.")) {
    if (ends_with(lin, ".w1") || ends_with(lin, ".w3")) return Split::Rows;
    if (ends_with(lin, ".w2")) return Split::Cols;
  }
  return Split::Replicated;
}

std::vector<int64_t> shard_shape(const InventoryTensor& t, int tp) {
  const Split s = shard_split(t.name);
  std::vector<int64_t> shape = t.shape;
  if (s == Split::Replicated || tp == 1) return shape;
  const size_t dim = s == Split::Rows ? 0 : 1;
  if (shape.size() <= dim) fail(t.name, ": cannot split a ", shape.size(), "-d tensor along dim ", dim);
  if (shape[dim] % tp != 0)
    fail(t.name, ": dim ", dim, " = ", shape[dim], " is not divisible by tp ", tp);
  shape[dim] /= tp;
  return shape;
}

void check_tp(const ModelConfig& c, int tp) {
  std::ostringstream why;
  if (tp <= 0) fail("tp must be positive");
  if (c.n_heads % tp) why << " heads " << c.n_heads << ";";
  if (c.o_groups % tp) why << " o_groups " << c.o_groups << " (wo_a groups must stay whole);";
  if (c.vocab_size % tp) why << " vocab " << c.vocab_size << ";";
  if (c.moe_inter % (static_cast<int64_t>(tp) * 128))
    why << " expert width " << c.moe_inter << " (each shard must be whole 128-wide FP8 tiles / 32-wide FP4 blocks);";
  if ((c.n_heads / tp) * c.head_dim % 128) why << " per-rank wq_b rows not a multiple of 128;";
  if (tp > 1 && (c.o_groups / tp) * c.o_lora_rank % 128) why << " per-rank wo_a rows not a multiple of 128 (FP8 tiles);";
  std::string w = why.str();
  if (!w.empty()) fail("cannot split this model ", tp, " ways:", w);
}

KvLayout cuda_kv_layout(const ModelConfig& c) {
  return {"fp32 (the CUDA backend today)", c.head_dim * 4, c.index_head_dim * 4};
}

std::vector<KvLayout> kv_layouts() {
  return {{"bf16 (reference)", 1024, 256}, {"fp8 584 B + fp8 indexer 132 B", 584, 132},
          {"fp8 584 B + mxfp4 indexer 68 B (lossless)", 584, 68}};
}

MemoryPlan plan_memory(const ModelConfig& c, const std::vector<InventoryTensor>& inv, int tp, int64_t max_context,
                       int sequences, const KvLayout& kv) {
  check_tp(c, tp);
  MemoryPlan p;
  p.tp = tp;
  p.max_context = max_context;
  p.sequences = sequences;
  // FP4 weights (packed E2M1 bytes, I8/U8) keep their block scales as stored on the CUDA backend; FP8 ones widen to fp32.
  std::set<std::string> fp4_weights;
  for (const auto& t : inv)
    if (t.dtype == ckpt::DType::I8 || t.dtype == ckpt::DType::U8) fp4_weights.insert(t.name);
  auto weight_of = [](const std::string& scale) {
    const std::string sfx = ends_with(scale, ".weight_scale") ? ".weight_scale" : ".scale";
    return scale.substr(0, scale.size() - sfx.size()) + ".weight";
  };
  for (const auto& t : inv) {
    InventoryTensor s = t;
    if (shard_split(t.name) == Split::Replicated) {
      p.weights_replicated += t.bytes();
    } else {
      s.shape = shard_shape(t, tp);
      p.weights_sharded += s.bytes();
    }
    const bool block_scale = ends_with(t.name, ".scale") || ends_with(t.name, ".weight_scale");
    const bool widened = block_scale && !fp4_weights.count(weight_of(t.name));
    p.weights_device_per_gpu += widened ? static_cast<uint64_t>(s.numel()) * 4 : s.bytes();
  }
  // KV: a single latent head, so every rank holds the whole cache. Compressed entries per token: 1/m per layer.
  double per_token = 0;
  uint64_t fixed = 0;
  const int layers = c.n_layers + c.n_mtp_layers;
  for (int l = 0; l < layers; ++l) {
    fixed += static_cast<uint64_t>(c.window) * static_cast<uint64_t>(kv.main_entry_bytes);  // window ring
    if (c.kind(l) == AttnKind::SWA) continue;
    const int m = c.ratio(l);
    per_token += static_cast<double>(kv.main_entry_bytes) / m;
    const int64_t coff = c.kind(l) == AttnKind::CSA ? 2 : 1;
    fixed += static_cast<uint64_t>(2 * coff * m * coff * c.head_dim * 4);  // compressor state K and Z, fp32
    if (c.kind(l) == AttnKind::CSA) {
      per_token += static_cast<double>(kv.indexer_entry_bytes) / m;
      fixed += static_cast<uint64_t>(2 * 2 * m * 2 * c.index_head_dim * 4);
    }
  }
  p.kv_bytes_per_token = static_cast<int64_t>(per_token + 0.5);
  p.kv_fixed_per_sequence = fixed;
  p.allreduces_per_layer = tp > 1 ? 2 : 0;  // after wo_b, and after the MoE (routed + shared summed first)
  return p;
}

}  // namespace dsv4
