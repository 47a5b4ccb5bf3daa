// The CUDA backend: the DeepSeek-V4 op interface on one GPU. Weights stay in their stored formats on the device
// (FP8 E4M3 + 128x128 scales, MXFP4/NVFP4 packed E2M1 + block scales, BF16/F16/F32) and are dequantized inside the
// kernels; activations are fp32 device buffers; per-sequence state lives in device memory sized from max_context.
// Each op mirrors its CPU twin in backend/cpu/cpu_backend.cpp, including where `official` numerics quantize/round.
#include <cuda_runtime.h>
#if DSV4_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/peer_allreduce.h"
#include "core/error.h"
#include "model/rope.h"

namespace dsv4 {
namespace {

using cuda::DevLinear;

// Owns every device allocation of the backend (weights, state, buffers); freed in the destructor.
class DevHeap {
 public:
  ~DevHeap() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    DSV4_CU(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    ptrs_.push_back(p);
    bytes_ += bytes;
    return p;
  }
  template <typename T>
  T* upload(const T* host, size_t count) {
    T* p = static_cast<T*>(alloc(count * sizeof(T)));
    DSV4_CU(cudaMemcpy(p, host, count * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }
  float* upload_f32(const TensorView* t) {
    if (!t) return nullptr;
    std::vector<float> v(static_cast<size_t>(t->numel()));
    tensor_to_f32(*t, v.data());
    return upload(v.data(), v.size());
  }
  DevLinear linear(const LinearRef& r) {
    DevLinear l = cuda::upload_linear(r);
    ptrs_.push_back(const_cast<void*>(l.w));
    if (l.scale) ptrs_.push_back(const_cast<float*>(l.scale));
    if (l.scale8) ptrs_.push_back(const_cast<uint8_t*>(l.scale8));
    bytes_ += l.weight_bytes();
    return l;
  }
  // Frees a linear uploaded by linear() (its memory moved into a pair).
  void release(DevLinear& l) {
    for (const void* p : {static_cast<const void*>(l.w), static_cast<const void*>(l.scale), static_cast<const void*>(l.scale8)}) {
      if (!p) continue;
      auto it = std::find(ptrs_.begin(), ptrs_.end(), const_cast<void*>(p));
      if (it != ptrs_.end()) ptrs_.erase(it), cudaFree(const_cast<void*>(p));
    }
    bytes_ -= l.weight_bytes();
    l.w = nullptr, l.scale = nullptr, l.scale8 = nullptr;
  }
  uint64_t bytes() const { return bytes_; }  // everything allocated through this heap

  // Two linears over the same input, stored back to back (a's rows, then b's) so that a single-token step runs them as
  // one GEMV ([a | b] outputs); a and b become views into the pair. Only where the scale grids stack exactly (same
  // format, width and scale columns; FP8 needs a.out % 128 == 0 so that b starts on a tile); otherwise `pair` stays
  // empty and a, b are uploaded as usual.
  void linear_pair(const LinearRef& ra, const LinearRef& rb, DevLinear& a, DevLinear& b, DevLinear& pair) {
    a = linear(ra);
    b = linear(rb);
    const bool fp8 = a.fmt == WeightFormat::FP8_E8M0 || a.fmt == WeightFormat::FP8_F32;
    const bool fp4 = a.fp4();
    if (a.fmt != b.fmt || a.in != b.in || a.sb_cols != b.sb_cols || (fp8 && a.out % 128 != 0) || a.scale2 != b.scale2) return;
    auto data_bytes = [&](const DevLinear& l) -> size_t {
      const int64_t e = l.out * l.in;
      return static_cast<size_t>(fp8 ? e : fp4 ? e / 2 : (l.fmt == WeightFormat::F32 ? e * 4 : e * 2));
    };
    auto scale_count = [&](const DevLinear& l) -> size_t {
      return static_cast<size_t>(fp8 ? ((l.out + 127) / 128) * l.sb_cols : fp4 ? l.out * l.sb_cols : 0);
    };
    const size_t wa = data_bytes(a), wb = data_bytes(b), sa = scale_count(a), sbc = scale_count(b);
    pair = a;
    pair.out = a.out + b.out;
    auto* w = static_cast<uint8_t*>(alloc(wa + wb));
    DSV4_CU(cudaMemcpy(w, a.w, wa, cudaMemcpyDeviceToDevice));
    DSV4_CU(cudaMemcpy(w + wa, b.w, wb, cudaMemcpyDeviceToDevice));
    pair.w = w;
    const size_t es = fp4 ? 1 : 4;  // FP4 scales stay bytes, FP8 scales are fp32
    uint8_t* sc = nullptr;
    if (sa + sbc > 0) {
      sc = static_cast<uint8_t*>(alloc(((sa + sbc) * es + 15) / 16 * 16));  // 16-byte rounding: see upload_linear
      DSV4_CU(cudaMemcpy(sc, a.scales(), sa * es, cudaMemcpyDeviceToDevice));
      DSV4_CU(cudaMemcpy(sc + sa * es, b.scales(), sbc * es, cudaMemcpyDeviceToDevice));
    }
    auto set_scales = [&](DevLinear& l, uint8_t* p) {
      l.scale = fp4 || !p ? nullptr : reinterpret_cast<const float*>(p);
      l.scale8 = fp4 ? p : nullptr;
    };
    set_scales(pair, sc);
    release(a), release(b);
    a.w = w, b.w = w + wa;
    set_scales(a, sc);
    set_scales(b, sc ? sc + sa * es : nullptr);
  }

 private:
  std::vector<void*> ptrs_;
  uint64_t bytes_ = 0;
};

struct DevHc {
  float *fn = nullptr, *base = nullptr, *scale = nullptr;
};
struct DevComp {
  int ratio = 0;
  int64_t width = 0;
  bool overlap = false;
  DevLinear wkv, wgate;
  DevLinear wkv_wgate;  // both stored back to back (single-token steps: one GEMV); empty if they do not stack
  float *ape = nullptr, *norm = nullptr;
};
struct DevLayer {
  AttnKind kind = AttnKind::SWA;
  int ratio = 0;
  bool hash = false;
  float* inv_freq = nullptr;
  DevHc hc_attn, hc_ffn;
  float *attn_norm = nullptr, *ffn_norm = nullptr, *sink = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
  DevLinear wq_a, wq_b, wkv, wo_a, wo_b;
  DevLinear wq_a_wkv;  // wq_a and wkv back to back (single-token steps), or empty
  DevLinear wq_b_idx;  // wq_b and the indexer's wq_b back to back (CSA; single-token steps, unless DSV4_WQB_STACK=0)
  bool has_comp = false, has_idx = false;
  DevComp comp, icomp;
  DevLinear idx_wq_b, idx_wproj;
  DevLinear gate;
  float* gate_bias = nullptr;
  int32_t* tid2eid = nullptr;
  cuda::DevExpert* table = nullptr;  // device [E]
  bool tiles = false;                 // every entry has its tile-major copies (DSV4_EXPERT_TILES=1)
  WeightFormat efmt = WeightFormat::MXFP4;
  int64_t esb1 = 0, esb2 = 0;
  bool has_shared = false;
  DevLinear sw1, sw2, sw3;
  DevLinear sw13;  // shared w1 and w3 back to back (single-token steps), or empty
  // MTP block only (layer index n_layers).
  bool mtp = false;
  DevLinear e_proj, h_proj;
  float *enorm = nullptr, *hnorm = nullptr, *mtp_norm = nullptr;
  DevHc mtp_hc_head;
};

struct DevLayerState {
  float* ring = nullptr;
  float *comp = nullptr, *cK = nullptr, *cZ = nullptr;
  float *idx = nullptr, *iK = nullptr, *iZ = nullptr;
  int64_t cap = 0, n_comp = 0, n_idx = 0;  // entry counts, mirrored on the host (deterministic from positions)
  int64_t comp_state = 0, idx_state = 0;   // floats in cK/cZ and iK/iZ
  // SequenceState::drop_last (the CPU twin's logic): each compressor's ratio and overlap, and what
  // prepare_drop_last saved -- the counts and an overlapping state's rows [0, m) (the previous window).
  int c_ratio = 0, i_ratio = 0;
  bool c_overlap = false, i_overlap = false;
  int64_t drop_n_comp = 0, drop_n_idx = 0;
  float *drop_cK = nullptr, *drop_cZ = nullptr, *drop_iK = nullptr, *drop_iZ = nullptr;  // allocated on first use
};

// A recorded single-token step (CUDA graph) for one (activation buffers, with/without head) pair of a sequence. The
// graph has the addresses of the sequence state, the caller's buffers and the backend's scratch baked in; it reads
// the step's position from the backend's device scalar, so one recording serves every later position.
struct DecodeGraph {
  const void* buffers = nullptr;
  bool head = false;
  std::vector<uint64_t> rows;   // a batched step's sequences (CudaSequence::uid, row order); empty for one token
  uint64_t last_use = 0;        // batched steps: the backend keeps the most recently used few
  bool warmed = false;          // one eager step in graph mode has sized every scratch buffer for this key
  uint64_t scratch_gen = 0;     // the scratch generation the recording points into
  cudaGraphExec_t exec = nullptr;
  // CudaOptions::profile_ops: an event pair around every op of the step, in op order (recorded as event nodes when
  // captured, so every replay re-records them).
  struct OpEvents {
    const char* name;
    cudaEvent_t begin, end;
  };
  std::vector<OpEvents> prof;
  size_t prof_n = 0;
  ~DecodeGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    for (auto& e : prof) cudaEventDestroy(e.begin), cudaEventDestroy(e.end);
  }
};

class CudaSequence final : public SequenceState {
 public:
  CudaSequence(const ModelConfig& c, const std::vector<DevLayer>& layers, int64_t max_ctx, cudaStream_t s)
      : uid_(next_uid()), c_(c), max_ctx_(max_ctx), s_(s) {
    for (const DevLayer& L : layers) {
      DevLayerState st;
      st.ring = static_cast<float*>(heap_.alloc(static_cast<size_t>(c.window * c.head_dim) * 4));
      if (L.has_comp) {
        st.cap = max_ctx / L.ratio + 1;
        st.comp = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.cap * c.head_dim) * 4));
        const int64_t coff = L.comp.overlap ? 2 : 1;
        st.comp_state = coff * L.ratio * coff * L.comp.width;
        st.cK = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.comp_state) * 4));
        st.cZ = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.comp_state) * 4));
        st.c_ratio = L.comp.ratio, st.c_overlap = L.comp.overlap;
      }
      if (L.has_idx) {
        st.idx = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.cap * c.index_head_dim) * 4));
        const int64_t coff = L.icomp.overlap ? 2 : 1;
        st.idx_state = coff * L.ratio * coff * L.icomp.width;
        st.iK = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.idx_state) * 4));
        st.iZ = static_cast<float*>(heap_.alloc(static_cast<size_t>(st.idx_state) * 4));
        st.i_ratio = L.icomp.ratio, st.i_overlap = L.icomp.overlap;
      }
      layers_.push_back(st);
    }
    reset();
  }
  int64_t max_context() const override { return max_ctx_; }
  // Never reused (unlike the object's address): a batched-step recording names its sequences by it, so a recording
  // of sequences that are gone can never match a new one allocated where they were.
  uint64_t uid() const { return uid_; }
  void reset() override {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (auto& st : layers_) {
      DSV4_CU(cudaMemsetAsync(st.ring, 0, static_cast<size_t>(c_.window * c_.head_dim) * 4, s_));
      st.n_comp = st.n_idx = 0;
      if (st.cK) {
        cuda::fill_f32(st.cK, st.comp_state, 0.0f, s_);
        cuda::fill_f32(st.cZ, st.comp_state, ninf, s_);
      }
      if (st.iK) {
        cuda::fill_f32(st.iK, st.idx_state, 0.0f, s_);
        cuda::fill_f32(st.iZ, st.idx_state, ninf, s_);
      }
    }
    DSV4_CU(cudaStreamSynchronize(s_));
  }

  // Snapshots mirror the CPU backend: device copies of what later tokens overwrite (window rings, compressor running
  // state) plus the entry counts; compressed entries are append-only, so restore only truncates the counts.
  bool supports_snapshots() const override { return true; }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    auto snap = std::make_unique<Snapshot>();
    const size_t ring = static_cast<size_t>(c_.window * c_.head_dim);
    for (const DevLayerState& st : layers_) {
      Snapshot::Layer l;
      l.ring = copy_out(snap->heap, st.ring, ring);
      l.cK = copy_out(snap->heap, st.cK, static_cast<size_t>(st.comp_state));
      l.cZ = copy_out(snap->heap, st.cZ, static_cast<size_t>(st.comp_state));
      l.iK = copy_out(snap->heap, st.iK, static_cast<size_t>(st.idx_state));
      l.iZ = copy_out(snap->heap, st.iZ, static_cast<size_t>(st.idx_state));
      l.comp_state = st.comp_state, l.idx_state = st.idx_state;
      l.n_comp = st.n_comp, l.n_idx = st.n_idx;
      snap->layers.push_back(l);
    }
    snap->ring = ring;
    return snap;
  }
  void restore(const StateSnapshot& base) override {
    const auto* snap = dynamic_cast<const Snapshot*>(&base);
    if (!snap || snap->layers.size() != layers_.size() || snap->ring != static_cast<size_t>(c_.window * c_.head_dim))
      fail("restore: snapshot does not belong to this sequence");
    for (size_t l = 0; l < layers_.size(); ++l)
      if (snap->layers[l].comp_state != layers_[l].comp_state || snap->layers[l].idx_state != layers_[l].idx_state ||
          snap->layers[l].n_comp > layers_[l].cap || snap->layers[l].n_idx > layers_[l].cap)
        fail("restore: snapshot does not belong to this sequence (layer ", l, " differs)");
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Snapshot::Layer& a = snap->layers[l];
      DevLayerState& st = layers_[l];
      copy_in(st.ring, a.ring, snap->ring);
      copy_in(st.cK, a.cK, static_cast<size_t>(st.comp_state));
      copy_in(st.cZ, a.cZ, static_cast<size_t>(st.comp_state));
      copy_in(st.iK, a.iK, static_cast<size_t>(st.idx_state));
      copy_in(st.iZ, a.iZ, static_cast<size_t>(st.idx_state));
      st.n_comp = a.n_comp;
      st.n_idx = a.n_idx;
    }
  }

  // Speculative decoding's one-token rollback, as the CPU twin (CpuSequence::save_for_drop / undo_last): device copies
  // of the overlapping compressors' rows [0, m) (half of their state) and the host counts; stream-ordered with the
  // forwards on s_.
  bool supports_drop_last() const override { return true; }
  void save_for_drop() override {
    for (DevLayerState& st : layers_) {
      if ((st.cK && st.c_ratio < 2) || (st.iK && st.i_ratio < 2))
        fail("drop_last needs compression ratios >= 2 (a ratio-1 compressor emits at every token)");
      st.drop_n_comp = st.n_comp, st.drop_n_idx = st.n_idx;
      if (st.cK && st.c_overlap) save_half(st.cK, st.drop_cK, st.comp_state), save_half(st.cZ, st.drop_cZ, st.comp_state);
      if (st.iK && st.i_overlap) save_half(st.iK, st.drop_iK, st.idx_state), save_half(st.iZ, st.drop_iZ, st.idx_state);
    }
  }
  void undo_last(int64_t p) override {
    auto emitted = [p](int m) { return (p + 1) % m == 0; };
    for (DevLayerState& st : layers_) {
      if (st.cK && emitted(st.c_ratio)) {
        st.n_comp = st.drop_n_comp;
        if (st.c_overlap) copy_in(st.cK, st.drop_cK, static_cast<size_t>(st.comp_state / 2)), copy_in(st.cZ, st.drop_cZ, static_cast<size_t>(st.comp_state / 2));
      }
      if (st.iK && emitted(st.i_ratio)) {
        st.n_idx = st.drop_n_idx;
        if (st.i_overlap) copy_in(st.iK, st.drop_iK, static_cast<size_t>(st.idx_state / 2)), copy_in(st.iZ, st.drop_iZ, static_cast<size_t>(st.idx_state / 2));
      }
    }
  }

  // The recording for (buffers, head), created empty on first use.
  DecodeGraph& graph(const void* buffers, bool head) {
    for (auto& g : graphs_)
      if (g->buffers == buffers && g->head == head) return *g;
    graphs_.push_back(std::make_unique<DecodeGraph>());
    graphs_.back()->buffers = buffers;
    graphs_.back()->head = head;
    return *graphs_.back();
  }

  std::vector<DevLayerState> layers_;

 private:
  struct Snapshot final : StateSnapshot {
    struct Layer {
      float *ring = nullptr, *cK = nullptr, *cZ = nullptr, *iK = nullptr, *iZ = nullptr;
      int64_t comp_state = 0, idx_state = 0, n_comp = 0, n_idx = 0;
    };
    DevHeap heap;  // freed (cudaFree synchronizes the device) when the snapshot goes away
    std::vector<Layer> layers;
    size_t ring = 0;
  };
  // Stream-ordered device-to-device copies: a snapshot taken after a step sees the step's writes, and later steps
  // (same stream) cannot overwrite the source before the copy ran.
  float* copy_out(DevHeap& heap, const float* src, size_t n) const {
    if (!src || n == 0) return nullptr;
    float* dst = static_cast<float*>(heap.alloc(n * 4));
    DSV4_CU(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, s_));
    return dst;
  }
  void copy_in(float* dst, const float* src, size_t n) const {
    if (!dst || n == 0) return;
    DSV4_CU(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, s_));
  }
  void save_half(const float* src, float*& dst, int64_t floats) {
    if (!dst) dst = static_cast<float*>(heap_.alloc(static_cast<size_t>(floats / 2) * 4));
    copy_in(dst, src, static_cast<size_t>(floats / 2));
  }
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;

  static uint64_t next_uid() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  uint64_t uid_;
  ModelConfig c_;
  int64_t max_ctx_;
  cudaStream_t s_;
  DevHeap heap_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& o) : opts_(o), profiling_(o.profile_ops), tp_(o.tp_size), rank_(o.tp_rank) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      fail("the CUDA backend needs a GPU: ", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device visible");
    if (o.device < 0 || o.device >= n) fail("CUDA device ", o.device, " does not exist (", n, " visible)");
    if (tp_ < 1 || rank_ < 0 || rank_ >= tp_ || (tp_ > 1 && !o.nccl_comm))
      fail("CUDA backend: bad tensor-parallel rank ", rank_, " of ", tp_);
    DSV4_CU(cudaSetDevice(o.device));
    DSV4_CU(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    DSV4_CU(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DSV4_CU(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&attn_fork_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&idx_q_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&idx_done_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&wqb_ev_, cudaEventDisableTiming));
    DSV4_CU(cudaEventCreateWithFlags(&up_ev_, cudaEventDisableTiming));
    for (int i = 0; i < 3; ++i) {
      DSV4_CU(cudaStreamCreateWithFlags(&attn_side_[i], cudaStreamNonBlocking));
      DSV4_CU(cudaEventCreateWithFlags(&attn_join_ev_[i], cudaEventDisableTiming));
    }
    err_ = static_cast<int*>(heap_.alloc(sizeof(int)));
    DSV4_CU(cudaMemset(err_, 0, sizeof(int)));
    dpos_ = static_cast<int64_t*>(heap_.alloc(kMaxGraphRows * sizeof(int64_t)));
    DSV4_CU(cudaMemset(dpos_, 0, kMaxGraphRows * sizeof(int64_t)));
    DSV4_CU(cudaDeviceSynchronize());
  }
  ~CudaBackend() override {
    for (auto& e : eager_prof_) cudaEventDestroy(e.begin), cudaEventDestroy(e.end);
    for (auto& b : scratch_) cudaFree(b.first);
    for (auto& b : iscratch_) cudaFree(b.first);
    if (fork_ev_) cudaEventDestroy(fork_ev_);
    if (join_ev_) cudaEventDestroy(join_ev_);
    if (attn_fork_ev_) cudaEventDestroy(attn_fork_ev_);
    if (idx_q_ev_) cudaEventDestroy(idx_q_ev_);
    if (idx_done_ev_) cudaEventDestroy(idx_done_ev_);
    if (wqb_ev_) cudaEventDestroy(wqb_ev_);
    if (up_ev_) cudaEventDestroy(up_ev_);
    for (int i = 0; i < 3; ++i) {
      if (attn_join_ev_[i]) cudaEventDestroy(attn_join_ev_[i]);
      if (attn_side_[i]) cudaStreamDestroy(attn_side_[i]);
    }
    if (side_) cudaStreamDestroy(side_);
    if (s_) cudaStreamDestroy(s_);
  }
  const char* name() const override { return "cuda"; }

  void load(const ModelConfig& c, const ModelWeights& w, Numerics numerics) override {
    c_ = c;
    official_ = numerics == Numerics::Official;
    // The quantization simulation works on whole blocks (SIM8: 64 nope dims, SIM4: 32 indexer dims), as the CPU
    // reference requires; reject shapes it would reject instead of quantizing a partial block silently.
    if (official_ && (c.nope_dim() % 64 != 0 || c.index_head_dim % 32 != 0))
      fail("official numerics need head_dim - rope_dim (", c.nope_dim(), ") to be a multiple of 64 and index_head_dim (",
           c.index_head_dim, ") a multiple of 32");
    const ckpt::TensorView& et = *w.embed;
    switch (et.dtype()) {
      case ckpt::DType::F32: embed_dtype_ = 0; break;
      case ckpt::DType::BF16: embed_dtype_ = 1; break;
      case ckpt::DType::F16: embed_dtype_ = 2; break;
      default: fail(*et.file, ": embedding '", et.name(), "' has dtype ", ckpt::dtype_name(et.dtype()), ", expected BF16/F16/F32");
    }
    const uint64_t before = heap_.bytes();
    check_fits(w);
    if (tp_ > 1) {
      if (c.n_heads % tp_ || c.o_groups % tp_ || c.moe_inter % tp_ || c.vocab_size % tp_)
        fail("CUDA backend: this model does not split ", tp_, " ways");
      if (w.head.out * tp_ != c.vocab_size || w.layers.empty() || w.layers[0].wq_b.out * tp_ != c.n_heads * c.head_dim)
        fail("CUDA backend rank ", rank_, ": load it with the rank's weight shards (shard_model_weights)");
    }
    embed_ = heap_.upload(et.data, et.nbytes());
    head_ = heap_.linear(w.head);
    norm_ = heap_.upload_f32(w.norm);
    hc_head_ = hc(w.hc_head);
    for (const LayerWeights& lw : w.layers) layers_.push_back(load_layer(lw));
    // The MTP block is layer n_layers (as on the CPU): its sequence state comes with every new_sequence.
    if (w.mtp) layers_.push_back(load_layer(*w.mtp));
    weight_bytes_ = heap_.bytes() - before;
    // The fused single-token indexer's counters (cuda::indexer_topk_fused), three per layer, zero between launches.
    idx_counters_ = static_cast<int*>(heap_.alloc(3 * layers_.size() * sizeof(int)));
    DSV4_CU(cudaMemset(idx_counters_, 0, 3 * layers_.size() * sizeof(int)));
    size_t free_b = 0, total_b = 0;
    DSV4_CU(cudaMemGetInfo(&free_b, &total_b));
    std::fprintf(stderr, "[dsv4] cuda:%d%s: weights %.2f GiB loaded, %.2f GiB of %.2f GiB free for state and workspaces\n",
                 opts_.device, tp_ > 1 ? (" (tp rank " + std::to_string(rank_) + ")").c_str() : "",
                 weight_bytes_ / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
  }

  // The memory plan before anything is uploaded: the weights as the device will hold them (stored bytes, block
  // scales widened to fp32 for FP8 and kept as bytes for FP4, small tensors as fp32) against the free memory, with 1 GiB
  // kept for workspaces.
  void check_fits(const ModelWeights& w) const {
    uint64_t need = w.embed->nbytes();
    for (const LinearRef* r : w.all_linears()) {
      if (!r->weight) continue;
      need += r->weight->nbytes();
      const bool fp4 = r->fmt == WeightFormat::MXFP4 || r->fmt == WeightFormat::NVFP4;
      if (r->scale) need += static_cast<uint64_t>(r->scale->numel()) * (fp4 ? 1 : 4);
    }
    need += need / 100;  // norms, mHC mixes, RoPE tables, expert tables: well under 1 %
    size_t free_b = 0, total_b = 0;
    DSV4_CU(cudaMemGetInfo(&free_b, &total_b));
    const uint64_t reserve = uint64_t(1) << 30;
    std::fprintf(stderr, "[dsv4] cuda:%d memory plan: weights %.2f GiB + 1 GiB workspace reserve; %.2f GiB free of %.2f GiB\n",
                 opts_.device, need / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
    if (need + reserve > free_b)
      fail("the model's weights need ", need / 1073741824.0, " GiB on cuda:", opts_.device, " (+1 GiB workspace) but only ",
           free_b / 1073741824.0, " GiB are free: use more GPUs (--tp 2, 4, 8) or fewer layers");
  }
  uint64_t weight_bytes() const { return weight_bytes_; }

  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override {
    if (max_context <= 0) fail("max context must be positive");
    return std::make_unique<CudaSequence>(c_, layers_, max_context, s_);
  }

  float* alloc_f32(size_t n) override {
    float* p = static_cast<float*>(heap_.alloc(n * 4));
    DSV4_CU(cudaMemset(p, 0, n * 4));
    DSV4_CU(cudaDeviceSynchronize());  // the memset runs on the legacy stream; s_ does not wait for it
    return p;
  }
  int32_t* alloc_i32(size_t n) override {
    int32_t* p = static_cast<int32_t*>(heap_.alloc(n * 4));
    DSV4_CU(cudaMemset(p, 0, n * 4));
    DSV4_CU(cudaDeviceSynchronize());
    return p;
  }
  // The per-step transfers (a step's token ids up, its logits down, the error flag) through page-locked staging
  // buffers (cuda::pinned_io_enabled, opt-in until measured): the upload returns without waiting for the GPU (the
  // stream orders the copy before the step's kernels), the download is plain DMA with the error flag in the same
  // stream, so a step costs the host one synchronisation instead of three. Off: the caller's pageable memory.
  void upload_i32(int32_t* dst, const int32_t* src, size_t n) override {
    if (!cuda::pinned_io_enabled()) {
      DSV4_CU(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyHostToDevice, s_));
      DSV4_CU(cudaStreamSynchronize(s_));  // src is pageable caller memory that may change after we return
      return;
    }
    if (up_pending_) DSV4_CU(cudaEventSynchronize(up_ev_));  // the previous upload's copy has left the buffer
    void* h = up_.get(n * 4);
    std::memcpy(h, src, n * 4);
    DSV4_CU(cudaMemcpyAsync(dst, h, n * 4, cudaMemcpyHostToDevice, s_));
    DSV4_CU(cudaEventRecord(up_ev_, s_));
    up_pending_ = true;
  }
  void download_f32(float* dst, const float* src, size_t n) override { download(dst, src, n * 4); }
  void download_i32(int32_t* dst, const int32_t* src, size_t n) override { download(dst, src, n * 4); }
  void download(void* dst, const void* src, size_t bytes) {
    if (!cuda::pinned_io_enabled()) {
      DSV4_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
      synchronize();
      return;
    }
    void* h = down_.get(bytes);
    DSV4_CU(cudaMemcpyAsync(h, src, bytes, cudaMemcpyDeviceToHost, s_));
    synchronize();  // throws on a kernel's error report: dst is then left as it was
    std::memcpy(dst, h, bytes);
  }
  void synchronize() override {
    DSV4_CU(cudaStreamSynchronize(side_));  // moe()'s shared-expert branch (joined into s_ unless an op threw midway)
    for (cudaStream_t st : attn_side_) DSV4_CU(cudaStreamSynchronize(st));  // likewise the compressor / indexer
    int e = 0;
    if (cuda::pinned_io_enabled()) {  // the flag behind the stream's work: one wait for both
      int* he = static_cast<int*>(err_host_.get(sizeof(int)));
      DSV4_CU(cudaMemcpyAsync(he, err_, sizeof(int), cudaMemcpyDeviceToHost, s_));
      DSV4_CU(cudaStreamSynchronize(s_));
      e = *he;
    } else {
      DSV4_CU(cudaStreamSynchronize(s_));
      DSV4_CU(cudaMemcpy(&e, err_, sizeof(int), cudaMemcpyDeviceToHost));
    }
    up_pending_ = false;  // s_ has completed: so has any upload's copy
    attn_side_open_ = idx_scores_pending_ = false;  // every branch has completed: nothing left to join
    for (int64_t& g : attn_wait_gen_) g = -1;
    if (e) {
      // Cleared in s_'s order: the next step's kernels and the next flag read follow it (a legacy-stream memset
      // would not be ordered with this non-blocking stream).
      DSV4_CU(cudaMemsetAsync(err_, 0, sizeof(int), s_));
      fail("CUDA backend: a kernel reported invalid input (code ", e,
           e & 1 ? ": the indexer selected a compressed entry that is not visible" : "", ")");
    }
  }

  // Decode graphs. First step of a key: eager in graph mode (kernels read the position from dpos_ and scratch is sized
  // for the sequence's max context, so nothing depends on the host-side position any more); second: the same ops
  // captured into a graph, then run; later: the host-side state bookkeeping plus one graph launch.
  StepMode begin_decode_step(const void* buffers, SequenceState& sst, int64_t pos, bool head) override {
    if (!opts_.decode_graphs) return StepMode::Eager;
    if (step_) fail("CUDA backend: begin_decode_step while a step is in progress");
    auto& S = static_cast<CudaSequence&>(sst);
    // Pageable source: the copy is staged before the call returns, so `pos` may go out of scope.
    DSV4_CU(cudaMemcpyAsync(dpos_, &pos, sizeof(int64_t), cudaMemcpyHostToDevice, s_));
    return start_step(S.graph(buffers, head), [&] { advance_counts(S, pos); });
  }

  // Batched steps (Forward::forward_batch) the same way, per (buffers, head, ordered sequences): while a server's
  // batch keeps its members, every step after the first two replays one graph. Each row's position is dpos_[row];
  // the per-row ops run under RowScope. Not while eager ops are profiled (`dsv4 bench`'s per-op split of a batched
  // step times the ops one by one). DSV4_BATCH_GRAPHS=0: batched steps always eager (A/B).
  static bool batch_graphs_enabled() {
    static const bool on = [] {
      const char* e = std::getenv("DSV4_BATCH_GRAPHS");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  StepMode begin_decode_batch(const void* buffers, SequenceState* const* sts, const int64_t* pos, int n,
                              bool head) override {
    pair_step_ = one_sequence_chunk(n, pos, sts);  // (attn_qkv_rows, which sees no sequences; end_decode_step clears)
    if (!opts_.decode_graphs || !batch_graphs_enabled() || eager_profiling_ || n < 2 || n > kMaxGraphRows)
      return StepMode::Eager;
    if (step_) fail("CUDA backend: begin_decode_batch while a step is in progress");
    std::vector<uint64_t> key;
    for (int i = 0; i < n; ++i) key.push_back(static_cast<const CudaSequence*>(sts[i])->uid());
    DecodeGraph& g = batch_graph(buffers, head, key);
    DSV4_CU(cudaMemcpyAsync(dpos_, pos, static_cast<size_t>(n) * sizeof(int64_t), cudaMemcpyHostToDevice, s_));
    const StepMode m = start_step(g, [&] {
      for (int i = 0; i < n; ++i) advance_counts(static_cast<CudaSequence&>(*sts[i]), pos[i]);
    });
    batch_step_ = m != StepMode::Replay;
    return m;
  }
  // The recording of a batched step's key, created empty on first use; beyond kBatchGraphs recordings the least
  // recently used goes (a batch whose membership changed will not come back often).
  static constexpr size_t kBatchGraphs = 8;
  DecodeGraph& batch_graph(const void* buffers, bool head, const std::vector<uint64_t>& rows) {
    ++batch_clock_;
    for (auto& g : batch_graphs_)
      if (g->buffers == buffers && g->head == head && g->rows == rows) {
        g->last_use = batch_clock_;
        return *g;
      }
    if (batch_graphs_.size() >= kBatchGraphs) {
      auto old = std::min_element(batch_graphs_.begin(), batch_graphs_.end(),
                                  [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
      DSV4_CU(cudaStreamSynchronize(s_));  // it may still be running: destroyed only once the stream is idle
      batch_graphs_.erase(old);
    }
    batch_graphs_.push_back(std::make_unique<DecodeGraph>());
    DecodeGraph& g = *batch_graphs_.back();
    g.buffers = buffers, g.head = head, g.rows = rows, g.last_use = batch_clock_;
    return g;
  }

  // A recorded step's key: replayed if recorded (after `advance`, the host-side bookkeeping the skipped ops would have
  // done), else run eagerly in graph mode once (sizing every scratch buffer), then captured.
  template <class Advance>
  StepMode start_step(DecodeGraph& g, Advance&& advance) {
    if (g.exec && g.scratch_gen != scratch_gen_) {  // a scratch buffer moved since the recording: record again
      DSV4_CU(cudaGraphExecDestroy(g.exec));
      g.exec = nullptr;
      g.warmed = false;
    }
    last_step_ = &g;
    if (g.exec) {
      advance();
      DSV4_CU(cudaGraphLaunch(g.exec, s_));
      ++replays_;
      return StepMode::Replay;
    }
    step_ = &g;
    dyn_ = true;
    g.prof_n = 0;
    if (!g.warmed) return StepMode::Eager;
    // Thread-local capture: other threads' CUDA calls are unaffected; an illegal call on this thread fails loudly.
    // TP ranks capture side by side from one thread (the next rank's step set-up runs while this rank captures), so
    // they use relaxed mode.
    DSV4_CU(cudaStreamBeginCapture(s_, tp_ > 1 ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    return StepMode::Record;
  }

  void end_decode_step(bool completed) override {
    pair_step_ = false;
    if (!step_) return;
    DecodeGraph& g = *step_;
    step_ = nullptr;
    dyn_ = batch_step_ = false;
    row_ = 0;
    if (!capturing_) {
      if (completed) g.warmed = true;
      return;
    }
    capturing_ = false;
    if (!completed) join_attn_side(true);  // an op threw mid-layer: every forked stream joined before the capture ends
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s_, &graph);
    if (!completed) {
      if (graph) cudaGraphDestroy(graph);
      return;
    }
    DSV4_CU(e);
    const cudaError_t ie = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    DSV4_CU(ie);
    g.scratch_gen = scratch_gen_;
    ++captures_;
    DSV4_CU(cudaGraphLaunch(g.exec, s_));  // the captured ops were recorded, not run: run this step now
  }

  void embed(const int32_t* ids, int n, float* X) override {
    OpScope prof(this, "embed");
    cuda::embed(embed_, embed_dtype_, c_.hidden, ids, n, c_.hc_mult, X, s_);
  }

  cuda::HcPreArgs hc_pre_args(int layer, HcSite site, const float* X, int n, float* x, float* post, float* comb) {
    const DevLayer& L = lay(layer);
    const DevHc& h = site == HcSite::Attn ? L.hc_attn : L.hc_ffn;
    cuda::HcPreArgs a;
    a.X = X, a.n = n, a.hc = c_.hc_mult, a.d = c_.hidden;
    a.fn = h.fn, a.base = h.base, a.scale = h.scale;
    a.norm_w = site == HcSite::Attn ? L.attn_norm : L.ffn_norm;
    a.hc_eps = static_cast<float>(c_.hc_eps), a.rms_eps = c_.rms_eps;
    a.sinkhorn_iters = c_.hc_sinkhorn_iters, a.official = official_;
    a.x = x, a.post = post, a.comb = comb;
    a.comb_logits = defer_sinkhorn(n);
    a.partial = scratch(23, static_cast<size_t>(cuda::hc_pre_scratch_floats(n, a.hc, a.d)));
    // An attention pre leaving comb logits: the next attn_qkv's norm launch may finish them (norm_sinkhorn).
    attn_comb_logits_ = site == HcSite::Attn && a.comb_logits && !a.head ? comb : nullptr;
    return a;
  }
  cuda::DeferredComb deferred_comb(float* comb) const {
    return cuda::DeferredComb{comb, static_cast<float>(c_.hc_eps), c_.hc_sinkhorn_iters};
  }
  // The comb input of a post: final where a launch since its pre finished the logits (comb_final_), else comb_in(n).
  cuda::HcCombIn post_comb_in(const float* comb, int n) {
    const bool final = comb != nullptr && comb == comb_final_;
    comb_final_ = nullptr;
    return final ? cuda::HcCombIn{} : comb_in(n);
  }
  // Decode: every pre leaves comb's logits and the post consuming that comb (same n: a sub-layer's pre and post pair
  // up) forms comb from them, off the pre's critical path. The rule depends on n only, so producer and consumer agree.
  bool defer_sinkhorn(int n) const { return n == 1 && c_.hc_mult == 4 && cuda::hc_defer_sinkhorn_enabled(); }
  cuda::HcCombIn comb_in(int n) const {
    cuda::HcCombIn ci;
    if (defer_sinkhorn(n)) ci.sinkhorn_iters = c_.hc_sinkhorn_iters, ci.eps = static_cast<float>(c_.hc_eps);
    return ci;
  }

  void hc_pre(int layer, HcSite site, const float* X, int n, float* x, float* post, float* comb) override {
    OpScope prof(this, "hc_pre");
    cuda::hc_pre(hc_pre_args(layer, site, X, n, x, post, comb), s_);
  }

  void hc_post(const float* y, const float* post, const float* comb, int n, float* X) override {
    OpScope prof(this, "hc_post");
    cuda::hc_post(y, post, comb, n, c_.hc_mult, c_.hidden, official_, X, s_, post_comb_in(comb, n));
  }

  void hc_post_pre(const float* y, float* post, float* comb, int n, float* X, int layer, HcSite site, float* x) override {
    OpScope prof(this, "hc_post_pre");
    const cuda::HcCombIn ci = post_comb_in(comb, n);
    cuda::hc_post_pre(y, post, comb, X, hc_pre_args(layer, site, X, n, x, post, comb), s_, ci);
  }

  void attn_qkv(int layer, const float* x, int n, int64_t pos0, float* qr, float* q, float* kv) override {
    OpScope prof(this, "attn_qkv");
    // A fork left open by a sub-layer that threw before its attend: joined first, so that this op's work (and the next
    // compressor / indexer ops) are ordered after it. A no-op otherwise.
    join_attn_side();
    stored_rows_.clear(), deroped_.clear();
    stacked_qi_ = nullptr, stacked_layer_ = -1;
    const DevLayer& L = lay(layer);
    const int64_t D = c_.head_dim, ql = c_.q_lora_rank;
    const int H = heads();  // this rank's query heads (all of them without TP)
    // wq_a and wkv read the same x: one QA8 of it, and for a single token one GEMV over the stored pair.
    float* tmp = scratch(0, static_cast<size_t>(n) * (ql + D));
    const float* xq = nullptr;
    auto input_for = [&](const DevLinear& W) -> const float* {
      if (!official_ || !W.low_precision()) return x;
      if (!xq) {
        float* q8 = scratch(30, static_cast<size_t>(n) * c_.hidden);
        cuda::qa8_rows(x, n, c_.hidden, q8, s_);
        xq = q8;
      }
      return xq;
    };
    float* kvraw = tmp + static_cast<size_t>(n) * ql;
    std::optional<OpScope> part;  // prefill (eager) profiling: the op's parts
    part.emplace(this, "attn_qkv/wq_a+wkv", true);
    if (n == 1 && L.wq_a_wkv.w) {
      lin(L.wq_a_wkv, x, 1, tmp);  // [q_lora | head_dim]; lin() quantizes x inside the GEMV
    } else {
      lin_shared(L.wq_a, x, input_for, n, tmp);
      lin_shared(L.wkv, x, input_for, n, kvraw);
    }
    const QkvNorms nr = qkv_norms(L, tmp, qr, kvraw, kv, q, n, pos0);
    const cuda::NormRopeArgs &a = nr.qlora, &k = nr.kv;
    cuda::NormRopeArgs b = nr.heads;
    qkv_q_ = n == 1 ? q : nullptr, qkv_kv_ = n == 1 ? kv : nullptr;  // attend(): rows_before_wait
    part.reset();
    part.emplace(this, "attn_qkv/norms", true);
    // The q_lora norm and the KV norm/RoPE/SIM8 are independent: one launch. Decode (unless
    // DSV4_NORM_SINKHORN=0): its extra block also finishes the attention pre's deferred comb (two kernels back), for the post
    // after wo_b -- a GEMV on every SM -- to read it final.
    cuda::DeferredComb dc;
    if (n == 1 && tp_ == 1 && attn_comb_logits_ && cuda::norm_sinkhorn_enabled()) {
      dc = deferred_comb(attn_comb_logits_);
      comb_final_ = attn_comb_logits_;
    }
    attn_comb_logits_ = nullptr;
    cuda::norm_rope2(a, k, s_, dc);
    part.reset();
    // Decode: the compressor and indexer ops the model issues next read only x and qr (ready here) and write their own
    // state and scratch, so they run on side streams -- parallel branches of a captured step -- beside wq_b and the
    // query RoPE; attend() joins them. Three branches (kSideIdx, kSideIdxQ, kSideComp: see SideScope) because the
    // indexer's compressor, its queries and the main compressor are independent of each other: in series they were
    // ~47 us of small latency-bound kernels on a CSA layer (one H200), vs ~15 us of this op's remaining kernels.
    // Re-forked per call: a batch's rows (one call each) move the fork point to the last row's qr.
    // Lazy (DSV4_ATTN_LAZY_FORK, default): a branch joins the fork when an op first runs on it (SideScope), and
    // attend() joins only those: an HCA layer uses one of the three (its compressor), and the two empty branches'
    // edges into attend's first kernel go away (a graph branch point measured ~3 us of lost PDL overlap per fork /
    // join pair, session 8).
    if (n == 1) fork_attn_side(L);
    // Prefill: wq_b's official BF16 output rounding happens as q_rope reads q (NormRopeArgs::round_x) instead of in a
    // pass of its own over the n x 32768 output. Decode keeps it in the GEMV's epilogue (free there).
    const bool defer_round = official_ && n > 1;
    b.round_x = defer_round;
    if (n == 1 && attn_side_open_ && tp_ == 1 && !batch_step_ && !in_row_loop_ && L.wq_b_idx.w &&
        cuda::wqb_stack_enabled()) {
      // One GEMV for wq_b and the indexer's wq_b (default; DSV4_WQB_STACK=0: two): both are persistent tensor-core
      // GEMVs over every SM, which cannot overlap anyway. The query RoPE reads the stacked output; indexer_topk takes
      // its queries from the rest, on its branch after wqb_ev_.
      float* qq = scratch(50, static_cast<size_t>(L.wq_b_idx.out));
      part.emplace(this, "attn_qkv/wq_b", true);
      lin(L.wq_b_idx, qr, 1, qq, true);
      DSV4_CU(cudaEventRecord(wqb_ev_, s_));
      stacked_qi_ = qq + L.wq_b.out, stacked_layer_ = layer;
      part.reset();
      part.emplace(this, "attn_qkv/q_rope", true);
      b.x = qq;
      cuda::norm_rope(b, s_);
      return;
    }
    part.emplace(this, "attn_qkv/wq_b", true);
    lin(L.wq_b, qr, n, q, !defer_round);
    part.reset();
    part.emplace(this, "attn_qkv/q_rope", true);
    cuda::norm_rope(b, s_);
  }

  // The fork point of attn_qkv's side branches (see there): decode, on layers with a compressor.
  void fork_attn_side(const DevLayer& L) {
    if (L.kind == AttnKind::SWA || !cuda::attn_fork_enabled()) return;
    DSV4_CU(cudaEventRecord(attn_fork_ev_, s_));
    ++attn_fork_gen_;  // a batch re-forks per row: a branch's next op waits on this (the newest) fork point
    if (!cuda::attn_lazy_fork_enabled()) {
      for (int i = 0; i < 3; ++i) {
        DSV4_CU(cudaStreamWaitEvent(attn_side_[i], attn_fork_ev_, 0));
        attn_wait_gen_[i] = attn_fork_gen_;
      }
    }
    attn_side_open_ = true;
  }

  void compressor_step(int layer, CompressorKind which, const float* x, int n, int64_t pos0,
                       SequenceState& sst) override {
    const bool main = which == CompressorKind::Main;
    SideScope side(this, attn_side_open_ ? (main ? kSideComp : kSideIdx) : -1);
    OpScope prof(this, "compressor");
    const DevLayer& L = lay(layer);
    const int slot = main ? 1 : 46;  // K / Z scratch: the two compressors may run at once (side streams)
    const DevComp& C = main ? L.comp : L.icomp;
    if (!(main ? L.has_comp : L.has_idx)) fail("layer ", layer, " has no ", main ? "compressor" : "indexer");
    const int64_t W = (C.overlap ? 2 : 1) * C.width;
    float *K, *Z;
    if (n == 1 && C.wkv_wgate.w) {  // one GEMV over the stored pair: [K | Z]
      K = scratch(slot, static_cast<size_t>(2 * W));
      Z = K + W;
      // The main compressor's pair (2 x 1,024 rows on a CSA layer) beside the other branches' kernels (LinearArgs::
      // beside), forked or not, so that its bits do not depend on the fork; DSV4_COMP_BESIDE=0: the ring kernel.
      plain(C.wkv_wgate, x, 1, K, false, main && cuda::comp_beside_enabled());
    } else {
      K = scratch(slot, static_cast<size_t>(n * W));
      Z = scratch(slot + 1, static_cast<size_t>(n * W));
      plain(C.wkv, x, n, K);
      plain(C.wgate, x, n, Z);
    }
    compressor_emit(layer, which, K, Z, n, pos0, sst);
  }
  // The compressor kernel of compressor_step on its projections K, Z [n, W] (a batch row: n = 1, under its RowScope).
  void compressor_emit(int layer, CompressorKind which, const float* K, const float* Z, int n, int64_t pos0,
                       SequenceState& sst) {
    const bool main = which == CompressorKind::Main;
    const DevLayer& L = lay(layer);
    DevLayerState& S = seq(sst, layer);
    const DevComp& C = main ? L.comp : L.icomp;
    const int m = C.ratio;
    int64_t& count = main ? S.n_comp : S.n_idx;
    const int64_t emitted = (pos0 + n) / m - pos0 / m;
    if (count + emitted > S.cap)
      fail("compressed cache of layer ", layer, " is full (max context ", sst.max_context(), ")");
    cuda::CompressorArgs a;
    a.K = K, a.Z = Z, a.n = n, a.pos0 = pos0, a.ratio = m, a.width = C.width, a.overlap = C.overlap;
    a.ape = C.ape, a.norm_w = C.norm, a.eps = c_.rms_eps, a.rope_dim = c_.rope_dim, a.inv_freq = L.inv_freq;
    a.official = official_, a.main = main;
    a.sK = main ? S.cK : S.iK, a.sZ = main ? S.cZ : S.iZ, a.cache = main ? S.comp : S.idx, a.count0 = count;
    a.dpos = dpos();
    cuda::compressor(a, s_);
    count += emitted;
  }

  void indexer_topk(int layer, const float* x, const float* qr, int n, int64_t pos0, SequenceState& sst,
                    int32_t* topk) override {
    const bool fork = attn_side_open_;
    std::optional<SideScope> side;
    side.emplace(this, fork ? kSideIdx : -1);  // after the indexer's compressor (the cache it scores)
    OpScope prof(this, "indexer_topk");
    const DevLayer& L = lay(layer);
    const DevLayerState& S = seq(sst, layer);
    const int Hi = c_.index_n_heads, K = c_.index_topk, m = L.ratio;
    const int64_t Di = c_.index_head_dim;
    const int64_t visible_end = (pos0 + n) / m;
    if (visible_end > S.n_idx)
      fail("indexer: ", visible_end, " entries should be visible at position ", pos0 + n - 1, " but only ", S.n_idx, " exist");
    float* qI = scratch(3, static_cast<size_t>(n) * Hi * Di);
    float* wI = scratch(4, static_cast<size_t>(n) * Hi);
    {  // the queries and head weights read only qr and x: their own branch, beside the indexer's compressor
      SideScope qside(this, fork ? kSideIdxQ : -1);
      OpScope sub(this, "indexer_topk/queries", true);
      // A batch's rows (one call each, in one fork window) share qI / wI: this row's queries overwrite them only after
      // the previous row's scores (on kSideIdx) have read them.
      if (fork && idx_scores_pending_) DSV4_CU(cudaStreamWaitEvent(s_, idx_done_ev_, 0));
      const bool stacked = n == 1 && fork && stacked_layer_ == layer && stacked_qi_;
      if (!stacked) lin(L.idx_wq_b, qr, n, qI);
      plain(L.idx_wproj, x, n, wI, official_);  // official: the head weights BF16-rounded (the CPU's bf16 linear)
      if (stacked) {  // the queries came with wq_b's GEMV on the main stream (attn_qkv)
        DSV4_CU(cudaStreamWaitEvent(s_, wqb_ev_, 0));
        qI = stacked_qi_;
        stacked_qi_ = nullptr, stacked_layer_ = -1;
      }
      cuda::indexer_q_prep(qI, n, Hi, Di, c_.rope_dim, L.inv_freq, pos0, official_, s_, dpos());
      if (fork) DSV4_CU(cudaEventRecord(idx_q_ev_, s_));
    }
    if (fork) DSV4_CU(cudaStreamWaitEvent(s_, idx_q_ev_, 0));
    // Graph mode: a position-independent score row (the whole cache capacity; keys past the visible ones are -inf
    // and never read by the top-k).
    const int64_t ld = dyn_ ? S.cap : std::max<int64_t>(1, visible_end);
    float* sc = scratch(13, static_cast<size_t>(n * ld));
    if (n == 1 && cuda::indexer_fused_enabled() && cuda::indexer_topk_fused_ok(Hi, Di, K)) {
      // One launch for the scores and the top-k (one kernel boundary fewer on the CSA layer's longest branch).
      // One token, one sequence (DSV4_TOPK_MAIN, default): on the main stream, after the query RoPE, with this
      // branch (which has joined the queries' branch) joined into it, so that the attention -- the next kernel of
      // the main stream -- follows the top-k by a programmatic edge: launched at the top-k's start, it waits on the
      // device, where a join edge from a side branch released it only at the top-k's end plus a launch (phase
      // stamps, session 32: past its wait 3.7-4.1 us after the top-k's end before, 2.5 now). The same kernel on
      // another stream: the same bits.
      // (One GPU only: TP2 was not measured with it -- no 2-GPU machine in session 32 -- so a rank keeps its branch.)
      if (fork && tp_ == 1 && !batch_step_ && !in_row_loop_ && cuda::topk_main_enabled()) {
        side.reset();
        join_branch(kSideIdx);
        attn_wait_gen_[kSideIdxQ] = -1;  // joined through kSideIdx (it waited on idx_q_ev_ above)
      }
      OpScope sub(this, "indexer_topk/scores+topk", true);
      cuda::IndexerTopkArgs a;
      a.q = qI, a.wts = wI, a.keys = S.idx, a.heads = Hi, a.Di = Di, a.pos0 = pos0, a.ratio = m, a.n_keys = S.n_idx;
      a.official = official_, a.scores = sc, a.ld = ld, a.k = K, a.topk = topk, a.dpos = dpos();
      a.counters = idx_counters_ + 3 * static_cast<size_t>(layer);
      cuda::indexer_topk_fused(a, s_);
    } else {
      {
        OpScope sub(this, "indexer_topk/scores", true);
        cuda::indexer_scores(qI, wI, S.idx, n, Hi, Di, pos0, m, S.n_idx, official_, sc, ld, s_, dpos());
      }
      {
        OpScope sub(this, "indexer_topk/topk", true);
        cuda::topk_rows(sc, n, ld, pos0, m, K, topk, s_, dpos());
      }
    }
    if (fork) {
      DSV4_CU(cudaEventRecord(idx_done_ev_, s_));
      idx_scores_pending_ = true;
    }
  }

  void attend(int layer, const float* q, const float* kv, const int32_t* topk, int n, int64_t pos0,
              SequenceState& sst, float* o) override {
    // The compressor / indexer ops since attn_qkv ran on the side branches joined here (not on s_ right before).
    join_attn_side();
    OpScope prof(this, "attend");
    const DevLayer& L = lay(layer);
    DevLayerState& S = seq(sst, layer);
    cuda::AttendArgs a = attend_args(layer, q, kv, topk, n, pos0, sst, o);
    a.scratch = scratch(14, static_cast<size_t>(cuda::attend_scratch_floats(a)));
    // Decode: the attention's merge kernel also stores the token's kv row into the ring, so the window_store that
    // the model issues next with the same arguments has nothing left to launch (one kernel boundary fewer).
    const bool fuse_store = n == 1 && cuda::attend_store_fuse_enabled();
    if (fuse_store) a.store_ring = S.ring;
    // ... and (decode, and official prefill chunks on the wgmma kernel) applies attn_out's inverse RoPE to o, whose
    // norm_rope launch attn_out then skips.
    const bool derope = cuda::attend_derope_fuse_enabled() && cuda::attend_derope_fusable(a);
    if (derope) a.derope_inv_freq = L.inv_freq, a.derope_dim = static_cast<int>(c_.rope_dim);
    // One token on a sliding-window layer: the ring holds earlier steps' rows and kv is attn_qkv's (two kernels
    // before the query RoPE, which every kernel's wait-then-trigger orders), so the rows may be requested before the
    // wait on the query's kernel. Not on a compressed layer: its entries and top-k come from the compressor / indexer
    // branches, and in a captured graph reading them before the wait raced -- as if the PDL launch made the joins'
    // edges programmatic too, released once the branches' last kernels have passed their waits, before they wrote
    // anything (session 25: single-token Flash-shaped graphs differed run to run by rel L2 ~1e-3 / 1e-2; eager
    // launches, where a cross-stream wait is a full dependency, and one stream were exact).
    // (Only for the q and kv this sub-layer's attn_qkv produced, its last kernels.)
    a.rows_before_wait = n == 1 && cuda::attend_rows_early_enabled() && q == qkv_q_ && kv == qkv_kv_ && a.kind == 0;
    qkv_q_ = qkv_kv_ = nullptr;
    cuda::attend(a, s_);
    if (fuse_store) stored_rows_.push_back(StoredRow{S.ring, kv, pos0});
    if (derope) deroped_.push_back(Deroped{layer, o, pos0});
  }

  void window_store(int layer, const float* kv, int n, int64_t pos0, SequenceState& sst) override {
    OpScope prof(this, "window_store");
    DevLayerState& S = seq(sst, layer);
    if (n == 1) {  // stored by this sub-layer's attention (one row per sequence of a batch): nothing to launch
      const auto it = std::find(stored_rows_.begin(), stored_rows_.end(), StoredRow{S.ring, kv, pos0});
      if (it != stored_rows_.end()) {
        stored_rows_.erase(it);
        return;
      }
    }
    cuda::window_store(kv, n, pos0, c_.window, c_.head_dim, S.ring, s_, dpos());
  }

  void attn_out(int layer, const float* o, int n, int64_t pos0, float* out) override {
    OpScope prof(this, "attn_out");
    const DevLayer& L = lay(layer);
    const int H = heads();
    const int64_t D = c_.head_dim;
    const float* u = o;  // the de-roped attention output
    // Sized on every path: a switch flipped between a graph's warm-up and its capture must not grow it in capture.
    float* ur = scratch(5, static_cast<size_t>(n) * H * D);
    const auto done = std::find(deroped_.begin(), deroped_.end(), Deroped{layer, o, pos0});
    if (done != deroped_.end()) {
      deroped_.erase(done);  // the attention kernel applied the inverse RoPE already
    } else {
      OpScope sub(this, "attn_out/derope", true);
      cuda::norm_rope(derope_args(L, o, ur, n, pos0), s_);
      u = ur;
    }
    attn_out_project(L, u, n, out);
  }

  // attn_qkv's norms of n tokens from pos0 (graph mode: the device position): the q_lora rows' norm (qraw -> qr), the KV
  // rows' norm, RoPE and SIM8 (kvraw -> kv), and -- after wq_b -- the query heads' RoPE (q in place).
  struct QkvNorms {
    cuda::NormRopeArgs qlora, kv, heads;
  };
  QkvNorms qkv_norms(const DevLayer& L, const float* qraw, float* qr, const float* kvraw, float* kv, float* q, int n,
                     int64_t pos0) const {
    QkvNorms r;
    cuda::NormRopeArgs& a = r.qlora;
    a.x = qraw, a.y = qr, a.rows = n, a.len = c_.q_lora_rank, a.w = L.q_norm, a.eps = c_.rms_eps, a.official = official_;
    cuda::NormRopeArgs& b = r.heads;
    b.x = q, b.y = q, b.rows = n * heads(), b.rows_per_token = heads(), b.len = c_.head_dim, b.w = nullptr, b.eps = c_.rms_eps;
    b.rope_dim = c_.rope_dim, b.inv_freq = L.inv_freq, b.pos0 = pos0, b.official = official_, b.dpos = dpos();
    cuda::NormRopeArgs& k = r.kv;
    k = b;
    k.x = kvraw, k.y = kv, k.rows = n, k.rows_per_token = 1, k.w = L.kv_norm, k.sim8_block = 64;
    return r;
  }
  // attn_out's inverse RoPE of n tokens' attention output o -> y from pos0 (graph mode: the device position).
  cuda::NormRopeArgs derope_args(const DevLayer& L, const float* o, float* y, int n, int64_t pos0) const {
    cuda::NormRopeArgs a;
    a.x = o, a.y = y, a.rows = n * heads(), a.rows_per_token = heads(), a.len = c_.head_dim, a.do_norm = false;
    a.rope_dim = c_.rope_dim, a.inv_freq = L.inv_freq, a.pos0 = pos0, a.inverse = true, a.official = official_;
    a.dpos = dpos();
    return a;
  }

  // Batched decode (one token of each of n sequences, Forward::forward_batch): the position-free linears of the
  // attention -- wq_a, wkv, wq_b here, wo_a and wo_b in attn_out_rows -- as one multi-row GEMV each, so their weights
  // (~141 MB per Flash layer) stream once per step instead of once per row; the position-dependent norms/RoPE per row
  // with the row's position, as attn_qkv computes them (the same kernels per row). One GPU (TP keeps the row loop) and
  // the Forward's contiguous row strides; otherwise, and for one row, the Backend's loop over attn_qkv.
  // DSV4_BATCH_ROWS=0: the row loop always (A/B).
  static bool batch_rows_enabled() {
    static const bool on = [] {
      const char* e = std::getenv("DSV4_BATCH_ROWS");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  bool batched_rows(int n) const {
    const RowDims& d = row_dims();
    // The row paths take host-side positions: never inside a decode-graph step (whose ops read the device position).
    if (n > 1 && dyn_ && !batch_step_) fail("CUDA backend: a batched row op inside a single-token decode step");
    return batch_rows_enabled() && n > 1 && n < cuda::kGemmMinTokens && tp_ == 1 && d.x == c_.hidden && d.qr == c_.q_lora_rank &&
           d.q == heads() * c_.head_dim && d.kv == c_.head_dim && d.o == heads() * c_.head_dim;
  }
  // One GPU: every *_rows op takes a verify pair's rows (attend_rows reads the earlier row's kv from the batch, the
  // compressor and indexer rows run in order; the rest is per row or position-free). TP ranks keep the chunk path.
  // Reference numerics too (cuda::pair_rows_reference_enabled, default on): session 26's clean run (after the
  // single-token graphs' early-row race was fixed) had the Flash-shaped reference pairs bit-identical eager / recorded /
  // recorded again and 2.2e-7 off the plain steps.
  bool pair_rows() const override { return tp_ == 1 && (official_ || cuda::pair_rows_reference_enabled()); }
  // Rows that are one sequence's consecutive positions (a verify pair): its chunk of n tokens at pos[0].
  static bool one_sequence_chunk(int n, const int64_t* pos, SequenceState* const* sts) {
    if (n < 2) return false;
    for (int i = 1; i < n; ++i)
      if (sts[i] != sts[0] || pos[i] != pos[0] + i) return false;
    return true;
  }
  static bool rows_repeat_sequence(SequenceState* const* sts, int n) {
    for (int i = 1; i < n; ++i)
      for (int j = 0; j < i; ++j)
        if (sts[j] == sts[i]) return true;
    return false;
  }
  // Row i of a batched op runs with row_ = i, so that in a recorded batched step it reads its own device position.
  struct RowScope {
    CudaBackend* b;
    RowScope(CudaBackend* be, int i) : b(be) { b->row_ = i; }
    ~RowScope() { b->row_ = 0; }
  };
  // The *_rows ops below fall back to the Backend's row loop (the single-sequence op per row), each row under its
  // RowScope, where their batched form does not apply.
  // Batched: the projections of all n rows as one GEMV over the stored wkv|wgate pair (its weights stream once per step,
  // not once per row), then each row's compressor kernel. On attn_qkv_rows' side branch like the single-row op.
  void compressor_step_rows(int layer, CompressorKind which, const float* x, int n, const int64_t* pos,
                            SequenceState* const* sts) override {
    const RowDims& d = row_dims();
    const bool main = which == CompressorKind::Main;
    const DevLayer& L = lay(layer);
    const DevComp& C = main ? L.comp : L.icomp;
    if (!batched_rows(n) || !(main ? L.has_comp : L.has_idx) || !C.wkv_wgate.w) {
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        compressor_step(layer, which, x + i * d.x, 1, pos[i], *sts[i]);
      }
      return;
    }
    SideScope side(this, attn_side_open_ ? (main ? kSideComp : kSideIdx) : -1);
    OpScope prof(this, "compressor");
    const int64_t W = (C.overlap ? 2 : 1) * C.width;
    float* KZ = scratch(main ? 1 : 46, static_cast<size_t>(n) * 2 * W);  // row i: [K | Z] at KZ + i * 2W
    plain(C.wkv_wgate, x, n, KZ);
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      const float* K = KZ + i * 2 * W;
      compressor_emit(layer, which, K, K + W, 1, pos[i], *sts[i]);
    }
  }
  // Batched: the indexer queries and head weights of all n rows as one GEMV each (weights streamed once per step), each
  // row's query RoPE/Hadamard prep, then per row its scores over its own cache and its top-k. The branches and events
  // of indexer_topk.
  void indexer_topk_rows(int layer, const float* x, const float* qr, int n, const int64_t* pos,
                         SequenceState* const* sts, int32_t* topk) override {
    const RowDims& d = row_dims();
    if (!batched_rows(n)) {
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        indexer_topk(layer, x + i * d.x, qr + i * d.qr, 1, pos[i], *sts[i], topk + i * d.topk);
      }
      return;
    }
    const bool fork = attn_side_open_;
    SideScope side(this, fork ? kSideIdx : -1);  // after the indexer's compressor (the caches it scores)
    OpScope prof(this, "indexer_topk");
    const DevLayer& L = lay(layer);
    const int Hi = c_.index_n_heads, K = c_.index_topk, m = L.ratio;
    const int64_t Di = c_.index_head_dim;
    const bool chunk = one_sequence_chunk(n, pos, sts);
    std::vector<int64_t> ld(static_cast<size_t>(n)), off(static_cast<size_t>(n) + 1, 0);
    for (int i = 0; i < n; ++i) {
      const DevLayerState& S = seq(*sts[i], layer);
      const int64_t visible_end = (pos[i] + 1) / m;
      if (visible_end > S.n_idx)
        fail("indexer: ", visible_end, " entries should be visible at position ", pos[i], " but only ", S.n_idx, " exist");
      ld[static_cast<size_t>(i)] = dyn_ ? S.cap : std::max<int64_t>(1, visible_end);  // as indexer_topk
      off[static_cast<size_t>(i) + 1] = off[static_cast<size_t>(i)] + ld[static_cast<size_t>(i)];
    }
    float* qI = scratch(3, static_cast<size_t>(n) * Hi * Di);
    float* wI = scratch(4, static_cast<size_t>(n) * Hi);
    {
      SideScope qside(this, fork ? kSideIdxQ : -1);
      if (fork && idx_scores_pending_) DSV4_CU(cudaStreamWaitEvent(s_, idx_done_ev_, 0));
      lin(L.idx_wq_b, qr, n, qI);
      plain(L.idx_wproj, x, n, wI);
      if (official_) cuda::round_bf16(wI, static_cast<int64_t>(n) * Hi, s_);
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        if (chunk && i > 0) break;  // a verify pair: its rows' queries as one chunk's (row 0's position), one launch
        cuda::indexer_q_prep(qI + i * Hi * Di, chunk ? n : 1, Hi, Di, c_.rope_dim, L.inv_freq, pos[i], official_, s_,
                             dpos());
      }
      if (fork) DSV4_CU(cudaEventRecord(idx_q_ev_, s_));
    }
    if (fork) DSV4_CU(cudaStreamWaitEvent(s_, idx_q_ev_, 0));
    // A verify pair: the scores and top-k of its rows as one chunk's (one launch each; row stride the ld of the
    // chunk's last row, the longest), as indexer_topk runs a chunk.
    const int64_t ldc = ld[static_cast<size_t>(n) - 1];
    float* sc = scratch(13, static_cast<size_t>(chunk ? n * ldc : off.back()));
    if (chunk) {
      RowScope r(this, 0);
      const DevLayerState& S = seq(*sts[0], layer);
      cuda::indexer_scores(qI, wI, S.idx, n, Hi, Di, pos[0], m, S.n_idx, official_, sc, ldc, s_, dpos());
      cuda::topk_rows(sc, n, ldc, pos[0], m, K, topk, s_, dpos());
    }
    for (int i = 0; i < n && !chunk; ++i) {
      RowScope r(this, i);
      const DevLayerState& S = seq(*sts[i], layer);
      float* sci = sc + off[static_cast<size_t>(i)];
      const int64_t ldi = ld[static_cast<size_t>(i)];
      cuda::indexer_scores(qI + i * Hi * Di, wI + i * Hi, S.idx, 1, Hi, Di, pos[i], m, S.n_idx, official_, sci, ldi, s_,
                           dpos());
      cuda::topk_rows(sci, 1, ldi, pos[i], m, K, topk + i * d.topk, s_, dpos());
    }
    if (fork) {
      DSV4_CU(cudaEventRecord(idx_done_ev_, s_));
      idx_scores_pending_ = true;
    }
  }
  // Batched: every row's single-token attention in one launch of the cluster kernel (cuda::attend_batch; each row
  // exactly attend() of that token alone), with the fused window store and inverse RoPE as attend() does them.
  // Otherwise (more rows than one launch takes, TP, the split-KV path) attend() per row.
  void attend_rows(int layer, const float* q, const float* kv, const int32_t* topk, int n, const int64_t* pos,
                   SequenceState* const* sts, float* o) override {
    const RowDims& d = row_dims();
    // A verify pair (pair_rows: one sequence's consecutive positions) in one launch: every row reads the earlier rows'
    // window entries from kv (AttendRow::kv_back), not from the ring, and no row stores into the ring in the launch
    // (the later row's slot holds a position the earlier row reads): window_store_rows stores them all afterwards.
    const bool chunk = one_sequence_chunk(n, pos, sts);
    std::vector<cuda::AttendArgs> as;
    if (chunk && n <= cuda::kAttendMaxBatch && batched_rows(n)) {
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        as.push_back(attend_args(layer, q + i * d.q, kv, topk ? topk + i * d.topk : nullptr, 1, pos[i], *sts[i],
                                 o + i * d.o));
        as.back().kv_back = i;
      }
      if (cuda::attend_batch_ok(as[0])) return attend_batch_launch(layer, as, n, false, o);
      as.clear();
    }
    // Otherwise such rows go one by one, each row's kv stored before the next row's attention (fused into attend() or
    // stored right after it; window_store_rows then skips it). A sequence repeated in any other way is no batch.
    if (rows_repeat_sequence(sts, n) && !chunk)
      fail("CUDA backend: batched rows repeat a sequence but are not its consecutive positions");
    if (chunk) {
      qkv_q_ = qkv_kv_ = nullptr;  // and no row requests its ring rows before the previous row's store is done
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        const float* kvi = kv + i * d.kv;
        attend(layer, q + i * d.q, kvi, topk ? topk + i * d.topk : nullptr, 1, pos[i], *sts[i], o + i * d.o);
        DevLayerState& S = seq(*sts[i], layer);
        if (std::find(stored_rows_.begin(), stored_rows_.end(), StoredRow{S.ring, kvi, pos[i]}) == stored_rows_.end()) {
          window_store(layer, kvi, 1, pos[i], *sts[i]);
          stored_rows_.push_back(StoredRow{S.ring, kvi, pos[i]});
        }
      }
      return;
    }
    if (n >= 2 && n <= cuda::kAttendMaxBatch && batched_rows(n)) {
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        as.push_back(attend_args(layer, q + i * d.q, kv + i * d.kv, topk ? topk + i * d.topk : nullptr, 1, pos[i],
                                 *sts[i], o + i * d.o));
      }
    }
    if (as.empty() || !cuda::attend_batch_ok(as[0])) {
      for (int i = 0; i < n; ++i) {
        RowScope r(this, i);
        attend(layer, q + i * d.q, kv + i * d.kv, topk ? topk + i * d.topk : nullptr, 1, pos[i], *sts[i], o + i * d.o);
      }
      return;
    }
    attend_batch_launch(layer, as, n, cuda::attend_store_fuse_enabled(), o);
  }
  // The batched attention launch of attend_rows over its rows' arguments (each row's own scratch), with the fused
  // window store (store: every row's kv into its ring) and inverse RoPE where they apply.
  void attend_batch_launch(int layer, const std::vector<cuda::AttendArgs>& as, int n, bool store, float* o) {
    join_attn_side();
    OpScope prof(this, "attend");
    const DevLayer& L = lay(layer);
    const int64_t od = row_dims().o;
    std::vector<size_t> off(static_cast<size_t>(n) + 1, 0);
    for (int i = 0; i < n; ++i)  // each row's own scratch, 16-byte aligned
      off[static_cast<size_t>(i) + 1] = off[static_cast<size_t>(i)] + (static_cast<size_t>(cuda::attend_scratch_floats(as[static_cast<size_t>(i)])) + 3) / 4 * 4;
    float* sc = scratch(14, off.back());
    const bool fuse_store = store;
    const bool derope = cuda::attend_derope_fuse_enabled() && cuda::attend_derope_fusable(as[0]);
    cuda::AttendBatch b;
    b.n = n;
    for (int i = 0; i < n; ++i) {
      const cuda::AttendArgs& a = as[static_cast<size_t>(i)];
      cuda::AttendRow& r = b.r[i];
      r.q = a.q, r.kv = a.kv, r.ring = a.ring, r.comp = a.comp, r.topk = a.topk, r.o = a.o;
      r.store_ring = fuse_store ? const_cast<float*>(a.ring) : nullptr;
      r.scratch = sc + off[static_cast<size_t>(i)];
      r.pos0 = a.pos0, r.n_comp = a.n_comp, r.max_rows = a.max_rows, r.dpos = a.dpos, r.kv_back = a.kv_back;
    }
    cuda::AttendArgs base = as[0];
    if (derope) base.derope_inv_freq = L.inv_freq, base.derope_dim = static_cast<int>(c_.rope_dim);
    cuda::attend_batch(base, b, s_);
    for (int i = 0; i < n; ++i) {
      const cuda::AttendArgs& a = as[static_cast<size_t>(i)];
      if (fuse_store) stored_rows_.push_back(StoredRow{b.r[i].store_ring, a.kv, a.pos0});
      if (derope) deroped_.push_back(Deroped{layer, o + i * od, a.pos0});
    }
  }
  // attend()'s arguments for n tokens of sst from pos0 (graph mode: the device position of the current row), all but
  // the scratch and the fusions; the host-side checks of the caches.
  cuda::AttendArgs attend_args(int layer, const float* q, const float* kv, const int32_t* topk, int n, int64_t pos0,
                               SequenceState& sst, float* o) {
    const DevLayer& L = lay(layer);
    DevLayerState& S = seq(sst, layer);
    cuda::AttendArgs a;
    a.kind = L.kind == AttnKind::CSA ? 1 : (L.kind == AttnKind::HCA ? 2 : 0);
    if (a.kind == 2 && (pos0 + n) / L.ratio > S.n_comp)
      fail("attention: HCA entries missing at position ", pos0 + n - 1);
    if (a.kind == 1 && !topk) fail("attention: CSA layer ", layer, " called without top-k");
    a.q = q, a.kv = kv, a.ring = S.ring, a.comp = S.comp, a.topk = topk, a.sink = L.sink;
    a.n = n, a.H = heads(), a.window = c_.window, a.topk_k = c_.index_topk, a.ratio = std::max(L.ratio, 1);
    a.D = c_.head_dim, a.pos0 = pos0, a.n_comp = S.n_comp, a.official = official_;
    // Graph mode: scratch and launch shape for the sequence's capacity; the kernels use the step's actual rows.
    a.max_rows = cuda::attend_max_rows(a.window, a.kind, a.topk_k, dyn_ ? sst.max_context() : pos0 + n, a.ratio);
    a.dpos = dpos();
    a.o = o, a.err = err_;
    return a;
  }
  void window_store_rows(int layer, const float* kv, int n, const int64_t* pos, SequenceState* const* sts) override {
    const RowDims& d = row_dims();
    if (one_sequence_chunk(n, pos, sts)) {  // a verify pair: one launch for its rows unless attend_rows stored them
      const DevLayerState& S = seq(*sts[0], layer);
      bool stored = false;
      for (int i = 0; i < n; ++i)
        stored = stored || std::find(stored_rows_.begin(), stored_rows_.end(), StoredRow{S.ring, kv + i * d.kv, pos[i]}) !=
                               stored_rows_.end();
      if (!stored) {
        RowScope r(this, 0);  // the chunk's first position: row 0's
        return window_store(layer, kv, n, pos[0], *sts[0]);
      }
    }
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      window_store(layer, kv + i * d.kv, 1, pos[i], *sts[i]);
    }
  }
  void attn_qkv_row_loop(int layer, const float* x, int n, const int64_t* pos, float* qr, float* q, float* kv) {
    const RowDims& d = row_dims();
    // Every row's attn_qkv runs before any row's indexer: no stacked wq_b (see attn_qkv) while this loop runs.
    struct InRowLoop {
      bool& f;
      explicit InRowLoop(bool& flag) : f(flag) { f = true; }
      ~InRowLoop() { f = false; }
    } in_loop(in_row_loop_);
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      attn_qkv(layer, x + i * d.x, 1, pos[i], qr + i * d.qr, q + i * d.q, kv + i * d.kv);
    }
  }
  void attn_out_row_loop(int layer, const float* o, int n, const int64_t* pos, float* out) {
    const RowDims& d = row_dims();
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      attn_out(layer, o + i * d.o, 1, pos[i], out + i * d.x);
    }
  }

  void attn_qkv_rows(int layer, const float* x, int n, const int64_t* pos, float* qr, float* q, float* kv) override {
    const DevLayer& L = lay(layer);
    if (!batched_rows(n) || !L.wq_a_wkv.w) return attn_qkv_row_loop(layer, x, n, pos, qr, q, kv);
    OpScope prof(this, "attn_qkv");
    join_attn_side();
    stored_rows_.clear(), deroped_.clear();
    qkv_q_ = qkv_kv_ = nullptr;  // no row's attend() requests its rows early (they are not one attn_qkv's q / kv)
    const int64_t D = c_.head_dim, ql = c_.q_lora_rank;
    const int H = heads();
    // The stored wq_a|wkv pair over the n rows, [n, ql + D] (what attn_qkv runs for one row), then each row's q_lora
    // norm and KV norm/RoPE/SIM8 as attn_qkv's norm_rope2, wq_b over the n rows, each row's query RoPE.
    float* tmp = scratch(0, static_cast<size_t>(n) * (ql + D));
    lin(L.wq_a_wkv, x, n, tmp);
    auto row = [&](int i) {  // under row i's RowScope (the norms read its device position)
      float* t = tmp + i * (ql + D);
      return qkv_norms(L, t, qr + i * ql, t + ql, kv + i * D, q + i * H * D, 1, pos[i]);
    };
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      const QkvNorms nr = row(i);
      cuda::norm_rope2(nr.qlora, nr.kv, s_);
    }
    // x and every row's qr are ready: the compressor / indexer rows run on their side branches from here (attn_qkv).
    fork_attn_side(L);
    lin(L.wq_b, qr, n, q);
    if (pair_step_) {  // a verify pair: its rows' query RoPE as one chunk's, one launch
      RowScope r(this, 0);
      cuda::norm_rope(qkv_norms(L, tmp, qr, tmp + ql, kv, q, n, pos[0]).heads, s_);
      return;
    }
    for (int i = 0; i < n; ++i) {
      RowScope r(this, i);
      cuda::norm_rope(row(i).heads, s_);
    }
  }
  void attn_out_rows(int layer, const float* o, int n, const int64_t* pos, float* out) override {
    if (!batched_rows(n)) return attn_out_row_loop(layer, o, n, pos, out);
    // Each row's inverse RoPE: applied by its attend (the fused single-token merge) or here, per row at its position
    // (every row the same way; a mix takes the row loop). The projections are then position-free: one GEMV each.
    const DevLayer& L = lay(layer);
    const int H = heads();
    const int64_t D = c_.head_dim, od = row_dims().o;
    int done = 0;
    for (int i = 0; i < n; ++i)
      done += std::find(deroped_.begin(), deroped_.end(), Deroped{layer, o + i * od, pos[i]}) != deroped_.end();
    if (done != 0 && done != n) return attn_out_row_loop(layer, o, n, pos, out);
    OpScope prof(this, "attn_out");
    float* ur = scratch(5, static_cast<size_t>(n) * H * D);
    const float* u = o;
    for (int i = 0; i < n; ++i) {
      if (done) {
        deroped_.erase(std::find(deroped_.begin(), deroped_.end(), Deroped{layer, o + i * od, pos[i]}));
        continue;
      }
      RowScope r(this, i);
      cuda::norm_rope(derope_args(L, o + i * od, ur + i * H * D, 1, pos[i]), s_);
      u = ur;
    }
    attn_out_project(L, u, n, out);
  }

  // attn_out's projections of the de-roped attention output u [n, H * D]: the grouped wo_a, then wo_b (+ TP's
  // all-reduce, which ends the op).
  void attn_out_project(const DevLayer& L, const float* u, int n, float* out) {
    const int H = heads(), G = c_.o_groups / tp_;  // TP: this rank's heads in its whole groups
    const int64_t D = c_.head_dim, ro = c_.o_lora_rank, gin = H * D / G;
    float* z = scratch(6, static_cast<size_t>(n) * G * ro);
    // Grouped wo_a: CPU applies no activation quantization here (plain dot), then BF16 rounding in official mode.
    // Official numerics: u is BF16 throughout (the attention rounds its output, the inverse RoPE its rotated dims), so
    // the prefill GEMM takes it as one BF16 term instead of three (measured: session 15, docs/BENCHMARKS.md).
    cuda::LinearArgs g;
    g.x = u, g.ldx = H * D, g.n = n, g.y = z, g.ldy = G * ro, g.group_rows = ro, g.group_x_off = gin;
    g.round_bf16 = official_;
    g.x_bf16_exact = official_;
    {
      OpScope sub(this, "attn_out/wo_a", true);
      cuda::linear(L.wo_a, g, s_);
    }
    if (tp_ > 1) no_collective_pending();
    // TP: wo_b is row-parallel. Each rank's partial sum stays fp32; the BF16 rounding TP1 applies to the whole sum
    // runs after the all-reduce (finish_collective), so TP changes nothing but the fp32 summation order.
    {
      OpScope sub(this, "attn_out/wo_b", true);
      lin(L.wo_b, z, n, out, tp_ == 1);
    }
    all_reduce(out, static_cast<size_t>(n) * c_.hidden);  // the collective ends the op
    if (tp_ > 1 && official_) pending_ = Pending{Pending::Round, out, nullptr, n};
  }

  void moe(int layer, const float* x, const int32_t* ids, int n, float* out) override { moe_run(layer, x, ids, n, out, nullptr); }

  // Decode and batched decode on one GPU: the experts' rows go to the post, which sums them (cuda::MoeSlots) instead of
  // a moe_reduce launch writing y for it to read (same function, same bits; DSV4_HC_MOE_SUM=0: the two ops).
  void moe_post_pre(int layer, const float* x, const int32_t* ids, int n, float* y, float* post, float* comb, float* X,
                    int next_layer, HcSite site, float* x_next) override {
    // ... and a deferred comb (one token) gets its Sinkhorn from the router's extra block, beside the routing, so the
    // post reads it final: in the post's prologue it could not overlap the expert launches, which fill every SM.
    const bool comb_by_router = tp_ == 1 && defer_sinkhorn(n) && cuda::router_sinkhorn_enabled();
    const cuda::HcCombIn from_pre = post_comb_in(comb, n);
    const cuda::HcCombIn ci = comb_by_router ? cuda::HcCombIn{} : from_pre;
    cuda::HcPreArgs probe;
    probe.n = n, probe.d = c_.hidden, probe.hc = c_.hc_mult;
    const bool sum = tp_ == 1 && cuda::hc_post_pre_sums_slots(probe, ci);
    cuda::MoeSlots slots;
    moe_run(layer, x, ids, n, y, sum ? &slots : nullptr, comb_by_router ? comb : nullptr);
    OpScope prof(this, "hc_post_pre");
    cuda::hc_post_pre(y, post, comb, X, hc_pre_args(next_layer, site, X, n, x_next, post, comb), s_, ci, slots);
  }

  // moe(); slots (one GPU): the expert rows the reduction would sum are returned there instead, out left unwritten.
  // comb (one token): the deferred comb logits the router's extra block turns into the final comb (RouterArgs::comb).
  void moe_run(int layer, const float* x, const int32_t* ids, int n, float* out, cuda::MoeSlots* slots,
               float* comb = nullptr) {
    OpScope prof(this, "moe");
    if (tp_ > 1) no_collective_pending();  // host-only check, before any work (and before the shared-expert fork)
    const DevLayer& L = lay(layer);
    const int E = c_.n_routed_experts, k = c_.n_experts_per_tok;
    const int64_t d = c_.hidden, I = c_.moe_inter / tp_;  // TP: every expert split along its intermediate dim
    if (!L.hash && !L.gate_bias) fail("layer ", layer, ": score routing without gate bias");
    // One QA8 of x serves the routed experts and the shared expert.
    const float* xq8 = nullptr;
    std::function<const float*()> qa8_x = [&]() {
      if (!xq8) {
        float* q = scratch(16, static_cast<size_t>(n) * d);
        cuda::qa8_rows(x, n, d, q, s_);
        xq8 = q;
      }
      return xq8;
    };
    // TP: the k expert outputs and the shared expert's sit in one buffer [n, k + 1, d] so that one all-reduce sums
    // all their partials before the per-expert BF16 rounding TP1 applies (finish_collective).
    float* ybuf = scratch(19, static_cast<size_t>(n) * (k + 1) * d);
    // Decode: the shared expert (3 dependent kernels) runs on a second stream beside the router and the routed
    // experts — in a captured step, a parallel branch of the graph — so its launch/ramp latencies overlap theirs.
    // It reads only x (quantized inside its GEMVs at n == 1) and writes its own buffers; joined before the reduction.
    // DSV4_MOE_FORK=0: one stream (A/B).
    // Decode with the routed experts in the ring kernels: the shared expert rides in the same two launches as slot k
    // (expert_ring_kernel, has_sh) instead of its own three kernels. Decided here, on the arguments the routed
    // launches will get (the same checks they make).
    const bool lowp_e = L.efmt != WeightFormat::F32 && L.efmt != WeightFormat::BF16 && L.efmt != WeightFormat::F16;
    float* act = scratch(17, static_cast<size_t>(n) * (k + 1) * I);
    bool fuse = false;
    if (n == 1 && L.has_shared && L.sw13.w && moe_fuse_shared_enabled()) {
      cuda::ExpertArgs t;
      t.table = L.table, t.fmt = L.efmt, t.d = d, t.I = I, t.sb1 = L.esb1, t.sb2 = L.esb2, t.n = 1, t.k = k;
      t.x = x, t.act = act, t.act_q = act, t.shared13 = &L.sw13, t.shared2 = &L.sw2;
      fuse = cuda::expert_ring_shared_ok(t) && (!(official_ && lowp_e) || (cuda::expert_gate_up_stages_x(t) && cuda::expert_down_stages_x(t)));
    }
    // Batched decode (n >= 2): the routed experts on the MMA walk (expert_rows_*, decided here: it quantizes x itself,
    // so the shared expert's branch is the only user of qa8_x() and may run beside the routed launches too).
    bool rows = false;
    if (n >= 2 && n < cuda::kGemmMinTokens && tp_ == 1 && official_ && lowp_e) {
      cuda::ExpertArgs t;
      t.table = L.table, t.fmt = L.efmt, t.d = d, t.I = I, t.sb1 = L.esb1, t.sb2 = L.esb2, t.tiles = L.tiles;
      t.x = x, t.n = n, t.k = k, t.official = true, t.act = act;
      rows = cuda::expert_rows_ok(t);
    }
    const bool fork = !fuse && L.has_shared && (n == 1 || rows) && L.sw13.w && moe_fork_enabled();
    float* ys = nullptr;
    if (fork) {
      DSV4_CU(cudaEventRecord(fork_ev_, s_));
      DSV4_CU(cudaStreamWaitEvent(side_, fork_ev_, 0));
      struct SideStream {  // the shared expert's kernels go to the side stream; swapped back however this scope ends
        cudaStream_t& a;
        cudaStream_t& b;
        SideStream(cudaStream_t& x, cudaStream_t& y) : a(x), b(y) { std::swap(a, b); }
        ~SideStream() { std::swap(a, b); }
      } on_side(s_, side_);
      ys = shared_expert(L, x, n, ybuf, qa8_x);
      DSV4_CU(cudaEventRecord(join_ev_, s_));
    } else if (L.has_shared && !fuse) {
      OpScope sub(this, "moe/shared", true);
      ys = shared_expert(L, x, n, ybuf, qa8_x);
    } else if (fuse) {
      ys = ybuf + static_cast<size_t>(k) * d;  // written by the fused down launch (slot k)
    }
    std::optional<OpScope> part;
    part.emplace(this, "moe/route", true);
    float* logits = scratch(7, static_cast<size_t>(n) * E);
    int32_t* sel = iscratch(0, static_cast<size_t>(n) * k);
    float* wts = scratch(15, static_cast<size_t>(n) * k);
    cuda::RouterArgs r;
    r.logits = logits, r.n = n, r.E = E, r.k = k;
    r.func = c_.scoring_func == ScoringFunc::SqrtSoftplus ? 0 : (c_.scoring_func == ScoringFunc::Sigmoid ? 1 : 2);
    r.bias = L.hash ? nullptr : L.gate_bias, r.tid2eid = L.hash ? L.tid2eid : nullptr, r.ids = ids;
    r.norm_topk = c_.norm_topk_prob, r.scaling = static_cast<float>(c_.routed_scaling_factor);
    r.sel = sel, r.wts = wts;
    if (comb) r.comb = deferred_comb(comb);
    // Decode with the fused shared expert: the gate/up launch right after the router stages x (written before the gate
    // GEMV) and walks the shared expert before its wait, and the router lets it launch at the router's start
    // (ExpertArgs::x_early, RouterArgs::trigger_early: only when gate/up reads x itself, as decided below).
    const bool x_early = fuse && n == 1 && official_ && lowp_e && cuda::expert_x_early_enabled();
    r.trigger_early = x_early;
    plain(L.gate, x, n, logits);
    cuda::router(r, s_);
    const bool lowp = lowp_e;
    cuda::ExpertArgs a;
    a.table = L.table, a.fmt = L.efmt, a.d = d, a.I = I, a.sb1 = L.esb1, a.sb2 = L.esb2, a.tiles = L.tiles;
    a.x = x, a.n = n, a.k = k, a.sel = sel, a.wts = wts, a.limit = static_cast<float>(c_.swiglu_limit);
    a.official = official_;
    a.act = act;
    if (fuse) a.shared13 = &L.sw13, a.shared2 = &L.sw2;
    if (n >= cuda::kMoeGroupedMinTokens && cuda::prefill_gemm_enabled()) {  // prefill: group the slots by expert so each expert is read once
      int32_t* offsets = iscratch(1, static_cast<size_t>(E) + 1);
      int32_t* perm = iscratch(2, static_cast<size_t>(n) * k);
      cuda::moe_group(sel, n * k, E, offsets, perm, s_);
      a.perm = perm, a.offsets = offsets, a.E = E;
      a.x_bf16_exact = official_ && lowp;  // x and act_q are QA8 values
      if (a.x_bf16_exact && L.efmt == WeightFormat::MXFP4 && cuda::moe_tc2_enabled()) {  // the prefill kernels' rows
        a.xg_bytes = cuda::moe_prefill_scratch_bytes(n, k, d, I, E);
        a.xg = reinterpret_cast<uint16_t*>(scratch(31, (a.xg_bytes + 3) / 4));
      }
    }
    // Official FP8/FP4 experts read QA8(x) and QA8(act): the single-slot kernels quantize while staging, other
    // paths get them from QA8 kernels.
    part.reset();
    part.emplace(this, "moe/gate_up", true);
    // Batched decode: the routed experts of several tokens per launch on the single-token MMA walk (expert_rows_*),
    // which quantizes x and act while staging.
    if (rows && !cuda::expert_rows_ok(a)) fail("moe: the batched expert launch was planned but does not take the arguments");
    if (rows) {
      a.qa8_x = true;
      cuda::expert_rows_gate_up(a, s_);
    } else {
      if (official_ && lowp) {
        a.qa8_x = cuda::expert_gate_up_stages_x(a);
        if (!a.qa8_x) a.x = qa8_x();
      }
      // x_early needs x as the caller's buffer (not a QA8 kernel's output, launched right before) -- and the router's
      // early trigger needs this launch to read nothing else early: both hold where the kernel stages x itself.
      if (x_early && !a.qa8_x) fail("moe: the router triggered early for a gate/up launch that does not stage x");
      a.x_early = x_early;
      cuda::expert_gate_up(a, s_);
    }
    part.reset();
    part.emplace(this, "moe/down", true);
    a.act_q = a.act;
    a.y = ybuf;
    if (rows) {
      a.qa8_act = true;
      cuda::expert_rows_down(a, s_);
    } else {
      if (official_ && lowp) {
        a.qa8_act = cuda::expert_down_stages_x(a);
        if (!a.qa8_act) {
          const int rows_q = n * k + (fuse ? 1 : 0);  // the fused shared expert's act row too
          float* q = scratch(18, static_cast<size_t>(rows_q) * I);
          cuda::qa8_rows(a.act, rows_q, I, q, s_);
          a.act_q = q;
        }
      }
      a.official = official_ && tp_ == 1;
      cuda::expert_down(a, s_);
    }
    part.reset();
    a.official = official_;
    if (fork) DSV4_CU(cudaStreamWaitEvent(s_, join_ev_, 0));  // the shared expert's branch is done
    if (tp_ == 1 && slots) {
      *slots = cuda::MoeSlots{a.y, ys, k};
      return;
    }
    if (tp_ == 1) {
      OpScope sub(this, "moe/reduce", true);
      cuda::moe_reduce(a.y, ys, n, k, d, official_, out, s_);
      return;
    }
    if (!ys) {  // no shared expert: its slot holds zeros
      ys = ybuf + static_cast<size_t>(n) * k * d;
      cuda::fill_f32(ys, static_cast<int64_t>(n) * d, 0.0f, s_);
    }
    all_reduce(ybuf, static_cast<size_t>(n) * (k + 1) * d);  // the collective ends the op
    pending_ = Pending{Pending::MoeReduce, out, ybuf, n};
  }

  // The shared expert of moe(): ys = w2 SwiGLU(w1 x, w3 x) on the backend's current stream s_.
  float* shared_expert(const DevLayer& L, const float* x, int n, float* ybuf, const std::function<const float*()>& qa8_x) {
    const int k = c_.n_experts_per_tok;
    const int64_t d = c_.hidden;
    float* ys = nullptr;
    {
      const int64_t Is = L.sw1.out;
      auto input_for = [&](const DevLinear& W) { return official_ && W.low_precision() ? qa8_x() : x; };
      float *g, *u;
      if (n == 1 && L.sw13.w) {  // one GEMV over the stored w1|w3 pair (same format by construction)
        g = scratch(20, static_cast<size_t>(2 * Is));
        u = g + Is;
        lin(L.sw13, x, 1, g);  // lin() quantizes x inside the GEMV
      } else {
        g = scratch(20, static_cast<size_t>(n) * Is);
        u = scratch(21, static_cast<size_t>(n) * Is);
        lin_shared(L.sw1, x, input_for, n, g);
        lin_shared(L.sw3, x, input_for, n, u);
      }
      cuda::swiglu(g, u, static_cast<int64_t>(n) * Is, static_cast<float>(c_.swiglu_limit), official_, g, s_);
      ys = tp_ == 1 ? scratch(22, static_cast<size_t>(n) * d) : ybuf + static_cast<size_t>(n) * k * d;
      lin(L.sw2, g, n, ys, tp_ == 1);
    }
    return ys;
  }

  // TP, after the NCCL group of attn_out()/moe(): the work TP1 does after the sum (BF16 rounding of wo_b's output;
  // per-expert rounding and the expert reduction).
  // TP: the peer all-reduce all_reduce() deferred, once every rank has issued its op (the TP backend launches every
  // rank's before any rank's finish_collective, so a host error in that work cannot strand a launched peer kernel).
  void launch_deferred_collective() {
    if (!peer_pending_.buf) return;
    const PeerPending p = peer_pending_;
    peer_pending_ = PeerPending{};
    // The work finish_collective would launch after the sum runs inside the all-reduce kernel instead (one launch
    // fewer per collective, same bits): wo_b's BF16 rounding, and for one decode token the MoE's per-slot rounding
    // and slot sum (ybuf is then k + 1 rows of d).
    cuda::PeerEpilogue ep;
    ep.official = official_;
    if (pending_.kind == Pending::Round && pending_.out == p.buf) {
      ep.kind = cuda::PeerEpilogue::Round;
    } else if (pending_.kind == Pending::MoeReduce && pending_.y == p.buf && pending_.n == 1) {
      ep.kind = cuda::PeerEpilogue::SumRows, ep.out = pending_.out, ep.rows = c_.n_experts_per_tok + 1;
    }
    if (ep.kind != cuda::PeerEpilogue::None) pending_ = Pending{};
    cuda::peer_all_reduce(*static_cast<const cuda::PeerReduceRank*>(opts_.peer_reduce), p.buf, p.count, s_, ep);
  }
  void finish_collective() {
    launch_deferred_collective();  // no-op when the TP backend already did
    const Pending p = pending_;
    pending_ = Pending{};
    const int64_t d = c_.hidden;
    const int k = c_.n_experts_per_tok;
    switch (p.kind) {
      case Pending::None: return;
      case Pending::Round: cuda::round_bf16(p.out, p.n * d, s_); return;
      case Pending::MoeReduce:
        if (official_) cuda::round_bf16(p.y, static_cast<int64_t>(p.n) * (k + 1) * d, s_);
        cuda::moe_reduce(p.y, p.y + static_cast<size_t>(p.n) * k * d, p.n, k, d, official_, p.out, s_);
        return;
    }
  }

  void head(const float* X, int n, float* logits) override {
    OpScope prof(this, "head");
    final_head(hc_head_, norm_, X, n, logits);
  }

  // MTP input fusion, as the CPU: e = rms(embed[next], enorm) [bf16] -> e_proj; h_s = rms(X_s, hnorm) [bf16] ->
  // h_proj (all streams as rows); Y_s = h_proj(h_s) + e_proj(e) [bf16].
  void mtp_input(const int32_t* next_ids, const float* X, int n, float* Y) override {
    const DevLayer& M = mtp_layer();
    const int hc = c_.hc_mult;
    const int64_t d = c_.hidden;
    float* e = scratch(24, static_cast<size_t>(n) * d);
    cuda::embed(embed_, embed_dtype_, d, next_ids, n, 1, e, s_);
    cuda::NormRopeArgs a;
    a.x = e, a.y = e, a.rows = n, a.len = d, a.w = M.enorm, a.eps = c_.rms_eps, a.official = official_;
    cuda::norm_rope(a, s_);
    float* ep = scratch(25, static_cast<size_t>(n) * d);
    lin(M.e_proj, e, n, ep);
    float* hs = scratch(26, static_cast<size_t>(n) * hc * d);
    cuda::NormRopeArgs b = a;
    b.x = X, b.y = hs, b.rows = n * hc, b.w = M.hnorm;
    cuda::norm_rope(b, s_);
    float* hp = scratch(27, static_cast<size_t>(n) * hc * d);
    lin(M.h_proj, hs, n * hc, hp);
    cuda::add_streams(hp, ep, n, hc, d, official_, Y, s_);
  }

  void mtp_head(const float* Y, int n, float* logits) override {
    const DevLayer& M = mtp_layer();
    final_head(M.mtp_hc_head, M.mtp_norm, Y, n, logits);
  }

  // Per-op GPU milliseconds of the last decode step (profile_ops), summed by op name in first-seen order.
  std::vector<std::pair<std::string, double>> op_profile() {
    if (!last_step_) return {};
    return sum_events(last_step_->prof, last_step_->prof_n);
  }
  std::vector<std::pair<std::string, double>> eager_profile() { return sum_events(eager_prof_, eager_n_); }
  void set_eager_profiling(bool on) {
    eager_profiling_ = on;
    if (on) eager_n_ = 0;
  }
  std::vector<std::pair<std::string, double>> sum_events(const std::vector<DecodeGraph::OpEvents>& ev, size_t n) {
    std::vector<std::pair<std::string, double>> out;
    DSV4_CU(cudaStreamSynchronize(s_));
    for (size_t i = 0; i < n; ++i) {
      const auto& e = ev[i];
      float ms = 0;
      DSV4_CU(cudaEventElapsedTime(&ms, e.begin, e.end));
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == e.name; });
      if (it == out.end()) out.emplace_back(e.name, ms);
      else it->second += ms;
    }
    return out;
  }

  // Graph bookkeeping, for tests and benchmarks.
  int captures() const { return captures_; }
  int replays() const { return replays_; }

 private:
  // Layer lookups with a clear error for indices the backend did not load (e.g. the MTP block of a checkpoint without one).
  const DevLayer& lay(int layer) const {
    if (layer < 0 || static_cast<size_t>(layer) >= layers_.size())
      fail("CUDA backend: layer ", layer, " is not loaded (", layers_.size(), " layers including any MTP block)");
    return layers_[static_cast<size_t>(layer)];
  }
  const DevLayer& mtp_layer() const {
    if (layers_.size() <= static_cast<size_t>(c_.n_layers) || !layers_[static_cast<size_t>(c_.n_layers)].mtp)
      fail("this checkpoint has no MTP block");
    return layers_[static_cast<size_t>(c_.n_layers)];
  }
  // The device position in graph mode (kernels read it instead of their pos0 argument), else null.
  // A batched step's ops run row by row (RowScope): row i reads its own position, dpos_[i].
  const int64_t* dpos() const { return dyn_ ? dpos_ + row_ : nullptr; }

  // Replay of a recorded step: the host-side entry counts advance as compressor_step would advance them for the
  // main layers (the MTP block runs eagerly through forward_mtp).
  void advance_counts(CudaSequence& S, int64_t pos) {
    for (int l = 0; l < c_.n_layers; ++l) {
      const DevLayer& L = layers_[static_cast<size_t>(l)];
      DevLayerState& st = S.layers_[static_cast<size_t>(l)];
      const int64_t emitted = L.ratio > 0 ? (pos + 1) / L.ratio - pos / L.ratio : 0;
      if ((L.has_comp || L.has_idx) && std::max(st.n_comp, st.n_idx) + emitted > st.cap)
        fail("compressed cache of layer ", l, " is full (max context ", S.max_context(), ")");
      if (L.has_comp) st.n_comp += emitted;
      if (L.has_idx) st.n_idx += emitted;
    }
  }

  // hc_head collapse (sigmoid weights, no Sinkhorn), RMSNorm, LM head: the main head and the MTP head.
  void final_head(const DevHc& hh, const float* norm, const float* X, int n, float* logits) {
    float* h = scratch(8, static_cast<size_t>(n) * c_.hidden);
    cuda::HcPreArgs a;
    a.X = X, a.n = n, a.hc = c_.hc_mult, a.d = c_.hidden;
    a.fn = hh.fn, a.base = hh.base, a.scale = hh.scale, a.norm_w = norm;
    a.hc_eps = static_cast<float>(c_.hc_eps), a.rms_eps = c_.rms_eps, a.official = official_, a.x = h, a.head = true;
    a.partial = scratch(23, static_cast<size_t>(cuda::hc_pre_scratch_floats(n, a.hc, a.d)));
    cuda::hc_pre(a, s_);
    if (tp_ == 1) {
      plain(head_, h, n, logits);
      return;
    }
    no_collective_pending();
    // Vocabulary-parallel head: this rank's [n, V/tp] slice, gathered from every rank as [tp][n][V/tp] (gather_logits
    // interleaves it into [n, V] after the collective has been issued).
    const int64_t Vl = head_.out;
    float* part = scratch(28, static_cast<size_t>(n * Vl));
    plain(head_, h, n, part);
    gathered_ = scratch(29, static_cast<size_t>(n * Vl * tp_));
    gathered_n_ = n;
#if DSV4_HAVE_NCCL
    nccl(ncclAllGather(part, gathered_, static_cast<size_t>(n * Vl), ncclFloat, comm(), s_), "ncclAllGather");
#endif
  }

 public:
  // TP, after the group holding head()/mtp_head()'s all-gather: logits[n, V] from the gathered [tp][n][V/tp].
  void gather_logits(float* logits) {
    if (tp_ == 1 || !gathered_) return;
    const int64_t Vl = head_.out;
    for (int r = 0; r < tp_; ++r)
      DSV4_CU(cudaMemcpy2DAsync(logits + r * Vl, static_cast<size_t>(Vl * tp_) * 4,
                                gathered_ + static_cast<size_t>(r) * gathered_n_ * Vl, static_cast<size_t>(Vl) * 4,
                                static_cast<size_t>(Vl) * 4, static_cast<size_t>(gathered_n_), cudaMemcpyDeviceToDevice, s_));
    gathered_ = nullptr;
  }
  int device() const { return opts_.device; }

 private:
  int heads() const { return c_.n_heads / tp_; }
  // TP: an op that ends with a collective may only start once the previous one was finished (finish_collective /
  // gather_logits after its NCCL group); otherwise its post-collective work would be silently dropped.
  void no_collective_pending() const {
    if (pending_.kind != Pending::None || gathered_ || peer_pending_.buf)
      fail("CUDA backend rank ", rank_, ": a collective op started before the previous one was finished");
  }
