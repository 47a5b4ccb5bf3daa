#include "model/model_weights.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

using ckpt::DType;

namespace {

// Official leaf name -> HF-transformers leaf name (MODEL.md §3.7), for tensors under layers.{i}.
struct LeafMap {
  const char* official;
  const char* hf;
};
constexpr LeafMap kLayerLeaves[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    {"attn.kv_norm.weight", "self_attn.kv_norm.weight"},
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"},
    {"ffn.gate.weight", "mlp.gate.weight"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
};
constexpr LeafMap kGlobal[] = {
    {"embed.weight", "model.embed_tokens.weight"}, {"head.weight", "lm_head.weight"},
    {"norm.weight", "model.norm.weight"},          {"hc_head_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base"},     {"hc_head_scale", "model.hc_head.hc_scale"},
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os.str() + "]";
}

class Resolver {
 public:
  Resolver(const ckpt::Checkpoint& ck, const ModelConfig& cfg, ModelWeights& mw) : ck_(ck), cfg_(cfg), mw_(mw) {
    hf_ = !ck.has("embed.weight") && ck.has("model.embed_tokens.weight");
    mw.layout = hf_ ? "hf" : "official";
  }
  bool hf() const { return hf_; }

  // Names a tensor may have in the checkpoint, in order of preference: the official name; "model." + official (what
  // transformers 5.17 save_pretrained writes, where attn.kv_norm becomes attn.norm); the HF in-memory module names
  // (MODEL.md §3.7).
  std::vector<std::string> candidates(const std::string& official) const {
    std::vector<std::string> c{official};
    if (!hf_) return c;
    c.push_back("model." + official);
    const std::string kvn = ".attn.kv_norm.weight";
    if (official.size() > kvn.size() && official.compare(official.size() - kvn.size(), kvn.size(), kvn) == 0)
      c.push_back("model." + official.substr(0, official.size() - kvn.size()) + ".attn.norm.weight");
    for (const auto& g : kGlobal)
      if (official == g.official) c.push_back(g.hf);
    if (official.rfind("layers.", 0) == 0) {
      size_t dot = official.find('.', 7);
      std::string prefix = official.substr(0, dot + 1), leaf = official.substr(dot + 1);
      for (const auto& l : kLayerLeaves)
        if (leaf == l.official) c.push_back("model." + prefix + l.hf);
    }
    return c;
  }
  std::string map(const std::string& official) const { return official; }  // names in error messages

  const TensorView* find(const std::string& official) {
    for (const auto& n : candidates(official)) {
      const TensorView* t = ck_.find(n);
      if (t) {
        used_.insert(t->name());
        return t;
      }
    }
    return nullptr;
  }
  bool has_stacked_experts(int layer) const {
    return ck_.has("model.layers." + std::to_string(layer) + ".mlp.experts.gate_up_proj");
  }

  // Required tensor with an exact shape and one of the allowed dtypes.
  const TensorView* req(const std::string& official, std::vector<int64_t> shape, std::initializer_list<DType> dtypes) {
    const TensorView* t = find(official);
    if (!t) {
      missing_.push_back(map(official));
      return nullptr;
    }
    check(*t, shape, dtypes);
    return t;
  }

  void check(const TensorView& t, const std::vector<int64_t>& shape, std::initializer_list<DType> dtypes) {
    bool shape_ok = t.shape() == shape;
    // Scalars may be stored as [] or [1].
    if (!shape_ok && shape.empty() && t.shape() == std::vector<int64_t>{1}) shape_ok = true;
    if (!shape_ok) bad_.push_back(t.name() + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(shape));
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end())
      bad_.push_back(t.name() + " has dtype " + std::string(ckpt::dtype_name(t.dtype())) + ", not an accepted dtype");
  }

  // A linear weight "<base>.weight" (+ companions), any supported storage format; logical shape [out, in].
  LinearRef linear(const std::string& base, int64_t out, int64_t in) {
    LinearRef r;
    r.name = base;
    r.out = out;
    r.in = in;
    const TensorView* w = find(base + ".weight");
    if (!w) {
      missing_.push_back(map(base + ".weight"));
      return r;
    }
    r.weight = w;
    const TensorView* scale2 = find(base + ".weight_scale_2");
    if (scale2) {  // NVIDIA ModelOpt NVFP4
      r.fmt = WeightFormat::NVFP4;
      r.scale2 = scale2;
      check(*w, {out, in / 2}, {DType::U8, DType::I8});
      if (in % 16 != 0) bad_.push_back(base + ": NVFP4 needs in % 16 == 0");
      r.scale = req(base + ".weight_scale", {out, in / 16}, {DType::F8_E4M3});
      check(*scale2, {}, {DType::F32});
      r.input_scale = find(base + ".input_scale");
      if (r.input_scale) check(*r.input_scale, {}, {DType::F32});
      return r;
    }
    switch (w->dtype()) {
      case DType::F32: r.fmt = WeightFormat::F32; break;
      case DType::BF16: r.fmt = WeightFormat::BF16; break;
      case DType::F16: r.fmt = WeightFormat::F16; break;
      case DType::F8_E4M3: {
        check(*w, {out, in}, {DType::F8_E4M3});
        const TensorView* s = find(base + ".scale");
        if (!s) {
          missing_.push_back(map(base + ".scale"));
          return r;
        }
        // Key the interpretation off the scale tensor's dtype (MODEL.md §3.5), never off the config.
        r.fmt = s->dtype() == DType::F32 ? WeightFormat::FP8_F32 : WeightFormat::FP8_E8M0;
        check(*s, {(out + 127) / 128, (in + 127) / 128}, {DType::F8_E8M0, DType::F32});
        r.scale = s;
        return r;
      }
      case DType::I8:
      case DType::U8: {
        r.fmt = WeightFormat::MXFP4;
        if (in % 32 != 0) bad_.push_back(base + ": FP4 needs in % 32 == 0");
        check(*w, {out, in / 2}, {DType::I8, DType::U8});
        r.scale = req(base + ".scale", {out, in / 32}, {DType::F8_E8M0});
        return r;
      }
      default:
        bad_.push_back(w->name() + " has dtype " + std::string(ckpt::dtype_name(w->dtype())) +
                       ", not a supported linear weight format");
        return r;
    }
    check(*w, {out, in}, {DType::F32, DType::BF16, DType::F16});
    return r;
  }

  // HF layout: routed experts are stacked; expose per-expert slices as synthetic views (zero-copy).
  ExpertWeights hf_expert(int layer, int e) {
    ExpertWeights ew;
    const int64_t I = cfg_.moe_inter, d = cfg_.hidden, E = cfg_.n_routed_experts;
    std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const TensorView* gu = ck_.find(p + "gate_up_proj");
    const TensorView* dn = ck_.find(p + "down_proj");
    std::string base = "layers." + std::to_string(layer) + ".ffn.experts." + std::to_string(e);
    ew.w1.name = base + ".w1";
    ew.w3.name = base + ".w3";
    ew.w2.name = base + ".w2";
    if (!gu || !dn) {
      if (e == 0) {
        if (!dn) missing_.push_back(p + "down_proj");
      }
      return ew;
    }
    used_.insert(gu->name());
    used_.insert(dn->name());
    if (e == 0) {
      check(*gu, {E, 2 * I, d}, {DType::F32, DType::BF16, DType::F16});
      check(*dn, {E, d, I}, {DType::F32, DType::BF16, DType::F16});
    }
    if (gu->shape() != std::vector<int64_t>{E, 2 * I, d} || dn->shape() != std::vector<int64_t>{E, d, I}) return ew;
    auto slice = [&](const TensorView* t, const std::string& name, int64_t row0, int64_t rows, int64_t cols,
                     LinearRef& out) {
      size_t es = ckpt::dtype_size(t->dtype());
      mw_.synthetic_entries->push_back(ckpt::HeaderEntry{name + ".weight", t->dtype(), {rows, cols}, 0,
                                                         static_cast<uint64_t>(rows * cols) * es});
      TensorView v;
      v.entry = &mw_.synthetic_entries->back();
      v.data = t->data + static_cast<size_t>(row0 * cols) * es;
      v.file = t->file;
      mw_.synthetic_views->push_back(v);
      out.weight = &mw_.synthetic_views->back();
      out.out = rows;
      out.in = cols;
      out.fmt = t->dtype() == DType::F32 ? WeightFormat::F32 : t->dtype() == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F16;
    };
    slice(gu, ew.w1.name, static_cast<int64_t>(e) * 2 * I, I, d, ew.w1);
    slice(gu, ew.w3.name, static_cast<int64_t>(e) * 2 * I + I, I, d, ew.w3);
    slice(dn, ew.w2.name, static_cast<int64_t>(e) * d, d, I, ew.w2);
    return ew;
  }

  void mark_used_prefix(const std::string& prefix) {
    for (const auto& n : ck_.names())
      if (n.rfind(prefix, 0) == 0) used_.insert(n);
  }

  void finish() {
    std::vector<std::string> unexpected;
    for (const auto& n : ck_.names())
      if (!used_.count(n)) unexpected.push_back(n);
    if (missing_.empty() && bad_.empty() && unexpected.empty()) return;
    std::ostringstream os;
    os << ck_.dir() << ": checkpoint does not match the config (" << missing_.size() << " missing, " << bad_.size()
       << " mis-shaped/typed, " << unexpected.size() << " unexpected tensors)";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      const size_t kMax = 50;
      for (size_t i = 0; i < v.size() && i < kMax; ++i) os << "\n  " << what << ": " << v[i];
      if (v.size() > kMax) os << "\n  ... and " << (v.size() - kMax) << " more " << what << " tensors";
    };
    list("missing", missing_);
    list("bad", bad_);
    list("unexpected", unexpected);
    fail(os.str());
  }

