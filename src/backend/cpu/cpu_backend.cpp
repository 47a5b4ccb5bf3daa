// The CPU reference backend (fp32). Every op follows MODEL.md §5 literally; `official` numerics add the release's
// quantization simulation (§4) at the points §4.2 lists.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_math.h"
#include "core/error.h"
#include "model/rope.h"
#include "numeric/codecs.h"
#include "numeric/quant_sim.h"

namespace dsv4 {
namespace {

using std::vector;

struct Lin {
  vector<float> w;  // [out, in] dequantized
  int64_t out = 0, in = 0;
  bool low_precision = false;  // stored FP8/FP4: official numerics quantize its activations (QA8) first
};

vector<float> to_f32(const TensorView* t) {
  vector<float> v(static_cast<size_t>(t->numel()));
  tensor_to_f32(*t, v.data());
  return v;
}

Lin make_lin(const LinearRef& r) {
  Lin l;
  l.out = r.out;
  l.in = r.in;
  l.w.resize(static_cast<size_t>(r.out * r.in));
  const int64_t rows_per = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, r.in / 64));
#pragma omp parallel for schedule(dynamic)
  for (int64_t r0 = 0; r0 < r.out; r0 += rows_per)
    dequantize_rows(r, r0, std::min(r.out, r0 + rows_per), l.w.data() + r0 * r.in);
  l.low_precision = r.fmt == WeightFormat::FP8_E8M0 || r.fmt == WeightFormat::FP8_F32 ||
                    r.fmt == WeightFormat::MXFP4 || r.fmt == WeightFormat::NVFP4;
  return l;
}

struct Hc {
  vector<float> fn, base, scale;
};
Hc make_hc(const HcWeights& h) { return Hc{to_f32(h.fn), to_f32(h.base), to_f32(h.scale)}; }

struct Comp {
  int ratio = 0;
  int64_t width = 0;
  bool overlap = false;
  Lin wkv, wgate;
  vector<float> ape, norm;
};
Comp make_comp(const CompressorWeights& c) {
  return Comp{c.ratio, c.width, c.overlap, make_lin(c.wkv), make_lin(c.wgate), to_f32(c.ape), to_f32(c.norm)};
}

struct Expert {
  Lin w1, w2, w3;
};

struct Layer {
  AttnKind kind;
  int ratio = 0;
  bool hash = false;
  RopeProfile profile;
  vector<float> inv_freq;
  Hc hc_attn, hc_ffn;
  vector<float> attn_norm, ffn_norm, sink, q_norm, kv_norm;
  Lin wq_a, wq_b, wkv, wo_a, wo_b;
  bool has_comp = false, has_idx = false;
  Comp comp, icomp;
  Lin idx_wq_b, idx_wproj;
  Lin gate;
  vector<float> gate_bias;
  vector<int32_t> tid2eid;
  vector<Expert> experts;
  bool has_shared = false;
  Expert shared;
  // MTP block only.
  Lin e_proj, h_proj;
  vector<float> enorm, hnorm, mtp_norm;
  Hc mtp_hc_head;
};

// Per-sequence state of one layer.
struct LayerState {
  vector<float> ring;         // [window, D]
  vector<float> comp_cache;   // [cap, D]
  int64_t n_comp = 0;
  vector<float> cK, cZ;       // compressor running state [coff*m, coff*c]
  vector<float> idx_cache;    // [cap, index_head_dim]
  int64_t n_idx = 0;
  vector<float> iK, iZ;
  // For SequenceState::drop_last: the compression ratio, whether each compressor overlaps (rows [0, m) of its state
  // then hold the previous window, which an emission replaces), and what prepare_drop_last saved.
  int c_ratio = 0, i_ratio = 0;
  bool c_overlap = false, i_overlap = false;
  int64_t drop_n_comp = 0, drop_n_idx = 0;
  vector<float> drop_cK, drop_cZ, drop_iK, drop_iZ;  // rows [0, m) of cK/cZ/iK/iZ (overlapping compressors only)
};