#if DSV4_HAVE_NCCL
  ncclComm_t comm() const { return static_cast<ncclComm_t>(opts_.nccl_comm); }
  static void nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail("NCCL ", what, " failed: ", ncclGetErrorString(r));
  }
#endif
  // TP: sum of every rank's partial result, in place. Issued inside the TP backend's NCCL group, so it must be the
  // last thing an op enqueues (work after it would run before the deferred collective).
  void all_reduce(float* buf, size_t count) {
    if (tp_ == 1) return;
    if (opts_.peer_reduce) {  // decode-sized: one peer-to-peer kernel (the choice depends on count only: same on every rank)
      const auto& p = *static_cast<const cuda::PeerReduceRank*>(opts_.peer_reduce);
      if (count <= p.cap && count % 4 == 0) {
        // Deferred to finish_collective, which the TP backend calls once every rank has issued its op: launched now,
        // this rank's kernel would already wait for peers whose op may still throw on the host, and a peer that
        // never comes leaves it spinning into its 20 s trap (a sticky error on this GPU). NCCL defers the same way
        // (the group).
        peer_pending_ = PeerPending{buf, count};
        return;
      }
    }
#if DSV4_HAVE_NCCL
    nccl(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm(), s_), "ncclAllReduce");
#else
    (void)buf, (void)count;
    fail("this build has no NCCL: tensor parallelism is unavailable");