  std::vector<std::string> missing_, bad_;

 private:
  const ckpt::Checkpoint& ck_;
  const ModelConfig& cfg_;
  ModelWeights& mw_;
  bool hf_ = false;
  std::unordered_set<std::string> used_;
};

const std::initializer_list<DType> kFloat = {DType::BF16, DType::F16, DType::F32};
const std::initializer_list<DType> kF32 = {DType::F32};

HcWeights hc(Resolver& r, const std::string& p, int rows, int64_t cols, int nscale) {
  HcWeights h;
  h.fn = r.req(p + "fn", {rows, cols}, kF32);
  h.base = r.req(p + "base", {rows}, kF32);
  h.scale = r.req(p + "scale", {nscale}, kF32);
  return h;
}

CompressorWeights compressor(Resolver& r, const ModelConfig& c, const std::string& p, int ratio, int64_t width,
                             bool overlap) {
  CompressorWeights cw;
  cw.ratio = ratio;
  cw.width = width;
  cw.overlap = overlap;
  int64_t coff = overlap ? 2 : 1;
  cw.wkv = r.linear(p + "wkv", coff * width, c.hidden);
  cw.wgate = r.linear(p + "wgate", coff * width, c.hidden);
  cw.ape = r.req(p + "ape", {ratio, coff * width}, kF32);
  cw.norm = r.req(p + "norm.weight", {width}, kFloat);
  return cw;
}