class CpuSequence final : public SequenceState {
 public:
  CpuSequence(const ModelConfig& c, const vector<Layer>& layers, int64_t max_ctx) : max_ctx_(max_ctx) {
    for (size_t l = 0; l < layers.size(); ++l) {  // main layers, then the MTP block if loaded
      const Layer& L = layers[l];
      LayerState s;
      s.ring.assign(static_cast<size_t>(c.window * c.head_dim), 0.0f);
      s.c_ratio = L.has_comp ? L.comp.ratio : 0;
      s.i_ratio = L.has_idx ? L.icomp.ratio : 0;
      s.c_overlap = L.has_comp && L.comp.overlap;
      s.i_overlap = L.has_idx && L.icomp.overlap;
      if (L.has_comp) {
        int64_t cap = max_ctx / L.ratio + 1;
        s.comp_cache.assign(static_cast<size_t>(cap * c.head_dim), 0.0f);
        int64_t coff = L.comp.overlap ? 2 : 1;
        s.cK.assign(static_cast<size_t>(coff * L.ratio * coff * L.comp.width), 0.0f);
        s.cZ.assign(s.cK.size(), 0.0f);
      }
      if (L.has_idx) {
        int64_t cap = max_ctx / L.ratio + 1;
        s.idx_cache.assign(static_cast<size_t>(cap * c.index_head_dim), 0.0f);
        s.iK.assign(static_cast<size_t>(4 * L.ratio * L.icomp.width), 0.0f);
        s.iZ.assign(s.iK.size(), 0.0f);
      }
      layers_.push_back(std::move(s));
    }
    reset();
  }
  int64_t max_context() const override { return max_ctx_; }
  void reset() override {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (auto& s : layers_) {
      std::fill(s.ring.begin(), s.ring.end(), 0.0f);
      s.n_comp = s.n_idx = 0;
      std::fill(s.cK.begin(), s.cK.end(), 0.0f);
      std::fill(s.cZ.begin(), s.cZ.end(), ninf);
      std::fill(s.iK.begin(), s.iK.end(), 0.0f);
      std::fill(s.iZ.begin(), s.iZ.end(), ninf);
    }
  }
  bool supports_snapshots() const override { return true; }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    auto snap = std::make_unique<Snapshot>();
    for (const auto& s : layers_) snap->layers.push_back(Snapshot::Layer{s.ring, s.cK, s.cZ, s.iK, s.iZ, s.n_comp, s.n_idx});
    return snap;
  }
  void restore(const StateSnapshot& base) override {
    const auto* snap = dynamic_cast<const Snapshot*>(&base);
    if (!snap || snap->layers.size() != layers_.size()) fail("restore: snapshot does not belong to this sequence");
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& a = snap->layers[l];
      auto& s = layers_[l];
      std::copy(a.ring.begin(), a.ring.end(), s.ring.begin());  // copies into preallocated storage
      std::copy(a.cK.begin(), a.cK.end(), s.cK.begin());
      std::copy(a.cZ.begin(), a.cZ.end(), s.cZ.begin());
      std::copy(a.iK.begin(), a.iK.end(), s.iK.begin());
      std::copy(a.iZ.begin(), a.iZ.end(), s.iZ.begin());
      s.n_comp = a.n_comp;
      s.n_idx = a.n_idx;
    }
  }
  bool supports_drop_last() const override { return true; }
  vector<LayerState> layers_;

  // An overlapping compressor's state is [2m rows][W]: rows [0, m) the previous window, [m, 2m) the current one.
  void save_for_drop() override {
    for (auto& s : layers_) {
      if ((!s.cK.empty() && s.c_ratio < 2) || (!s.iK.empty() && s.i_ratio < 2))
        fail("drop_last needs compression ratios >= 2 (a ratio-1 compressor emits at every token)");
      s.drop_n_comp = s.n_comp, s.drop_n_idx = s.n_idx;
      if (s.c_overlap) save_half(s.cK, s.drop_cK), save_half(s.cZ, s.drop_cZ);
      if (s.i_overlap) save_half(s.iK, s.drop_iK), save_half(s.iZ, s.drop_iZ);
    }
  }
  // The dropped token at position p emitted an entry iff (p + 1) % m == 0; then the kept one before it did not (m >= 2),
  // so the saved counts and previous windows are the state after the kept token. Otherwise the dropped token only
  // wrote its own (stale, never read) rows.
  void undo_last(int64_t p) override {
    auto emitted = [p](int m) { return (p + 1) % m == 0; };
    for (auto& s : layers_) {
      if (!s.cK.empty() && emitted(s.c_ratio)) {
        s.n_comp = s.drop_n_comp;
        if (s.c_overlap) std::copy(s.drop_cK.begin(), s.drop_cK.end(), s.cK.begin()), std::copy(s.drop_cZ.begin(), s.drop_cZ.end(), s.cZ.begin());
      }
      if (!s.iK.empty() && emitted(s.i_ratio)) {
        s.n_idx = s.drop_n_idx;
        if (s.i_overlap) std::copy(s.drop_iK.begin(), s.drop_iK.end(), s.iK.begin()), std::copy(s.drop_iZ.begin(), s.drop_iZ.end(), s.iZ.begin());
      }
    }
  }

 private:
  static void save_half(const vector<float>& from, vector<float>& to) { to.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(from.size() / 2)); }
  struct Snapshot final : StateSnapshot {
    struct Layer {
      vector<float> ring, cK, cZ, iK, iZ;
      int64_t n_comp, n_idx;
    };
    vector<Layer> layers;
  };
  int64_t max_ctx_;
};

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  void load(const ModelConfig& c, const ModelWeights& w, Numerics numerics) override {
    c_ = c;
    official_ = numerics == Numerics::Official;
    embed_ = to_f32(w.embed);
    head_ = make_lin(w.head);
    norm_ = to_f32(w.norm);
    hc_head_ = make_hc(w.hc_head);
    std::vector<const LayerWeights*> all;
    for (const auto& lw : w.layers) all.push_back(&lw);
    if (w.mtp) all.push_back(&*w.mtp);
    for (const LayerWeights* lwp : all) {
      const LayerWeights& lw = *lwp;
      Layer L;
      L.kind = lw.kind;
      L.ratio = c.ratio(lw.index);
      L.hash = lw.hash;
      L.profile = rope_profile_for(c, lw.index);
      L.inv_freq = rope_inv_freq(c, L.profile);
      L.hc_attn = make_hc(lw.hc_attn);
      L.hc_ffn = make_hc(lw.hc_ffn);
      L.attn_norm = to_f32(lw.attn_norm);
      L.ffn_norm = to_f32(lw.ffn_norm);
      L.sink = to_f32(lw.attn_sink);
      L.q_norm = to_f32(lw.q_norm);
      L.kv_norm = to_f32(lw.kv_norm);
      L.wq_a = make_lin(lw.wq_a);
      L.wq_b = make_lin(lw.wq_b);
      L.wkv = make_lin(lw.wkv);
      L.wo_a = make_lin(lw.wo_a);
      L.wo_b = make_lin(lw.wo_b);
      if (lw.compressor) {
        L.has_comp = true;
        L.comp = make_comp(*lw.compressor);
      }
      if (lw.indexer) {
        L.has_idx = true;
        L.icomp = make_comp(lw.indexer->comp);
        L.idx_wq_b = make_lin(lw.indexer->wq_b);
        L.idx_wproj = make_lin(lw.indexer->weights_proj);
      }
      L.gate = make_lin(lw.gate);
      if (lw.gate_bias) L.gate_bias = to_f32(lw.gate_bias);
      if (lw.tid2eid) L.tid2eid = read_tid2eid(*lw.tid2eid, c.n_routed_experts);
      for (const auto& e : lw.experts) L.experts.push_back(Expert{make_lin(e.w1), make_lin(e.w2), make_lin(e.w3)});
      if (lw.shared) {
        L.has_shared = true;
        L.shared = Expert{make_lin(lw.shared->w1), make_lin(lw.shared->w2), make_lin(lw.shared->w3)};
      }
      if (lw.e_proj.weight) {
        L.e_proj = make_lin(lw.e_proj);
        L.h_proj = make_lin(lw.h_proj);
        L.enorm = to_f32(lw.enorm);
        L.hnorm = to_f32(lw.hnorm);
        L.mtp_norm = to_f32(lw.mtp_norm);
        L.mtp_hc_head = make_hc(lw.mtp_hc_head);
      }
      layers_.push_back(std::move(L));
    }
    // Scratch sized for the largest single-token intermediate; per-chunk scratch grows once in ensure_scratch().
  }

  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override {
    if (max_context <= 0) fail("max context must be positive");
    reserve_scratch(max_context);
    return std::make_unique<CpuSequence>(c_, layers_, max_context);
  }

  float* alloc_f32(size_t n) override {
    f32_bufs_.emplace_back(n, 0.0f);
    return f32_bufs_.back().data();
  }
  int32_t* alloc_i32(size_t n) override {
    i32_bufs_.emplace_back(n, 0);
    return i32_bufs_.back().data();
  }
  void upload_i32(int32_t* dst, const int32_t* src, size_t n) override { std::memcpy(dst, src, n * 4); }
  void download_f32(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * 4); }
  void download_i32(int32_t* dst, const int32_t* src, size_t n) override { std::memcpy(dst, src, n * 4); }

  void embed(const int32_t* ids, int n, float* X) override {
    const int64_t d = c_.hidden;
    for (int t = 0; t < n; ++t)
      for (int s = 0; s < c_.hc_mult; ++s)
        std::memcpy(X + (t * c_.hc_mult + s) * d, embed_.data() + ids[t] * d, static_cast<size_t>(d) * 4);
  }

  void hc_pre(int layer, HcSite site, const float* X, int n, float* x, float* post, float* comb) override {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const Hc& h = site == HcSite::Attn ? L.hc_attn : L.hc_ffn;
    const vector<float>& nw = site == HcSite::Attn ? L.attn_norm : L.ffn_norm;
    const int hc = c_.hc_mult;
    const int64_t d = c_.hidden;
    const float eps = static_cast<float>(c_.hc_eps);
#pragma omp parallel for schedule(static) if (n > 1 && parallel_worth(int64_t{n} * c_.hc_mix() * hc * d))
    for (int t = 0; t < n; ++t) {
      const float* Xt = X + t * hc * d;
      vector<float>& mix = scratch(13, static_cast<size_t>(c_.hc_mix()));
      mhc_mix(h, Xt, mix.data());
      float pre[16];
      for (int s = 0; s < hc; ++s) pre[s] = sigmoidf(mix[s] * h.scale[0] + h.base[s]) + eps;
      for (int s = 0; s < hc; ++s) post[t * hc + s] = 2.0f * sigmoidf(mix[hc + s] * h.scale[1] + h.base[hc + s]);
      float* C = comb + t * hc * hc;
      sinkhorn(h, mix.data(), C);
      vector<float>& xin = scratch(14, static_cast<size_t>(d));
      std::fill(xin.begin(), xin.begin() + d, 0.0f);
      for (int s = 0; s < hc; ++s)
        for (int64_t j = 0; j < d; ++j) xin[j] += pre[s] * Xt[s * d + j];
      if (official_) num::round_bf16(xin.data(), d);
      cpu::rms_norm(xin.data(), d, nw.data(), c_.rms_eps, x + t * d);
      if (official_) num::round_bf16(x + t * d, d);
    }
  }

  void hc_post(const float* y, const float* post, const float* comb, int n, float* X) override {
    const int hc = c_.hc_mult;
    const int64_t d = c_.hidden;
#pragma omp parallel for schedule(static) if (n > 1 && parallel_worth(int64_t{n} * hc * hc * d))
    for (int t = 0; t < n; ++t) {
      float* Xt = X + t * hc * d;
      const float* C = comb + t * hc * hc;
      vector<float>& out = scratch(13, static_cast<size_t>(hc * d));
      for (int k = 0; k < hc; ++k)
        for (int64_t j = 0; j < d; ++j) {
          float v = post[t * hc + k] * y[t * d + j];
          for (int i = 0; i < hc; ++i) v += C[i * hc + k] * Xt[i * d + j];  // output stream k gathers column k
          out[static_cast<size_t>(k * d + j)] = v;
        }
      if (official_) num::round_bf16(out.data(), hc * d);
      std::memcpy(Xt, out.data(), static_cast<size_t>(hc * d) * 4);
    }
  }

  // The position/state ops are written once over "rows": row i is at position pos(i) of sequence seq(i). A chunk
  // of one sequence is pos(i) = pos0 + i, seq(i) = st; a batched decode step (the *_rows ops) is pos(i) = pos[i],
  // seq(i) = *sts[i]. Either way every row computes exactly the same arithmetic.
  struct ChunkRows {
    int64_t pos0;
    SequenceState* st;
    int64_t pos(int i) const { return pos0 + i; }
    CpuSequence& seq(int) const { return static_cast<CpuSequence&>(*st); }
    // Window KV of this call's rows: row i's own kv covers positions [first(i), pos(i)].
    int64_t first(int) const { return pos0; }
    int64_t kv_row(int, int64_t p) const { return p - pos0; }
  };
  struct BatchRows {
    const int64_t* p;
    SequenceState* const* sts;
    int64_t pos(int i) const { return p[i]; }
    CpuSequence& seq(int i) const { return static_cast<CpuSequence&>(*sts[i]); }
    int64_t first(int i) const { return p[i]; }
    int64_t kv_row(int i, int64_t) const { return i; }
  };

  // A verify pair (Forward::forward_pair): rows that are one sequence's consecutive positions are exactly a chunk
  // of it, so the *_rows ops run the chunk ops on them (a row sees the earlier row's window entry and compressor
  // state as a chunk does). Any other repetition of a sequence is not a batch the interface allows.
  bool pair_rows() const override { return true; }
  static bool one_sequence_chunk(int n, const int64_t* pos, SequenceState* const* sts) {
    bool repeat = false, chunk = n > 1;
    for (int i = 1; i < n; ++i) {
      chunk = chunk && sts[i] == sts[0] && pos[i] == pos[0] + i;
      for (int j = 0; j < i; ++j) repeat = repeat || sts[j] == sts[i];
    }
    if (repeat && !chunk) fail("batched rows repeat a sequence but are not its consecutive positions");
    return chunk;
  }

  void attn_qkv(int layer, const float* x, int n, int64_t pos0, float* qr, float* q, float* kv) override {
    qkv_impl(layer, x, n, ChunkRows{pos0, nullptr}, qr, q, kv);
  }
  void attn_qkv_rows(int layer, const float* x, int n, const int64_t* pos, float* qr, float* q, float* kv) override {
    qkv_impl(layer, x, n, BatchRows{pos, nullptr}, qr, q, kv);  // position per row, no state: a chunk's arithmetic
  }
  void compressor_step(int layer, CompressorKind which, const float* x, int n, int64_t pos0,
                       SequenceState& sst) override {
    compressor_impl(layer, which, x, n, ChunkRows{pos0, &sst});
  }
  void compressor_step_rows(int layer, CompressorKind which, const float* x, int n, const int64_t* pos,
                            SequenceState* const* sts) override {
    if (one_sequence_chunk(n, pos, sts)) return compressor_step(layer, which, x, n, pos[0], *sts[0]);
    compressor_impl(layer, which, x, n, BatchRows{pos, sts});
  }
  void indexer_topk(int layer, const float* x, const float* qr, int n, int64_t pos0, SequenceState& sst,
                    int32_t* topk) override {
    indexer_impl(layer, x, qr, n, ChunkRows{pos0, &sst}, topk);
  }
  void indexer_topk_rows(int layer, const float* x, const float* qr, int n, const int64_t* pos,
                         SequenceState* const* sts, int32_t* topk) override {
    if (one_sequence_chunk(n, pos, sts)) return indexer_topk(layer, x, qr, n, pos[0], *sts[0], topk);
    indexer_impl(layer, x, qr, n, BatchRows{pos, sts}, topk);
  }
  void attend(int layer, const float* q, const float* kv, const int32_t* topk, int n, int64_t pos0,
              SequenceState& sst, float* o) override {
    attend_impl(layer, q, kv, topk, n, ChunkRows{pos0, &sst}, o);
  }
  void attend_rows(int layer, const float* q, const float* kv, const int32_t* topk, int n, const int64_t* pos,
                   SequenceState* const* sts, float* o) override {
    if (one_sequence_chunk(n, pos, sts)) return attend(layer, q, kv, topk, n, pos[0], *sts[0], o);
    attend_impl(layer, q, kv, topk, n, BatchRows{pos, sts}, o);
  }
  void window_store(int layer, const float* kv, int n, int64_t pos0, SequenceState& sst) override {
    LayerState& S = static_cast<CpuSequence&>(sst).layers_[static_cast<size_t>(layer)];
    const int Wn = c_.window;
    const int64_t D = c_.head_dim;
    for (int i = std::max(0, n - Wn); i < n; ++i)
      std::memcpy(S.ring.data() + ((pos0 + i) % Wn) * D, kv + static_cast<int64_t>(i) * D, static_cast<size_t>(D) * 4);
  }
  void window_store_rows(int layer, const float* kv, int n, const int64_t* pos, SequenceState* const* sts) override {
    if (one_sequence_chunk(n, pos, sts)) return window_store(layer, kv, n, pos[0], *sts[0]);
    const int Wn = c_.window;
    const int64_t D = c_.head_dim;
    for (int i = 0; i < n; ++i) {
      LayerState& S = static_cast<CpuSequence&>(*sts[i]).layers_[static_cast<size_t>(layer)];
      std::memcpy(S.ring.data() + (pos[i] % Wn) * D, kv + static_cast<int64_t>(i) * D, static_cast<size_t>(D) * 4);
    }
  }
  void attn_out(int layer, const float* o, int n, int64_t pos0, float* out) override {
    out_impl(layer, o, n, ChunkRows{pos0, nullptr}, out);
  }
  void attn_out_rows(int layer, const float* o, int n, const int64_t* pos, float* out) override {
    out_impl(layer, o, n, BatchRows{pos, nullptr}, out);
  }

  template <class Rows>
  void qkv_impl(int layer, const float* x, int n, const Rows& rows, float* qr, float* q, float* kv) {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int64_t D = c_.head_dim, R = c_.rope_dim, nope = D - R, ql = c_.q_lora_rank;
    const int H = c_.n_heads;
    vector<float>& tmp = scratch(0, static_cast<size_t>(n) * std::max(ql, D));
    linear(L.wq_a, x, n, tmp.data());
    for (int t = 0; t < n; ++t) {
      cpu::rms_norm(tmp.data() + t * ql, ql, L.q_norm.data(), c_.rms_eps, qr + t * ql);
      if (official_) num::round_bf16(qr + t * ql, ql);
    }
    linear(L.wq_b, qr, n, q);
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) {
        float* qh = q + (static_cast<int64_t>(t) * H + h) * D;
        cpu::rms_norm(qh, D, nullptr, c_.rms_eps, qh);
        if (official_) num::round_bf16(qh, D);
        rope_rotate(qh + nope, L.inv_freq.data(), static_cast<int>(R / 2), rows.pos(t), false);
        if (official_) num::round_bf16(qh + nope, R);
      }
    linear(L.wkv, x, n, tmp.data());
    for (int t = 0; t < n; ++t) {
      float* k = kv + t * D;
      cpu::rms_norm(tmp.data() + t * D, D, L.kv_norm.data(), c_.rms_eps, k);
      if (official_) num::round_bf16(k, D);
      rope_rotate(k + nope, L.inv_freq.data(), static_cast<int>(R / 2), rows.pos(t), false);
      if (official_) {
        num::round_bf16(k + nope, R);
        num::fp8_sim(k, nope, 64);  // SIM8 of the nope dims (448 = 7 blocks of 64 in the releases)
      }
    }
  }

  template <class Rows>
  void compressor_impl(int layer, CompressorKind which, const float* x, int n, const Rows& rows) {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const bool main = which == CompressorKind::Main;
    const Comp& C = main ? L.comp : L.icomp;
    const int m = C.ratio;
    const int64_t c = C.width, coff = C.overlap ? 2 : 1, W = coff * c;
    // Projections for all rows (fp32 GEMM, as the reference).
    vector<float>& K = scratch(1, static_cast<size_t>(n * W));
    vector<float>& Z = scratch(2, static_cast<size_t>(n * W));
    cpu::matmul_nt(x, n, c_.hidden, C.wkv.w.data(), W, K.data());
    cpu::matmul_nt(x, n, c_.hidden, C.wgate.w.data(), W, Z.data());
    vector<float>& entry = scratch(22, static_cast<size_t>(c));
    vector<float>& wts = scratch(21, static_cast<size_t>(2 * m));
    for (int i = 0; i < n; ++i) {
      CpuSequence& sq = rows.seq(i);
      LayerState& S = sq.layers_[static_cast<size_t>(layer)];
      vector<float>& sK = main ? S.cK : S.iK;
      vector<float>& sZ = main ? S.cZ : S.iZ;
      vector<float>& cache = main ? S.comp_cache : S.idx_cache;
      int64_t& count = main ? S.n_comp : S.n_idx;
      const int64_t t = rows.pos(i);
      const int r = static_cast<int>(t % m);
      const int64_t row = C.overlap ? m + r : r;  // overlapping: rows m..2m-1 = current window
      for (int64_t j = 0; j < W; ++j) {
        sK[row * W + j] = K[i * W + j];
        sZ[row * W + j] = Z[i * W + j] + C.ape[r * W + j];
      }
      if ((t + 1) % m != 0) continue;
      // Window complete: per-dimension softmax over its slots.
      const int64_t w = t / m;
      for (int64_t j = 0; j < c; ++j) {
        int ns = 0;
        float zmax = -std::numeric_limits<float>::infinity();
        if (C.overlap) {
          // Previous window's first halves (rows 0..m-1, dims [0, c)) + this window's second halves (rows m..2m-1,
          // dims [c, 2c)).
          for (int s = 0; s < m; ++s) wts[ns++] = sZ[s * W + j];
          for (int s = 0; s < m; ++s) wts[ns++] = sZ[(m + s) * W + c + j];
        } else {
          for (int s = 0; s < m; ++s) wts[ns++] = sZ[s * W + j];
        }
        for (int s = 0; s < ns; ++s) zmax = std::max(zmax, wts[s]);
        double den = 0.0, num = 0.0;
        for (int s = 0; s < ns; ++s) {
          double e = wts[s] == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp(static_cast<double>(wts[s] - zmax));
          float kval = C.overlap ? (s < m ? sK[s * W + j] : sK[(m + s - m) * W + c + j]) : sK[s * W + j];
          den += e;
          num += e * kval;
        }
        entry[static_cast<size_t>(j)] = static_cast<float>(num / den);
      }
      if (C.overlap) {  // this window becomes the previous one
        std::copy(sK.begin() + m * W, sK.begin() + 2 * m * W, sK.begin());
        std::copy(sZ.begin() + m * W, sZ.begin() + 2 * m * W, sZ.begin());
      }
      finish_entry(L, C, entry.data(), w * m, main);
      if ((count + 1) * c > static_cast<int64_t>(cache.size()))
        fail("compressed cache of layer ", layer, " is full (max context ", sq.max_context(), ")");
      std::copy(entry.begin(), entry.begin() + c, cache.begin() + count * c);
      ++count;
    }
  }

  template <class Rows>
  void indexer_impl(int layer, const float* x, const float* qr, int n, const Rows& rows, int32_t* topk) {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int Hi = c_.index_n_heads, K = c_.index_topk, m = L.ratio;
    const int64_t Di = c_.index_head_dim, R = c_.rope_dim;
    vector<float>& qI = scratch(3, static_cast<size_t>(n * Hi * Di));
    vector<float>& wI = scratch(4, static_cast<size_t>(n * Hi));
    linear(L.idx_wq_b, qr, n, qI.data());
    cpu::matmul_nt(x, n, c_.hidden, L.idx_wproj.w.data(), Hi, wI.data());
    const float wscale = 1.0f / std::sqrt(static_cast<float>(Hi));
    const float qscale = 1.0f / std::sqrt(static_cast<float>(Di));
#pragma omp parallel for schedule(dynamic) if (n > 1 && parallel_worth(int64_t{n} * Hi * Di * ((rows.pos(n - 1) + 1) / m + 1)))
    for (int i = 0; i < n; ++i) {
      const int64_t t = rows.pos(i);
      const LayerState& S = rows.seq(i).layers_[static_cast<size_t>(layer)];
      const int64_t visible = (t + 1) / m;
      if (visible > S.n_idx) fail("indexer: ", visible, " entries should be visible at position ", t, " but only ", S.n_idx, " exist");
      for (int h = 0; h < Hi; ++h) {
        float* qh = qI.data() + (static_cast<int64_t>(i) * Hi + h) * Di;
        rope_rotate(qh + (Di - R), L.inv_freq.data(), static_cast<int>(R / 2), t, false);
        if (official_) {
          num::round_bf16(qh, Di);
          num::hadamard(qh, static_cast<int>(Di));
          num::round_bf16(qh, Di);
          num::fp4_sim(qh, Di);
        }
      }
      float* wi = wI.data() + static_cast<int64_t>(i) * Hi;
      if (official_) num::round_bf16(wi, Hi);
      vector<std::pair<float, int32_t>>& sc = tls<std::pair<float, int32_t>>(0, static_cast<size_t>(visible));
      for (int64_t w = 0; w < visible; ++w) {
        const float* k = S.idx_cache.data() + w * Di;
        double s = 0.0;
        for (int h = 0; h < Hi; ++h) {
          float d = cpu::dot(qI.data() + (static_cast<int64_t>(i) * Hi + h) * Di, k, Di);
          if (d > 0) s += static_cast<double>(d) * qscale * (wi[h] * wscale);
        }
        float sf = static_cast<float>(s);
        if (official_) sf = num::decode_bf16(num::encode_bf16(sf));
        sc[static_cast<size_t>(w)] = {sf, static_cast<int32_t>(w)};
      }
      const int64_t k = std::min<int64_t>(K, visible);
      // Highest score first; ties broken by lower index (the reference's tie order is implementation defined).
      std::partial_sort(sc.begin(), sc.begin() + k, sc.begin() + visible, [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      int32_t* out = topk + static_cast<int64_t>(i) * K;
      for (int64_t j = 0; j < K; ++j) out[j] = j < k ? sc[static_cast<size_t>(j)].second : -1;
    }
  }

  template <class Rows>
  void attend_impl(int layer, const float* q, const float* kv, const int32_t* topk, int n, const Rows& rows, float* o) {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int H = c_.n_heads, Wn = c_.window, K = c_.index_topk;
    const int64_t D = c_.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(dynamic) if (n > 1 && parallel_worth(int64_t{n} * H * D * (Wn + K)))
    for (int i = 0; i < n; ++i) {
      const int64_t t = rows.pos(i);
      const LayerState& S = rows.seq(i).layers_[static_cast<size_t>(layer)];
      // Candidate rows: window positions max(0, t-W+1)..t, then compressed entries.
      vector<const float*>& rowbuf = tls<const float*>(0, 0);
      size_t nrows = 0;
      auto push = [&](const float* r) {
        if (nrows == rowbuf.size()) rowbuf.resize(nrows * 2 + 16);  // only if max context was exceeded
        rowbuf[nrows++] = r;
      };
      for (int64_t p = std::max<int64_t>(0, t - Wn + 1); p <= t; ++p)
        push(p >= rows.first(i) ? kv + rows.kv_row(i, p) * D : S.ring.data() + (p % Wn) * D);
      if (L.kind == AttnKind::HCA) {
        const int64_t visible = (t + 1) / L.ratio;
        if (visible > S.n_comp) fail("attention: HCA entries missing at position ", t);
        for (int64_t w = 0; w < visible; ++w) push(S.comp_cache.data() + w * D);
      } else if (L.kind == AttnKind::CSA) {
        const int64_t visible = (t + 1) / L.ratio;
        for (int j = 0; j < K; ++j) {
          int32_t w = topk[static_cast<int64_t>(i) * K + j];
          if (w < 0) continue;
          if (w >= visible || w >= S.n_comp)
            fail("attention: indexer selected invisible compressed entry ", w, " for position ", t, " (visible ", visible, ")");
          push(S.comp_cache.data() + w * D);
        }
      }
      const float* const* rows = rowbuf.data();
      vector<float>& s = scratch(20, nrows);
      for (int h = 0; h < H; ++h) {
        const float* qh = q + (static_cast<int64_t>(i) * H + h) * D;
        float mx = L.sink[static_cast<size_t>(h)];
        for (size_t j = 0; j < nrows; ++j) {
          s[j] = cpu::dot(qh, rows[j], D) * scale;
          mx = std::max(mx, s[j]);
        }
        double z = std::exp(static_cast<double>(L.sink[static_cast<size_t>(h)] - mx));  // sink: denominator only
        for (size_t j = 0; j < nrows; ++j) {
          s[j] = static_cast<float>(std::exp(static_cast<double>(s[j] - mx)));
          z += s[j];
        }
        float* oh = o + (static_cast<int64_t>(i) * H + h) * D;
        std::fill(oh, oh + D, 0.0f);
        for (size_t j = 0; j < nrows; ++j) {
          float p = static_cast<float>(s[j] / z);
          if (official_) p = num::decode_bf16(num::encode_bf16(p));
          const float* v = rows[j];
          for (int64_t e = 0; e < D; ++e) oh[e] += p * v[e];
        }
        if (official_) num::round_bf16(oh, D);
      }
    }
  }

  template <class Rows>
  void out_impl(int layer, const float* o, int n, const Rows& rows, float* out) {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int H = c_.n_heads, G = c_.o_groups;
    const int64_t D = c_.head_dim, R = c_.rope_dim, nope = D - R, ro = c_.o_lora_rank, gin = H * D / G;
    vector<float>& u = scratch(5, static_cast<size_t>(n * H * D));
    std::memcpy(u.data(), o, static_cast<size_t>(n * H * D) * 4);
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) {
        float* uh = u.data() + (static_cast<int64_t>(t) * H + h) * D;
        rope_rotate(uh + nope, L.inv_freq.data(), static_cast<int>(R / 2), rows.pos(t), true);  // de-rotate
        if (official_) num::round_bf16(uh + nope, R);
      }
    vector<float>& z = scratch(6, static_cast<size_t>(n * G * ro));
    // Grouped wo_a: group g = heads g*H/G.. (contiguous), rows g*ro..(g+1)*ro of wo_a.
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth(int64_t{n} * H * D * ro))
    for (int t = 0; t < n; ++t)
      for (int g = 0; g < G; ++g)
        for (int64_t r = 0; r < ro; ++r)
          z[(static_cast<int64_t>(t) * G + g) * ro + r] =
              cpu::dot(u.data() + static_cast<int64_t>(t) * H * D + g * gin, L.wo_a.w.data() + (g * ro + r) * gin, gin);
    if (official_) num::round_bf16(z.data(), static_cast<int64_t>(n) * G * ro);
    linear(L.wo_b, z.data(), n, out);
  }

  void moe(int layer, const float* x, const int32_t* ids, int n, float* out) override {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int E = c_.n_routed_experts, k = c_.n_experts_per_tok;
    const int64_t d = c_.hidden;
    vector<float>& logits = scratch(7, static_cast<size_t>(n * E));
    cpu::matmul_nt(x, n, d, L.gate.w.data(), E, logits.data());
    std::fill(out, out + static_cast<int64_t>(n) * d, 0.0f);
    if (k > 64) fail("num_experts_per_tok > 64 is not supported");
    // Tokens in parallel when the experts are too small for matmul_nt to parallelise (tiny models, batched decode);
    // each token's arithmetic is the same either way.
    const bool small = !parallel_worth(c_.moe_inter * d);
#pragma omp parallel for schedule(dynamic) if (n > 1 && small && parallel_worth(int64_t{n} * (k + 1) * 3 * c_.moe_inter * d))
    for (int t = 0; t < n; ++t) {
      const float* lg = logits.data() + static_cast<int64_t>(t) * E;
      vector<float>& s = scratch(15, static_cast<size_t>(E));
      score(lg, E, s.data());
      int idx[64];
      if (L.hash) {
        for (int j = 0; j < k; ++j) idx[j] = L.tid2eid[static_cast<size_t>(ids[t]) * k + j];
      } else {
        vector<int>& order = tls<int>(0, static_cast<size_t>(E));
        std::iota(order.begin(), order.begin() + E, 0);
        std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, [&](int a, int b) {
          float sa = s[a] + L.gate_bias[a], sb = s[b] + L.gate_bias[b];
          return sa > sb || (sa == sb && a < b);
        });
        std::copy(order.begin(), order.begin() + k, idx);
      }
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += s[idx[j]];
      vector<double>& acc = tls<double>(0, static_cast<size_t>(d));
      std::fill(acc.begin(), acc.begin() + d, 0.0);
      for (int j = 0; j < k; ++j) {
        float wgt = static_cast<float>(c_.norm_topk_prob ? s[idx[j]] / sum : s[idx[j]]) *
                    static_cast<float>(c_.routed_scaling_factor);
        expert_ffn(L.experts[static_cast<size_t>(idx[j])], x + t * d, wgt, acc);
      }
      if (L.has_shared) expert_ffn(L.shared, x + t * d, 1.0f, acc);
      for (int64_t j = 0; j < d; ++j) out[t * d + j] = static_cast<float>(acc[j]);
      if (official_) num::round_bf16(out + t * d, d);
    }
  }

  void head(const float* X, int n, float* logits) override { final_head(hc_head_, norm_, X, n, logits); }

  void mtp_input(const int32_t* next_ids, const float* X, int n, float* Y) override {
    const Layer& M = mtp_layer();
    const int hc = c_.hc_mult;
    const int64_t d = c_.hidden;
    vector<float>& e = scratch(16, static_cast<size_t>(n * d));
    vector<float>& ep = scratch(17, static_cast<size_t>(n * d));
    for (int t = 0; t < n; ++t) {
      cpu::rms_norm(embed_.data() + static_cast<int64_t>(next_ids[t]) * d, d, M.enorm.data(), c_.rms_eps, e.data() + t * d);
      if (official_) num::round_bf16(e.data() + t * d, d);
    }
    linear(M.e_proj, e.data(), n, ep.data());
    vector<float>& hs = scratch(18, static_cast<size_t>(n * hc * d));
    vector<float>& hp = scratch(19, static_cast<size_t>(n * hc * d));
    for (int64_t r = 0; r < static_cast<int64_t>(n) * hc; ++r) {
      cpu::rms_norm(X + r * d, d, M.hnorm.data(), c_.rms_eps, hs.data() + r * d);
      if (official_) num::round_bf16(hs.data() + r * d, d);
    }
    linear(M.h_proj, hs.data(), n * hc, hp.data());
    for (int t = 0; t < n; ++t)
      for (int s = 0; s < hc; ++s)
        for (int64_t j = 0; j < d; ++j) Y[(t * hc + s) * d + j] = hp[(t * hc + s) * d + j] + ep[t * d + j];
    if (official_) num::round_bf16(Y, static_cast<int64_t>(n) * hc * d);
  }

  void mtp_head(const float* Y, int n, float* logits) override {
    const Layer& M = mtp_layer();
    final_head(M.mtp_hc_head, M.mtp_norm, Y, n, logits);
  }

 private:
  static float sigmoidf(float v) { return 1.0f / (1.0f + std::exp(-v)); }
  // Whether a loop of about `work` multiply-adds is worth an OpenMP team (the threshold matmul_nt uses): tiny models
  // and small batches run serially, which also keeps concurrent processes (ctest -j, a client on the same cores)
  // from stalling on spinning barriers. Results do not depend on it: each row's arithmetic is the same.
  static bool parallel_worth(int64_t work) { return work > 65536; }

  const Layer& mtp_layer() const {
    if (layers_.size() <= static_cast<size_t>(c_.n_layers)) fail("this checkpoint has no MTP block");
    return layers_[static_cast<size_t>(c_.n_layers)];
  }

  // hc_head collapse (sigmoid weights, no Sinkhorn), RMSNorm, LM head (MODEL.md §5.10).
  void final_head(const Hc& hh, const vector<float>& norm, const float* X, int n, float* logits) {
    const int hc = c_.hc_mult;
    const int64_t d = c_.hidden;
    vector<float>& h = scratch(8, static_cast<size_t>(n * d));
    for (int t = 0; t < n; ++t) {
      const float* Xt = X + t * hc * d;
      float mix[16];
      {
        double ss = 0.0;
        for (int64_t j = 0; j < hc * d; ++j) ss += static_cast<double>(Xt[j]) * Xt[j];
        float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hc * d) + c_.rms_eps));
        for (int s = 0; s < hc; ++s) mix[s] = cpu::dot(hh.fn.data() + s * hc * d, Xt, hc * d) * rs;
      }
      vector<float>& hv = scratch(14, static_cast<size_t>(d));
      std::fill(hv.begin(), hv.begin() + d, 0.0f);
      for (int s = 0; s < hc; ++s) {
        float pre = sigmoidf(mix[s] * hh.scale[0] + hh.base[s]) + static_cast<float>(c_.hc_eps);
        for (int64_t j = 0; j < d; ++j) hv[j] += pre * Xt[s * d + j];
      }
      if (official_) num::round_bf16(hv.data(), d);
      cpu::rms_norm(hv.data(), d, norm.data(), c_.rms_eps, h.data() + t * d);
    }
    cpu::matmul_nt(h.data(), n, d, head_.w.data(), c_.vocab_size, logits);
  }

  // mix = (fn · v) * rsqrt(mean(v²) + eps) over the flattened hc*d streams.
  void mhc_mix(const Hc& h, const float* Xt, float* mix) const {
    const int64_t n = c_.hc_mult * c_.hidden;
    double ss = 0.0;
    for (int64_t j = 0; j < n; ++j) ss += static_cast<double>(Xt[j]) * Xt[j];
    float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + c_.rms_eps));
    for (int r = 0; r < c_.hc_mix(); ++r) mix[r] = cpu::dot(h.fn.data() + r * n, Xt, n) * rs;
  }

  // comb = Sinkhorn(softmax_rows(logits) + eps): a column pass, then (iters-1) × (row, column) passes.
  void sinkhorn(const Hc& h, const float* mix, float* C) const {
    const int hc = c_.hc_mult;
    const float eps = static_cast<float>(c_.hc_eps);
    for (int j = 0; j < hc; ++j) {
      float mx = -std::numeric_limits<float>::infinity();
      float row[16];
      for (int k = 0; k < hc; ++k) {
        row[k] = mix[2 * hc + j * hc + k] * h.scale[2] + h.base[2 * hc + j * hc + k];
        mx = std::max(mx, row[k]);
      }
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
      for (int k = 0; k < hc; ++k) C[j * hc + k] = row[k] / sum + eps;
    }
    auto col = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] /= (s + eps);
      }
    };
    auto rowp = [&] {
      for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += C[j * hc + k];
        for (int k = 0; k < hc; ++k) C[j * hc + k] /= (s + eps);
      }
    };
    col();
    for (int it = 0; it < c_.hc_sinkhorn_iters - 1; ++it) {
      rowp();
      col();
    }
  }

  // Post-processing of a pooled compressor entry (MODEL.md §5.6): RMSNorm, RoPE at the window's first position,
  // then SIM8 (main) or Hadamard + SIM4 (indexer) in official numerics.
  void finish_entry(const Layer& L, const Comp& C, float* e, int64_t pos, bool main) const {
    const int64_t c = C.width, R = c_.rope_dim;
    if (official_) num::round_bf16(e, c);
    cpu::rms_norm(e, c, C.norm.data(), c_.rms_eps, e);
    if (official_) num::round_bf16(e, c);
    rope_rotate(e + (c - R), L.inv_freq.data(), static_cast<int>(R / 2), pos, false);
    if (!official_) return;
    num::round_bf16(e + (c - R), R);
    if (main) {
      num::fp8_sim(e, c - R, 64);
    } else {
      num::hadamard(e, static_cast<int>(c));
      num::round_bf16(e, c);
      num::fp4_sim(e, c);
    }
  }

  void score(const float* lg, int E, float* s) const {
    switch (c_.scoring_func) {
      case ScoringFunc::SqrtSoftplus:
        for (int e = 0; e < E; ++e) {
          float v = lg[e];
          float sp = v > 20.0f ? v : std::log1p(std::exp(v));
          s[e] = std::sqrt(sp);
        }
        break;
      case ScoringFunc::Sigmoid:
        for (int e = 0; e < E; ++e) s[e] = sigmoidf(lg[e]);
        break;
      case ScoringFunc::Softmax: {
        float mx = *std::max_element(lg, lg + E);
        double z = 0;
        for (int e = 0; e < E; ++e) z += std::exp(static_cast<double>(lg[e] - mx));
        for (int e = 0; e < E; ++e) s[e] = static_cast<float>(std::exp(static_cast<double>(lg[e] - mx)) / z);
        break;
      }
    }
  }

  // acc += wgt * w2(silu(min(w1 x, lim)) * clamp(w3 x, ±lim)); the routing weight is applied before w2.
  void expert_ffn(const Expert& e, const float* x, float wgt, vector<double>& acc) {
    const int64_t I = e.w1.out, d = e.w1.in;
    vector<float>& g = scratch(9, static_cast<size_t>(I));
    vector<float>& u = scratch(10, static_cast<size_t>(I));
    vector<float>& y = scratch(11, static_cast<size_t>(d));
    linear(e.w1, x, 1, g.data());
    linear(e.w3, x, 1, u.data());
    const float lim = static_cast<float>(c_.swiglu_limit);
    for (int64_t j = 0; j < I; ++j) {
      float gv = g[j], uv = u[j];
      if (lim > 0) {
        gv = std::min(gv, lim);
        uv = std::clamp(uv, -lim, lim);
      }
      g[j] = cpu::silu(gv) * uv * wgt;
    }
    if (official_) num::round_bf16(g.data(), I);
    linear(e.w2, g.data(), 1, y.data());
    for (int64_t j = 0; j < d; ++j) acc[j] += y[j];
  }

  // y = x · Wᵀ. Official numerics: FP8/FP4-stored weights see QA8-quantized activations (1x128 blocks, UE8M0) and
  // produce BF16 outputs.
  void linear(const Lin& l, const float* x, int n, float* y) {
    const float* xin = x;
    if (official_ && l.low_precision) {
      vector<float>& q = scratch(12, static_cast<size_t>(n) * l.in);
      std::memcpy(q.data(), x, static_cast<size_t>(n * l.in) * 4);
      for (int t = 0; t < n; ++t) qa8_row(q.data() + t * l.in, l.in);
      xin = q.data();
    }
    cpu::matmul_nt(xin, n, l.in, l.w.data(), l.out, y);
    if (official_) num::round_bf16(y, static_cast<int64_t>(n) * l.out);
  }

  static void qa8_row(float* x, int64_t n) {
    int64_t full = n / 128 * 128;
    if (full) num::fp8_sim(x, full, 128);
    if (n > full) {  // a short last block (tiny test models): same rule over the remaining elements
      int64_t rem = n - full;
      num::fp8_sim(x + full, rem, static_cast<int>(rem));
    }
  }

  // Scratch buffers keyed by slot, per thread: they grow to the largest size seen and are then reused, and
  // new_sequence() pre-grows them for its max context on every OpenMP thread, so decoding never allocates.
  template <typename T = float>
  static vector<T>& tls(int slot, size_t n) {
    thread_local std::vector<std::vector<T>> bufs;
    if (bufs.size() <= static_cast<size_t>(slot)) bufs.resize(static_cast<size_t>(slot) + 1);
    auto& b = bufs[static_cast<size_t>(slot)];
    if (b.size() < n) b.resize(n);
    return b;
  }
  static vector<float>& scratch(int slot, size_t n) { return tls<float>(slot, n); }

  // Pre-grows every scratch slot a decode step (n = 1) or a chunk of `chunk` tokens touches.
  void reserve_scratch(int64_t max_ctx) {
    const int64_t D = c_.head_dim, d = c_.hidden;
    int64_t max_rows = c_.window;
    for (const Layer& L : layers_)
      if (L.has_comp) max_rows = std::max<int64_t>(max_rows, c_.window + (L.kind == AttnKind::HCA ? max_ctx / L.ratio + 1 : c_.index_topk));
    int64_t max_comp = 1;
    for (const Layer& L : layers_)
      if (L.has_comp) max_comp = std::max<int64_t>(max_comp, max_ctx / L.ratio + 1);
    const size_t big = static_cast<size_t>(std::max<int64_t>({c_.q_lora_rank, D, c_.hc_mult * d, c_.moe_inter, d,
                                                              c_.n_routed_experts, 4 * c_.index_head_dim,
                                                              c_.n_heads * D, c_.o_groups * c_.o_lora_rank,
                                                              c_.index_n_heads * c_.index_head_dim}));
#pragma omp parallel
    {
      for (int slot = 0; slot < 20; ++slot) scratch(slot, big);
      tls<const float*>(0, static_cast<size_t>(max_rows));
      scratch(20, static_cast<size_t>(max_rows));
      tls<std::pair<float, int32_t>>(0, static_cast<size_t>(max_comp));
      tls<int>(0, static_cast<size_t>(c_.n_routed_experts));
      tls<double>(0, static_cast<size_t>(d));
      scratch(21, static_cast<size_t>(2 * 128));
      scratch(22, static_cast<size_t>(std::max<int64_t>(D, c_.index_head_dim)));
    }
  }

  ModelConfig c_;
  bool official_ = false;
  vector<float> embed_, norm_;
  Lin head_;
  Hc hc_head_;
  vector<Layer> layers_;
  std::deque<vector<float>> f32_bufs_;
  std::deque<vector<int32_t>> i32_bufs_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace dsv4