#endif
  }
  DevLayerState& seq(SequenceState& sst, int layer) const {
    auto& v = static_cast<CudaSequence&>(sst).layers_;
    if (layer < 0 || static_cast<size_t>(layer) >= v.size()) fail("CUDA backend: sequence state has no layer ", layer);
    return v[static_cast<size_t>(layer)];
  }

  DevHc hc(const HcWeights& h) { return DevHc{heap_.upload_f32(h.fn), heap_.upload_f32(h.base), heap_.upload_f32(h.scale)}; }

  DevComp comp(const CompressorWeights& c) {
    DevComp d;
    d.ratio = c.ratio, d.width = c.width, d.overlap = c.overlap;
    heap_.linear_pair(c.wkv, c.wgate, d.wkv, d.wgate, d.wkv_wgate);
    d.ape = heap_.upload_f32(c.ape), d.norm = heap_.upload_f32(c.norm);
    return d;
  }

  DevLayer load_layer(const LayerWeights& lw) {
    DevLayer L;
    L.kind = lw.kind;
    L.ratio = c_.ratio(lw.index);
    L.hash = lw.hash;
    std::vector<float> inv = rope_inv_freq(c_, rope_profile_for(c_, lw.index));
    L.inv_freq = heap_.upload(inv.data(), inv.size());
    L.hc_attn = hc(lw.hc_attn);
    L.hc_ffn = hc(lw.hc_ffn);
    L.attn_norm = heap_.upload_f32(lw.attn_norm);
    L.ffn_norm = heap_.upload_f32(lw.ffn_norm);
    L.sink = heap_.upload_f32(lw.attn_sink);
    L.q_norm = heap_.upload_f32(lw.q_norm);
    L.kv_norm = heap_.upload_f32(lw.kv_norm);
    heap_.linear_pair(lw.wq_a, lw.wkv, L.wq_a, L.wkv, L.wq_a_wkv);
    // CSA unless DSV4_WQB_STACK=0 (read at load): wq_b and the indexer's wq_b read the same qr; stored back to back
    // (views into the pair, no extra memory).
    if (lw.indexer && cuda::wqb_stack_enabled()) heap_.linear_pair(lw.wq_b, lw.indexer->wq_b, L.wq_b, L.idx_wq_b, L.wq_b_idx);
    else L.wq_b = heap_.linear(lw.wq_b);
    L.wo_a = heap_.linear(lw.wo_a);
    L.wo_b = heap_.linear(lw.wo_b);
    if (lw.compressor) {
      L.has_comp = true;
      L.comp = comp(*lw.compressor);
    }
    if (lw.indexer) {
      L.has_idx = true;
      L.icomp = comp(lw.indexer->comp);
      if (!L.idx_wq_b.w) L.idx_wq_b = heap_.linear(lw.indexer->wq_b);
      L.idx_wproj = heap_.linear(lw.indexer->weights_proj);
    }
    L.gate = heap_.linear(lw.gate);
    if (lw.gate_bias) L.gate_bias = heap_.upload_f32(lw.gate_bias);
    if (lw.tid2eid) {
      const std::vector<int32_t> ids = read_tid2eid(*lw.tid2eid, c_.n_routed_experts);
      L.tid2eid = heap_.upload(ids.data(), ids.size());
    }
    if (lw.hash && !L.tid2eid) fail("layer ", lw.index, " is hash-routed but has no tid2eid");
    std::vector<cuda::DevExpert> table;
    for (size_t e = 0; e < lw.experts.size(); ++e) {
      const ExpertWeights& ew = lw.experts[e];
      DevLinear w1 = heap_.linear(ew.w1), w2 = heap_.linear(ew.w2), w3 = heap_.linear(ew.w3);
      if (e == 0) {
        L.efmt = w1.fmt, L.esb1 = w1.sb_cols, L.esb2 = w2.sb_cols;
        if (w1.out != c_.moe_inter / tp_ || w1.in != c_.hidden || w2.out != c_.hidden || w2.in != c_.moe_inter / tp_)
          fail("layer ", lw.index, ": routed expert shapes do not match moe_intermediate_size/hidden");
      }
      if (w1.fmt != L.efmt || w2.fmt != L.efmt || w3.fmt != L.efmt || w1.sb_cols != L.esb1 || w3.sb_cols != L.esb1 ||
          w2.sb_cols != L.esb2)
        fail("layer ", lw.index, ": routed experts mix storage formats (expert ", e, " is ", weight_format_name(w1.fmt),
             "); the CUDA expert kernel needs one format per layer");
      table.push_back(cuda::make_dev_expert(w1, w3, w2));
    }
    if (static_cast<int>(table.size()) != c_.n_routed_experts)
      fail("layer ", lw.index, ": ", table.size(), " routed experts loaded, config says ", c_.n_routed_experts);
    if (expert_tiles_requested() && L.efmt == WeightFormat::MXFP4 && cuda::tiles_shape_ok(c_.hidden, c_.moe_inter / tp_)) {
      // Measurement mode: tile-major copies beside the row-major weights for the decode MMA walk (expert_tiles.h).
      const int64_t d = c_.hidden, I = c_.moe_inter / tp_;
      for (cuda::DevExpert& e : table) {
        void* t13 = heap_.alloc(static_cast<size_t>(cuda::tile_bytes(true, d, I)));
        void* t2 = heap_.alloc(static_cast<size_t>(cuda::tile_bytes(false, d, I)));
        cuda::build_expert_tiles(e, L.efmt, d, I, L.esb1, L.esb2, t13, t2, nullptr);
        e.t13 = t13, e.t2 = t2;
      }
      DSV4_CU(cudaDeviceSynchronize());
      L.tiles = true;
    }
    L.table = heap_.upload(table.data(), table.size());
    if (lw.shared) {
      L.has_shared = true;
      heap_.linear_pair(lw.shared->w1, lw.shared->w3, L.sw1, L.sw3, L.sw13);
      L.sw2 = heap_.linear(lw.shared->w2);
    }
    if (lw.e_proj.weight) {
      L.mtp = true;
      L.e_proj = heap_.linear(lw.e_proj);
      L.h_proj = heap_.linear(lw.h_proj);
      L.enorm = heap_.upload_f32(lw.enorm);
      L.hnorm = heap_.upload_f32(lw.hnorm);
      L.mtp_norm = heap_.upload_f32(lw.mtp_norm);
      L.mtp_hc_head = hc(lw.mtp_hc_head);
    }
    return L;
  }

  // y = x . W^T as the CPU's linear(): QA8 activations for FP8/FP4 weights and BF16 outputs in official numerics.
  void lin(const DevLinear& W, const float* x, int n, float* y, bool round = true) {
    const float* xin = x;
    if (official_ && W.low_precision()) {
      cuda::LinearArgs f;  // a single-token GEMV quantizes x while staging it: no QA8 kernel
      f.x = x, f.ldx = W.in, f.n = n, f.y = y, f.ldy = W.out, f.round_bf16 = round, f.qa8_x = true;
      // A single-token GEMV, or (DSV4_GEMM_QA8=1) the prefill GEMM, quantizes x while staging / splitting it.
      if (cuda::gemv_stages_x(W, f) || cuda::prefill_gemm_runs(W, f, s_)) {
        cuda::linear(W, f, s_);
        return;
      }
      float* q = scratch(lin_qa8_slot_, static_cast<size_t>(n) * W.in);
      cuda::qa8_rows(x, n, W.in, q, s_);
      xin = q;
    }
    cuda::LinearArgs a;
    a.x = xin, a.ldx = W.in, a.n = n, a.y = y, a.ldy = W.out, a.round_bf16 = official_ && round;
    a.x_bf16_exact = official_ && W.low_precision();
    cuda::linear(W, a, s_);
  }
  // A linear whose input's QA8 other linears share (input_for(W): QA8(x) where W needs it, computed once): a batched-
  // decode-sized one whose kernel quantizes x while staging it (the multi-token tensor-core GEMV) reads x itself,
  // everything else the shared QA8 input. The same values either way.
  template <typename InputFor>
  void lin_shared(const DevLinear& W, const float* x, InputFor&& input_for, int n, float* y) {
    if (official_ && W.low_precision() && n > 1 && n < cuda::kGemmMinTokens) {
      cuda::LinearArgs f;
      f.x = x, f.ldx = W.in, f.n = n, f.y = y, f.ldy = W.out, f.round_bf16 = true, f.qa8_x = true;
      if (cuda::gemv_stages_x(W, f)) {
        lin(W, x, n, y);
        return;
      }
    }
    lin_pre(W, input_for(W), n, y);
  }
  // lin() for an input that is already QA8-quantized where W needs it (shared by several linears of one input).
  void lin_pre(const DevLinear& W, const float* xin, int n, float* y, bool round = true) {
    cuda::LinearArgs a;
    a.x = xin, a.ldx = W.in, a.n = n, a.y = y, a.ldy = W.out, a.round_bf16 = official_ && round;
    a.x_bf16_exact = official_ && W.low_precision();  // the caller passes input_for(W): QA8 exactly when this holds
    cuda::linear(W, a, s_);
  }
  // y = x . W^T in fp32 without any quantization simulation (the CPU's plain matmul_nt sites); round: y BF16-rounded
  // by the GEMV's epilogue (the same bf16r as a round_bf16 pass after it, one launch fewer).
  void plain(const DevLinear& W, const float* x, int n, float* y, bool round = false, bool beside = false) {
    cuda::LinearArgs a;
    a.x = x, a.ldx = W.in, a.n = n, a.y = y, a.ldy = W.out, a.round_bf16 = round, a.beside = beside;
    cuda::linear(W, a, s_);
  }

  // Scratch buffers keyed by slot: grow (cudaFree + cudaMalloc) to the largest size seen, then reused.
  float* scratch(int slot, size_t n) { return static_cast<float*>(grow(scratch_, slot, n * 4)); }
  int32_t* iscratch(int slot, size_t n) { return static_cast<int32_t*>(grow(iscratch_, slot, n * 4)); }
  void* grow(std::vector<std::pair<void*, size_t>>& v, int slot, size_t bytes) {
    if (v.size() <= static_cast<size_t>(slot)) v.resize(static_cast<size_t>(slot) + 1, {nullptr, 0});
    auto& b = v[static_cast<size_t>(slot)];
    if (b.second < bytes) {
      // A recording points into the scratch buffers: growing one during a capture would leave the graph with a
      // freed address. The warm-up step sizes everything first, so this is a bug, not a user error.
      if (capturing_) fail("CUDA backend: scratch slot ", slot, " grew during decode-graph capture");
      ++scratch_gen_;  // recordings made before this point are stale
      if (b.first) {
        DSV4_CU(cudaDeviceSynchronize());  // its last user may be any of the backend's streams (side streams)
        DSV4_CU(cudaFree(b.first));
      }
      b.first = nullptr;
      b.second = 0;  // an out-of-memory throw below must not leave a size without a buffer
      DSV4_CU(cudaMalloc(&b.first, std::max<size_t>(bytes, 16)));
      b.second = bytes;
    }
    return b.first;
  }

  // Events around one op of a decode step when profiling (no-op otherwise).
  struct OpScope {
    CudaBackend* b;
    size_t i = SIZE_MAX;
    bool eager = false;
    // sub: a part of an op ("moe/down"), timed in eager (prefill) profiling only; its time is inside its op's too.
    OpScope(CudaBackend* be, const char* name, bool sub = false) : b(be) {
      if (sub && (b->step_ || !b->eager_profiling_)) return;
      if (!b->step_ && b->eager_profiling_) {  // an eager op (prefill chunk): events on the stream, read later
        if (b->eager_n_ == b->eager_prof_.size()) {
          DecodeGraph::OpEvents e{name, nullptr, nullptr};
          DSV4_CU(cudaEventCreate(&e.begin));
          DSV4_CU(cudaEventCreate(&e.end));
          b->eager_prof_.push_back(e);
        }
        i = b->eager_n_++;
        eager = true;
        b->eager_prof_[i].name = name;
        DSV4_CU(cudaEventRecord(b->eager_prof_[i].begin, b->s_));
        return;
      }
      if (!b->profiling_ || !b->step_) return;
      DecodeGraph& g = *b->step_;
      if (g.prof_n == g.prof.size()) {
        DecodeGraph::OpEvents e{name, nullptr, nullptr};
        DSV4_CU(cudaEventCreate(&e.begin));
        DSV4_CU(cudaEventCreate(&e.end));
        g.prof.push_back(e);
      }
      i = g.prof_n++;
      g.prof[i].name = name;
      b->record(g.prof[i].begin);
    }
    ~OpScope() {  // no throwing from a destructor: a failed record only loses this op's timing
      if (eager) {
        (void)cudaEventRecord(b->eager_prof_[i].end, b->s_);
        return;
      }
      if (i == SIZE_MAX || !b->step_) return;
      const cudaEvent_t e = b->step_->prof[i].end;
      (void)(b->capturing_ ? cudaEventRecordWithFlags(e, b->s_, cudaEventRecordExternal) : cudaEventRecord(e, b->s_));
    }
  };
  void record(cudaEvent_t e) {
    DSV4_CU(capturing_ ? cudaEventRecordWithFlags(e, s_, cudaEventRecordExternal) : cudaEventRecord(e, s_));
  }

  CudaOptions opts_;
  DecodeGraph* last_step_ = nullptr;  // the step op_profile reads
  bool profiling_ = false;            // starts as opts_.profile_ops; set_profiling toggles it (new recordings only)
  bool eager_profiling_ = false;      // set_eager_profiling: events around every op issued outside a decode recording
  std::vector<DecodeGraph::OpEvents> eager_prof_;
  size_t eager_n_ = 0;
 public:
  void set_profiling(bool on) { profiling_ = on; }
 private:
  int tp_ = 1, rank_ = 0;
  uint64_t weight_bytes_ = 0;
  cudaStream_t side_ = nullptr;  // moe(): the shared expert's branch (decode)
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  // attn_qkv() -> attend(): the compressor / indexer branches (decode): kSideIdx the indexer's compressor, then its
  // scores and top-k; kSideIdxQ the indexer's queries (joined into kSideIdx before the scores); kSideComp the main
  // compressor.
  static constexpr int kSideIdx = 0, kSideIdxQ = 1, kSideComp = 2;
  cudaStream_t attn_side_[3] = {};
  cudaEvent_t attn_fork_ev_ = nullptr, attn_join_ev_[3] = {}, idx_q_ev_ = nullptr, idx_done_ev_ = nullptr;
  cudaEvent_t wqb_ev_ = nullptr;  // after attn_qkv's stacked wq_b GEMV (cuda::wqb_stack_enabled): the indexer queries wait on it
  float* stacked_qi_ = nullptr;   // the indexer's queries in that GEMV's output, for indexer_topk of stacked_layer_
  int stacked_layer_ = -1;
  bool in_row_loop_ = false;      // attn_qkv_row_loop is running
  bool attn_side_open_ = false;
  const float *qkv_q_ = nullptr, *qkv_kv_ = nullptr;  // the last single-token attn_qkv's outputs (see attend())
  // The fork point's generation (one per attn_qkv that forks) and the one branch i last waited on (-1: it has not
  // joined since the last join, so attend() need not wait for it).
  int64_t attn_fork_gen_ = 0, attn_wait_gen_[3] = {-1, -1, -1};
  bool idx_scores_pending_ = false;  // an indexer_topk of this fork window recorded idx_done_ev_ (batched decode)
  // Deferred combs (one token): the comb an attention pre left logits in (until the next attn_qkv), and the comb a
  // launch since then finished (norm_sinkhorn), which the next post then reads as final.
  float* attn_comb_logits_ = nullptr;
  const float* comb_final_ = nullptr;
  int lin_qa8_slot_ = 12;  // lin()'s QA8 scratch; one slot per side stream (they may run at once)
  // An op's kernels on side stream `which` (-1: s_ itself): s_ swapped with it and lin()'s QA8 slot moved for the
  // scope, restored however it ends. Scopes nest (restored in reverse order).
  struct SideScope {
    CudaBackend* b;
    int which;
    int slot;
    SideScope(CudaBackend* be, int w) : b(be), which(w), slot(be->lin_qa8_slot_) {
      if (which < 0) return;
      if (b->attn_wait_gen_[which] != b->attn_fork_gen_) {  // lazy fork: this branch's first op since the fork point
        DSV4_CU(cudaStreamWaitEvent(b->attn_side_[which], b->attn_fork_ev_, 0));  // (attn_side_[which]: the branch)
        b->attn_wait_gen_[which] = b->attn_fork_gen_;
      }
      std::swap(b->s_, b->attn_side_[which]), b->lin_qa8_slot_ = 40 + which;
    }
    ~SideScope() {
      if (which >= 0) std::swap(b->s_, b->attn_side_[which]), b->lin_qa8_slot_ = slot;
    }
  };
  // Side branch i joined into the main stream now; a branch that never joined the fork (lazy) has nothing to wait
  // for. Called early (indexer_topk), attend's join then skips it, and a later op on it forks it again (SideScope).
  // nothrow: the failed-capture path (errors ignored: the capture is discarded anyway).
  void join_branch(int i, bool nothrow = false) {
    if (attn_wait_gen_[i] < 0) return;
    attn_wait_gen_[i] = -1;
    cudaError_t e = cudaEventRecord(attn_join_ev_[i], attn_side_[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s_, attn_join_ev_[i], 0);
    if (!nothrow) DSV4_CU(e);
  }
  void join_attn_side(bool nothrow = false) {
    if (!attn_side_open_) return;
    attn_side_open_ = false;
    idx_scores_pending_ = false;
    for (int i = 0; i < 3; ++i) join_branch(i, nothrow);
  }

  // DSV4_EXPERT_TILES=1 (measurement mode): MXFP4 routed experts also get tile-major copies, which the decode MMA
  // walk then reads (expert_tiles.h); their memory doubles.
  static bool expert_tiles_requested() {
    static const bool on = [] {
      const char* e = std::getenv("DSV4_EXPERT_TILES");
      return e && std::string(e) == "1";
    }();
    return on;
  }
  static bool moe_fuse_shared_enabled() {  // DSV4_MOE_FUSE_SHARED=0: the shared expert's own kernels (A/B)
    static const bool on = [] {
      const char* e = std::getenv("DSV4_MOE_FUSE_SHARED");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  // The window rows this attention sub-layer's single-token attends stored into their rings along with the merge
  // (window_store skips them; a batch's attend_rows stores one per sequence before window_store_rows runs). Cleared
  // by attn_qkv, the sub-layer's first op, so no row of an earlier layer or step can match.
  struct StoredRow {
    const float* ring = nullptr;
    const float* kv = nullptr;
    int64_t pos0 = -1;
    bool operator==(const StoredRow& o) const { return ring == o.ring && kv == o.kv && pos0 == o.pos0; }
  };
  std::vector<StoredRow> stored_rows_;
  // The attention outputs this sub-layer's single-token attends left de-roped (attn_out skips their norm_rope);
  // cleared with stored_rows_.
  struct Deroped {
    int layer = -1;
    const float* o = nullptr;
    int64_t pos0 = -1;
    bool operator==(const Deroped& d) const { return layer == d.layer && o == d.o && pos0 == d.pos0; }
  };
  std::vector<Deroped> deroped_;
  static bool moe_fork_enabled() {
    static const bool on = [] {
      const char* e = std::getenv("DSV4_MOE_FORK");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  float* gathered_ = nullptr;  // TP head: the all-gathered logits slices awaiting gather_logits
  struct PeerPending {          // TP: the peer all-reduce all_reduce() deferred to finish_collective
    float* buf = nullptr;
    size_t count = 0;
  } peer_pending_;
  struct Pending {              // TP: what finish_collective still has to do after the group's all-reduce
    enum Kind { None, Round, MoeReduce } kind = None;
    float* out = nullptr;
    float* y = nullptr;
    int n = 0;
  };
  Pending pending_;
  int gathered_n_ = 0;
  ModelConfig c_;
  bool official_ = false;
  cudaStream_t s_ = nullptr;
  // The position of the step being run in graph mode (device scalar; a batched step: one per row).
  static constexpr int kMaxGraphRows = 64;
  int64_t* dpos_ = nullptr;
  bool dyn_ = false;              // ops in graph mode: kernels read dpos_, scratch sized for the max context
  bool batch_step_ = false;       // the graph-mode step is a batched one (begin_decode_batch)
  bool pair_step_ = false;        // the batched step's rows are one sequence's consecutive positions (a verify pair)
  int row_ = 0;                   // the row a batched step's per-row op is working on (RowScope)
  std::vector<std::unique_ptr<DecodeGraph>> batch_graphs_;  // recordings of batched steps, the most recent few
  uint64_t batch_clock_ = 0;
  bool capturing_ = false;
  DecodeGraph* step_ = nullptr;   // the recording the current begin/end_decode_step pair works on
  uint64_t scratch_gen_ = 0;
  int captures_ = 0, replays_ = 0;
  DevHeap heap_;
  int* err_ = nullptr;
  // Page-locked host staging (upload_i32 / download / synchronize); grown to the largest transfer, kept.
  struct PinnedBuf {
    void* p = nullptr;
    size_t bytes = 0;
    void* get(size_t n) {
      if (n > bytes) {
        if (p) DSV4_CU(cudaFreeHost(p));
        p = nullptr, bytes = 0;
        DSV4_CU(cudaMallocHost(&p, n));
        bytes = n;
      }
      return p;
    }
    ~PinnedBuf() {
      if (p) cudaFreeHost(p);
    }
  };
  PinnedBuf up_, down_, err_host_;
  cudaEvent_t up_ev_ = nullptr;  // after the last upload_i32's copy out of up_
  bool up_pending_ = false;
  const void* embed_ = nullptr;
  int embed_dtype_ = 1;
  DevLinear head_;
  float* norm_ = nullptr;
  DevHc hc_head_;
  std::vector<DevLayer> layers_;
  int* idx_counters_ = nullptr;  // 3 per layer: cuda::IndexerTopkArgs::counters
  std::vector<std::pair<void*, size_t>> scratch_, iscratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& opts) { return std::make_unique<CudaBackend>(opts); }

namespace cuda_detail {
std::vector<std::pair<std::string, double>> op_profile(Backend& b) { return dynamic_cast<CudaBackend&>(b).op_profile(); }
void set_profiling(Backend& b, bool on) { dynamic_cast<CudaBackend&>(b).set_profiling(on); }
void set_eager_profiling(Backend& b, bool on) { dynamic_cast<CudaBackend&>(b).set_eager_profiling(on); }
std::vector<std::pair<std::string, double>> eager_profile(Backend& b) { return dynamic_cast<CudaBackend&>(b).eager_profile(); }
void gather_logits(Backend& rank, float* logits) { dynamic_cast<CudaBackend&>(rank).gather_logits(logits); }
void finish_collective(Backend& rank) { dynamic_cast<CudaBackend&>(rank).finish_collective(); }
void launch_deferred_collective(Backend& rank) { dynamic_cast<CudaBackend&>(rank).launch_deferred_collective(); }
uint64_t weight_bytes(const Backend& rank) { return dynamic_cast<const CudaBackend&>(rank).weight_bytes(); }
}  // namespace cuda_detail

CudaGraphStats cuda_graph_stats(const Backend& b) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  if (!c) fail("cuda_graph_stats: the ", b.name(), " backend is not the CUDA backend");
  return CudaGraphStats{c->captures(), c->replays()};
}

}  // namespace dsv4