LayerWeights layer(Resolver& r, const ModelConfig& c, int li, const std::string& p, bool is_mtp) {
  LayerWeights lw;
  lw.index = li;
  lw.kind = c.kind(li);
  lw.hash = !is_mtp && c.is_hash_layer(li);
  const int64_t d = c.hidden, hcd = c.hc_mult * d;
  lw.hc_attn = hc(r, p + "hc_attn_", c.hc_mix(), hcd, 3);
  lw.hc_ffn = hc(r, p + "hc_ffn_", c.hc_mix(), hcd, 3);
  lw.attn_norm = r.req(p + "attn_norm.weight", {d}, kFloat);
  lw.ffn_norm = r.req(p + "ffn_norm.weight", {d}, kFloat);
  lw.attn_sink = r.req(p + "attn.attn_sink", {c.n_heads}, kF32);
  lw.wq_a = r.linear(p + "attn.wq_a", c.q_lora_rank, d);
  lw.q_norm = r.req(p + "attn.q_norm.weight", {c.q_lora_rank}, kFloat);
  lw.wq_b = r.linear(p + "attn.wq_b", c.n_heads * c.head_dim, c.q_lora_rank);
  lw.wkv = r.linear(p + "attn.wkv", c.head_dim, d);
  lw.kv_norm = r.req(p + "attn.kv_norm.weight", {c.head_dim}, kFloat);
  lw.wo_a = r.linear(p + "attn.wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups);
  lw.wo_b = r.linear(p + "attn.wo_b", d, c.o_groups * c.o_lora_rank);
  if (lw.kind != AttnKind::SWA) {
    bool csa = lw.kind == AttnKind::CSA;
    lw.compressor = compressor(r, c, p + "attn.compressor.", c.ratio(li), c.head_dim, csa);
    if (csa) {
      IndexerWeights iw;
      iw.wq_b = r.linear(p + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      iw.weights_proj = r.linear(p + "attn.indexer.weights_proj", c.index_n_heads, d);
      iw.comp = compressor(r, c, p + "attn.indexer.compressor.", c.ratio(li), c.index_head_dim, true);
      lw.indexer = iw;
    }
  }
  lw.gate = r.linear(p + "ffn.gate", c.n_routed_experts, d);
  if (lw.hash) {
    lw.tid2eid = r.req(p + "ffn.gate.tid2eid", {c.vocab_size, c.n_experts_per_tok}, {DType::I64, DType::I32});
  } else {
    lw.gate_bias = r.req(p + "ffn.gate.bias", {c.n_routed_experts}, kF32);
  }
  lw.experts.reserve(static_cast<size_t>(c.n_routed_experts));
  for (int e = 0; e < c.n_routed_experts; ++e) {
    if (r.hf() && !is_mtp && r.has_stacked_experts(li)) {
      lw.experts.push_back(r.hf_expert(li, e));
      continue;
    }
    std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    ExpertWeights ew;
    ew.w1 = r.linear(ep + "w1", c.moe_inter, d);
    ew.w3 = r.linear(ep + "w3", c.moe_inter, d);
    ew.w2 = r.linear(ep + "w2", d, c.moe_inter);
    lw.experts.push_back(ew);
  }
  if (c.n_shared_experts > 0) {
    ExpertWeights sw;
    sw.w1 = r.linear(p + "ffn.shared_experts.w1", c.moe_inter * c.n_shared_experts, d);
    sw.w3 = r.linear(p + "ffn.shared_experts.w3", c.moe_inter * c.n_shared_experts, d);
    sw.w2 = r.linear(p + "ffn.shared_experts.w2", d, c.moe_inter * c.n_shared_experts);
    lw.shared = sw;
  }
  if (is_mtp) {
    lw.e_proj = r.linear(p + "e_proj", d, d);
    lw.h_proj = r.linear(p + "h_proj", d, d);
    lw.enorm = r.req(p + "enorm.weight", {d}, kFloat);
    lw.hnorm = r.req(p + "hnorm.weight", {d}, kFloat);
    lw.mtp_norm = r.req(p + "norm.weight", {d}, kFloat);
    lw.mtp_hc_head = hc(r, p + "hc_head_", c.hc_mult, hcd, 1);
  }
  return lw;
}

}  // namespace

std::vector<const LinearRef*> ModelWeights::all_linears() const {
  std::vector<const LinearRef*> v{&head};
  auto add_layer = [&](const LayerWeights& l) {
    for (auto* x : {&l.wq_a, &l.wq_b, &l.wkv, &l.wo_a, &l.wo_b, &l.gate}) v.push_back(x);
    if (l.compressor) v.push_back(&l.compressor->wkv), v.push_back(&l.compressor->wgate);
    if (l.indexer) {
      for (auto* x : {&l.indexer->wq_b, &l.indexer->weights_proj, &l.indexer->comp.wkv, &l.indexer->comp.wgate})
        v.push_back(x);
    }
    for (const auto& e : l.experts) v.push_back(&e.w1), v.push_back(&e.w2), v.push_back(&e.w3);
    if (l.shared) v.push_back(&l.shared->w1), v.push_back(&l.shared->w2), v.push_back(&l.shared->w3);
    if (l.e_proj.weight) v.push_back(&l.e_proj), v.push_back(&l.h_proj);
  };
  for (const auto& l : layers) add_layer(l);
  if (mtp) add_layer(*mtp);
  return v;
}

std::vector<int32_t> read_tid2eid(const TensorView& t, int n_routed_experts) {
  std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t v;
    if (t.dtype() == DType::I64) {
      std::memcpy(&v, t.data + 8 * i, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, t.data + 4 * i, 4);
      v = v32;
    }
    if (v < 0 || v >= n_routed_experts)
      fail(*t.file, ": tensor '", t.name(), "' holds expert id ", v, " outside [0, ", n_routed_experts, ")");
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return ids;
}

ModelWeights resolve_model_weights(const ckpt::Checkpoint& ck, const ModelConfig& c) {
  ModelWeights mw;
  mw.synthetic_entries = std::make_shared<std::deque<ckpt::HeaderEntry>>();
  mw.synthetic_views = std::make_shared<std::deque<TensorView>>();
  Resolver r(ck, c, mw);
  const int64_t d = c.hidden;
  mw.embed = r.req("embed.weight", {c.vocab_size, d}, kFloat);
  mw.head = r.linear("head", c.vocab_size, d);
  mw.norm = r.req("norm.weight", {d}, kFloat);
  mw.hc_head = hc(r, "hc_head_", c.hc_mult, c.hc_mult * d, 1);
  for (int i = 0; i < c.n_layers; ++i) mw.layers.push_back(layer(r, c, i, "layers." + std::to_string(i) + ".", false));
  // MTP block: present in official releases, dropped by HF exports. Load it when its tensors are there.
  if (c.n_mtp_layers > 0 && ck.has("mtp.0.attn.wq_a.weight")) {
    mw.mtp = layer(r, c, c.n_layers, "mtp.0.", true);
  }
  if (c.n_mtp_layers > 1) r.mark_used_prefix("mtp.1.");  // only the first MTP block is used
  r.finish();
  return mw;
}

}  // namespace dsv4
