// Tensor parallelism over NCCL (issue 8): one process drives N GPUs of one host. Each rank is an ordinary CUDA backend
// loaded with its weight shards (model/shard_weights.h) that all-reduces after wo_b and the experts and all-gathers the
// vocabulary-split logits. This wrapper presents the N ranks as one Backend: every activation buffer exists on every
// GPU at the same offset of its allocation, so the model's pointers (rank 0's) translate to each rank's; every op is
// issued to every rank from the calling thread. CUDA launches are asynchronous, so the GPUs run concurrently; the
// collectives of all ranks are issued inside one NCCL group (required when one thread drives several GPUs), which is
// why a rank's op ends with its collective. Decode steps are CUDA graphs per rank, captured side by side, collectives
// included.
//
// Why one thread rather than one per GPU: a replayed decode step is one graph launch per GPU, so host issue cost is
// negligible where latency matters; eager prefill ops are long enough to hide it. Multi-process/multi-host is the same
// code with the NCCL unique id exchanged out of band (docs/MULTI_GPU.md).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#if DSV4_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/peer_allreduce.h"
#include "core/error.h"
#include "model/shard_weights.h"
#include "model/sharding.h"

namespace dsv4 {

#if DSV4_HAVE_NCCL
bool tp_available() { return true; }

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL ", what, " failed: ", ncclGetErrorString(r));
}

// Opens an NCCL group for the duration of a scope (the collectives of all ranks are issued together at its end).
struct NcclGroup {
  NcclGroup() { nccl_check(ncclGroupStart(), "ncclGroupStart"); }
  ~NcclGroup() noexcept(false) {
    const ncclResult_t r = ncclGroupEnd();
    if (std::uncaught_exceptions() == 0) nccl_check(r, "ncclGroupEnd");  // else an op already failed: keep its error
  }
};

class TpSequence final : public SequenceState {
 public:
  TpSequence(std::vector<std::unique_ptr<SequenceState>> ranks, std::vector<int> devices)
      : ranks_(std::move(ranks)), devices_(std::move(devices)) {}
  int64_t max_context() const override { return ranks_[0]->max_context(); }
  void reset() override {
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->reset();
  }
  bool supports_snapshots() const override { return ranks_[0]->supports_snapshots(); }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    auto s = std::make_unique<Snapshot>();
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), s->ranks.push_back(ranks_[r]->snapshot());
    return s;
  }
  void restore(const StateSnapshot& base) override {
    const auto* s = dynamic_cast<const Snapshot*>(&base);
    if (!s || s->ranks.size() != ranks_.size()) fail("restore: snapshot does not belong to this tensor-parallel sequence");
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->restore(*s->ranks[r]);
  }
  bool supports_drop_last() const override { return ranks_[0]->supports_drop_last(); }
  void save_for_drop() override {
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->save_for_drop();
  }
  void undo_last(int64_t dropped) override {
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->undo_last(dropped);
  }
  SequenceState& rank(size_t r) { return *ranks_[r]; }

 private:
  struct Snapshot final : StateSnapshot {
    std::vector<std::unique_ptr<StateSnapshot>> ranks;
  };
  void on(size_t r) const { DSV4_CU(cudaSetDevice(devices_[r])); }
  std::vector<std::unique_ptr<SequenceState>> ranks_;
  std::vector<int> devices_;
};

class TpBackend final : public Backend {
 public:
  TpBackend(const std::vector<int>& devices, const CudaOptions& opts) : devices_(devices) {
    const int n = static_cast<int>(devices.size());
    if (n < 2) fail("tensor parallelism needs at least 2 GPUs (got ", n, ")");
    int visible = 0;
    DSV4_CU(cudaGetDeviceCount(&visible));
    for (int d : devices)
      if (d < 0 || d >= visible) fail("--tp ", n, " needs ", n, " GPUs; CUDA device ", d, " does not exist (", visible, " visible)");
    // Single-process bootstrap: one unique id, every rank initialised inside one group. (Multi-process: the id is
    // written by rank 0 and read by the others before ncclCommInitRank; see docs/MULTI_GPU.md.)
    ncclUniqueId id;
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comms_.resize(static_cast<size_t>(n));
    {
      NcclGroup g;
      for (int r = 0; r < n; ++r) {
        DSV4_CU(cudaSetDevice(devices[static_cast<size_t>(r)]));
        nccl_check(ncclCommInitRank(&comms_[static_cast<size_t>(r)], n, id, r), "ncclCommInitRank");
      }
    }
    try {
      // Decode all-reduces peer to peer where every pair of GPUs has peer access (DSV4_TP_ALLREDUCE=nccl: NCCL only,
      // for A/B); larger ones (prefill chunks) through NCCL.
      const char* ar = std::getenv("DSV4_TP_ALLREDUCE");
      if (!(ar && std::string(ar) == "nccl") && cuda::PeerReduce::available(devices))
        peer_ = std::make_unique<cuda::PeerReduce>(devices, kPeerReduceFloats);
      // PDL (ops.h) under TP only inside decode steps whose all-reduces are the peer kernels (begin/end_decode_step);
      // eager prefill, with its NCCL all-reduces, runs without it (see ops.h). DSV4_TP_PDL=0: never (A/B).
      const char* tp_pdl = std::getenv("DSV4_TP_PDL");
      pdl_decode_ = peer_ && !(tp_pdl && std::string(tp_pdl) == "0");
      cuda::set_pdl(false);
      for (int r = 0; r < n; ++r) {
        CudaOptions o = opts;
        o.device = devices[static_cast<size_t>(r)];
        o.tp_rank = r, o.tp_size = n, o.nccl_comm = comms_[static_cast<size_t>(r)];
        o.peer_reduce = peer_ ? &peer_->rank(static_cast<size_t>(r)) : nullptr;
        ranks_.push_back(make_cuda_backend(o));
      }
    } catch (...) {
      for (size_t r = 0; r < ranks_.size(); ++r) cudaSetDevice(devices_[r]), ranks_[r].reset();
      for (auto c : comms_) ncclCommDestroy(c);
      throw;
    }
  }
  ~TpBackend() override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      cudaSetDevice(devices_[r]);
      ranks_[r].reset();
    }
    if (!aborted_)
      for (auto c : comms_) ncclCommDestroy(c);
  }
  const char* name() const override { return "cuda"; }
  Backend& rank(size_t r) { return *ranks_[r]; }
  size_t ranks() const { return ranks_.size(); }
  int device(size_t r) const { return devices_[r]; }
  bool peer_path(size_t floats) const { return peer_ && floats <= kPeerReduceFloats && floats % 4 == 0; }
  // Back-to-back all-reduces of `floats` values on every rank (own buffers and streams), through the path the ranks
  // use for that size, captured as one CUDA graph per rank (as in a decode step) and timed over its replays: eager
  // launches from this one thread would measure the host's launch rate (~9 us per all-reduce on the H200 pair).
  double allreduce_us(size_t floats, int reps) {
    if (aborted_) fail("tensor-parallel backend: unusable after an earlier error aborted its NCCL communicators");
    synchronize();  // the peer kernels' epoch counters and areas are shared with the ranks' own streams
    const size_t n = ranks_.size();
    std::vector<float*> buf(n);
    std::vector<cudaStream_t> st(n);
    for (size_t r = 0; r < n; ++r) {
      on(r);
      DSV4_CU(cudaMalloc(&buf[r], floats * 4));
      DSV4_CU(cudaMemset(buf[r], 0, floats * 4));
      DSV4_CU(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    }
    auto issue = [&](int count) {
      for (int i = 0; i < count; ++i) {
        if (peer_path(floats)) {
          for (size_t r = 0; r < n; ++r) on(r), cuda::peer_all_reduce(peer_->rank(r), buf[r], floats, st[r]);
          continue;
        }
        NcclGroup g;
        for (size_t r = 0; r < n; ++r) {
          on(r);
          nccl_check(ncclAllReduce(buf[r], buf[r], floats, ncclFloat, ncclSum, comms_[r], st[r]), "ncclAllReduce");
        }
      }
    };
    // Side by side from this thread, as the decode steps: relaxed mode, and every capture ended before any graph is
    // instantiated (in thread-local mode the first instantiation fails while the other ranks still capture).
    std::vector<cudaGraphExec_t> exec(n, nullptr);
    std::vector<cudaGraph_t> graphs(n, nullptr);
    for (size_t r = 0; r < n; ++r) on(r), DSV4_CU(cudaStreamBeginCapture(st[r], cudaStreamCaptureModeRelaxed));
    issue(reps);
    for (size_t r = 0; r < n; ++r) on(r), DSV4_CU(cudaStreamEndCapture(st[r], &graphs[r]));
    for (size_t r = 0; r < n; ++r) {
      on(r);
      DSV4_CU(cudaGraphInstantiate(&exec[r], graphs[r], 0));
      DSV4_CU(cudaGraphDestroy(graphs[r]));
    }
    auto replay = [&]() {
      for (size_t r = 0; r < n; ++r) on(r), DSV4_CU(cudaGraphLaunch(exec[r], st[r]));
      for (size_t r = 0; r < n; ++r) on(r), DSV4_CU(cudaStreamSynchronize(st[r]));
    };
    replay();  // warm-up (and the graphs' upload)
    std::vector<double> t;
    for (int k = 0; k < 5; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      replay();
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    for (size_t r = 0; r < n; ++r) on(r), cudaGraphExecDestroy(exec[r]), cudaFree(buf[r]), cudaStreamDestroy(st[r]);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  std::vector<uint64_t> weight_bytes() const {
    std::vector<uint64_t> v;
    for (const auto& r : ranks_) v.push_back(cuda_detail::weight_bytes(*r));
    return v;
  }

  void load(const ModelConfig& c, const ModelWeights& w, Numerics numerics) override {
    const int tp = static_cast<int>(ranks_.size());
    check_tp(c, tp);
    for (int r = 0; r < tp; ++r) {
      const ModelWeights shard = shard_model_weights(w, c, r, tp);  // gathered column slices live until loaded
      on(static_cast<size_t>(r));
      ranks_[static_cast<size_t>(r)]->load(c, shard, numerics);
    }
  }

  std::unique_ptr<SequenceState> new_sequence(int64_t max_context) override {
    std::vector<std::unique_ptr<SequenceState>> v;
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), v.push_back(ranks_[r]->new_sequence(max_context));
    return std::make_unique<TpSequence>(std::move(v), devices_);
  }

  // Buffers: one allocation per rank; rank 0's address is the handle the model holds.
  float* alloc_f32(size_t count) override { return static_cast<float*>(alloc(count * 4, false)); }
  int32_t* alloc_i32(size_t count) override { return static_cast<int32_t*>(alloc(count * 4, true)); }
  void upload_i32(int32_t* dst, const int32_t* host, size_t count) override {
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->upload_i32(map(dst, r), host, count);
  }
  void download_f32(float* host, const float* src, size_t count) override {
    on(0);
    ranks_[0]->download_f32(host, src, count);
  }
  void download_i32(int32_t* host, const int32_t* src, size_t count) override {
    on(0);
    ranks_[0]->download_i32(host, src, count);
  }
  void synchronize() override {
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->synchronize();
  }

  void embed(const int32_t* ids, int n, float* X) override {
    each([&](Backend& b, size_t r) { b.embed(map(ids, r), n, map(X, r)); });
  }
  void hc_pre(int layer, HcSite site, const float* X, int n, float* x, float* post, float* comb) override {
    each([&](Backend& b, size_t r) { b.hc_pre(layer, site, map(X, r), n, map(x, r), map(post, r), map(comb, r)); });
  }
  void hc_post(const float* y, const float* post, const float* comb, int n, float* X) override {
    each([&](Backend& b, size_t r) { b.hc_post(map(y, r), map(post, r), map(comb, r), n, map(X, r)); });
  }
  void hc_post_pre(const float* y, float* post, float* comb, int n, float* X, int layer, HcSite site, float* x) override {
    each([&](Backend& b, size_t r) {
      b.hc_post_pre(map(y, r), map(post, r), map(comb, r), n, map(X, r), layer, site, map(x, r));
    });
  }
  void attn_qkv(int layer, const float* x, int n, int64_t pos0, float* qr, float* q, float* kv) override {
    each([&](Backend& b, size_t r) { b.attn_qkv(layer, map(x, r), n, pos0, map(qr, r), map(q, r), map(kv, r)); });
  }
  void compressor_step(int layer, CompressorKind which, const float* x, int n, int64_t pos0, SequenceState& st) override {
    each([&](Backend& b, size_t r) { b.compressor_step(layer, which, map(x, r), n, pos0, seq(st, r)); });
  }
  void indexer_topk(int layer, const float* x, const float* qr, int n, int64_t pos0, SequenceState& st,
                    int32_t* topk) override {
    each([&](Backend& b, size_t r) { b.indexer_topk(layer, map(x, r), map(qr, r), n, pos0, seq(st, r), map(topk, r)); });
  }
  void attend(int layer, const float* q, const float* kv, const int32_t* topk, int n, int64_t pos0, SequenceState& st,
              float* o) override {
    each([&](Backend& b, size_t r) {
      b.attend(layer, map(q, r), map(kv, r), map(topk, r), n, pos0, seq(st, r), map(o, r));
    });
  }
  void window_store(int layer, const float* kv, int n, int64_t pos0, SequenceState& st) override {
    each([&](Backend& b, size_t r) { b.window_store(layer, map(kv, r), n, pos0, seq(st, r)); });
  }
  void attn_out(int layer, const float* o, int n, int64_t pos0, float* out) override {
    collective([&](Backend& b, size_t r) { b.attn_out(layer, map(o, r), n, pos0, map(out, r)); });  // wo_b all-reduce
    finish_all();
  }
  void moe(int layer, const float* x, const int32_t* ids, int n, float* out) override {
    collective([&](Backend& b, size_t r) { b.moe(layer, map(x, r), map(ids, r), n, map(out, r)); });  // experts
    finish_all();
  }
  void head(const float* X, int n, float* logits) override {
    collective([&](Backend& b, size_t r) { b.head(map(X, r), n, map(logits, r)); });  // vocabulary all-gather
    each([&](Backend& b, size_t r) { cuda_detail::gather_logits(b, map(logits, r)); });
  }
  void mtp_input(const int32_t* next_ids, const float* X, int n, float* Y) override {
    each([&](Backend& b, size_t r) { b.mtp_input(map(next_ids, r), map(X, r), n, map(Y, r)); });
  }
  void mtp_head(const float* Y, int n, float* logits) override {
    collective([&](Backend& b, size_t r) { b.mtp_head(map(Y, r), n, map(logits, r)); });
    each([&](Backend& b, size_t r) { cuda_detail::gather_logits(b, map(logits, r)); });
  }

  // Every rank records/replays its own graph of the step; they must agree on the mode (same history, same keys).
  // If a rank throws or disagrees, the ranks already started are ended (a capture is discarded); one that already
  // launched its recorded step has NCCL kernels waiting for peers that will never come, so the communicators are
  // aborted then (the error reaches the user instead of a hang).
  StepMode begin_decode_step(const void* buffers, SequenceState& st, int64_t pos, bool head) override {
    if (aborted_) fail("tensor-parallel backend: unusable after an earlier error aborted its NCCL communicators");
    std::vector<StepMode> modes;
    cuda::set_pdl(pdl_decode_);  // until end_decode_step (a captured graph keeps its launch attributes)
    try {
      for (size_t r = 0; r < ranks_.size(); ++r) {
        on(r);
        modes.push_back(ranks_[r]->begin_decode_step(buffers, seq(st, r), pos, head));
        if (modes.back() != modes.front())
          fail("tensor-parallel ranks disagree on the decode-step mode (rank ", r, ")");
      }
    } catch (...) {
      bool launched = false;
      for (size_t q = 0; q < modes.size(); ++q) {
        launched |= modes[q] == StepMode::Replay;
        on(q);
        ranks_[q]->end_decode_step(false);
      }
      if (launched) abort_all();
      cuda::set_pdl(false);
      throw;
    }
    return modes.front();
  }
  void end_decode_step(bool completed) override {
    cuda::set_pdl(false);
    for (size_t r = 0; r < ranks_.size(); ++r) on(r), ranks_[r]->end_decode_step(completed);
  }

 private:
  struct Alloc {
    size_t bytes;
    std::vector<char*> base;  // per rank
  };
  void on(size_t r) const { DSV4_CU(cudaSetDevice(devices_[r])); }
  // Runs an op whose last step is a collective on every rank inside one NCCL group. If a rank throws, the ranks that
  // already enqueued their collective would wait forever for the others (and every later CUDA call on their GPUs
  // with them): abort all communicators, which ends their NCCL kernels, and rethrow, so the user sees the error
  // instead of a hang. The backend is unusable afterwards (its communicators are gone) and says so.
  template <typename F>
  void collective(F&& f) {
    if (aborted_) fail("tensor-parallel backend: unusable after an earlier error aborted its NCCL communicators");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    try {
      each(f);
    } catch (...) {
      ncclGroupEnd();
      abort_all();
      throw;
    }
    const ncclResult_t e = ncclGroupEnd();
    if (e != ncclSuccess) {
      abort_all();
      nccl_check(e, "ncclGroupEnd");
    }
  }
  // After collective(): every rank's deferred peer all-reduce first, then every rank's post-collective work. A throw
  // there may leave a launched peer kernel waiting for a rank that will not come: abort (the backend says it is
  // unusable instead of failing later with a misleading message).
  void finish_all() {
    try {
      each([&](Backend& b, size_t) { cuda_detail::launch_deferred_collective(b); });
      each([&](Backend& b, size_t) { cuda_detail::finish_collective(b); });
    } catch (...) {
      abort_all();
      throw;
    }
  }
  void abort_all() {
    if (aborted_) return;
    aborted_ = true;
    for (auto c : comms_) ncclCommAbort(c);
  }
  template <typename F>
  void each(F&& f) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      on(r);
      f(*ranks_[r], r);
    }
  }
  static SequenceState& seq(SequenceState& st, size_t r) {
    auto* t = dynamic_cast<TpSequence*>(&st);
    if (!t) fail("tensor-parallel backend: sequence state from another backend");
    return t->rank(r);
  }
  void* alloc(size_t bytes, bool ints) {
    Alloc a{bytes, {}};
    for (size_t r = 0; r < ranks_.size(); ++r) {
      on(r);
      a.base.push_back(ints ? reinterpret_cast<char*>(ranks_[r]->alloc_i32(bytes / 4))
                            : reinterpret_cast<char*>(ranks_[r]->alloc_f32(bytes / 4)));
    }
    char* h = a.base[0];
    allocs_.emplace(reinterpret_cast<uintptr_t>(h), std::move(a));
    return h;
  }
  // Rank r's address of a (possibly offset) rank-0 address handed out by alloc_*.
  template <typename T>
  T* map(T* p, size_t r) const {
    if (!p || r == 0) return p;
    const auto u = reinterpret_cast<uintptr_t>(p);
    auto it = allocs_.upper_bound(u);
    if (it == allocs_.begin()) fail("tensor-parallel backend: a buffer that it did not allocate");
    --it;
    if (u >= it->first + it->second.bytes)
      fail("tensor-parallel backend: a buffer that it did not allocate");
    return reinterpret_cast<T*>(it->second.base[r] + (u - it->first));
  }

  static constexpr size_t kPeerReduceFloats = 65536;  // 256 KB: the MoE all-reduce of up to 9 decode rows (Flash)
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::unique_ptr<cuda::PeerReduce> peer_;  // outlives the ranks (they hold pointers into it)
  bool pdl_decode_ = false;
  bool aborted_ = false;
  std::vector<std::unique_ptr<Backend>> ranks_;
  std::map<uintptr_t, Alloc> allocs_;
};

}  // namespace

std::unique_ptr<Backend> make_tp_backend(const std::vector<int>& devices, const CudaOptions& opts) {
  return std::make_unique<TpBackend>(devices, opts);
}

std::vector<std::pair<std::string, double>> cuda_op_profile(Backend& b) {
  if (auto* t = dynamic_cast<TpBackend*>(&b)) {
    DSV4_CU(cudaSetDevice(t->device(0)));
    return cuda_detail::op_profile(t->rank(0));
  }
  return cuda_detail::op_profile(b);
}

void cuda_set_op_profiling(Backend& b, bool on) {
  if (auto* t = dynamic_cast<TpBackend*>(&b)) {
    for (size_t r = 0; r < t->ranks(); ++r) cuda_detail::set_profiling(t->rank(r), on);
    return;
  }
  cuda_detail::set_profiling(b, on);
}

void cuda_set_eager_profiling(Backend& b, bool on) {
  if (auto* t = dynamic_cast<TpBackend*>(&b)) {
    DSV4_CU(cudaSetDevice(t->device(0)));
    cuda_detail::set_eager_profiling(t->rank(0), on);
    return;
  }
  cuda_detail::set_eager_profiling(b, on);
}

std::vector<std::pair<std::string, double>> cuda_eager_profile(Backend& b) {
  if (auto* t = dynamic_cast<TpBackend*>(&b)) {
    DSV4_CU(cudaSetDevice(t->device(0)));
    return cuda_detail::eager_profile(t->rank(0));
  }
  return cuda_detail::eager_profile(b);
}

double cuda_allreduce_us(Backend& b, size_t floats, int reps) {
  auto* t = dynamic_cast<TpBackend*>(&b);
  return t ? t->allreduce_us(floats, reps) : 0.0;
}
const char* cuda_allreduce_kind(Backend& b, size_t floats) {
  auto* t = dynamic_cast<TpBackend*>(&b);
  return t && t->peer_path(floats) ? "peer one-shot" : "ncclAllReduce";
}

std::vector<uint64_t> cuda_weight_bytes(const Backend& b) {
  if (const auto* t = dynamic_cast<const TpBackend*>(&b)) return t->weight_bytes();
  return {cuda_detail::weight_bytes(b)};
}

#else  // no NCCL in this build

bool tp_available() { return false; }
std::unique_ptr<Backend> make_tp_backend(const std::vector<int>&, const CudaOptions&) {
  fail("this dsv4 build has no NCCL: tensor parallelism (--tp > 1) is unavailable; rebuild with NCCL installed");
}

std::vector<uint64_t> cuda_weight_bytes(const Backend& b) { return {cuda_detail::weight_bytes(b)}; }
std::vector<std::pair<std::string, double>> cuda_op_profile(Backend& b) { return cuda_detail::op_profile(b); }
void cuda_set_op_profiling(Backend& b, bool on) { cuda_detail::set_profiling(b, on); }
void cuda_set_eager_profiling(Backend& b, bool on) { cuda_detail::set_eager_profiling(b, on); }
std::vector<std::pair<std::string, double>> cuda_eager_profile(Backend& b) { return cuda_detail::eager_profile(b); }
double cuda_allreduce_us(Backend&, size_t, int) { return 0.0; }
const char* cuda_allreduce_kind(Backend&, size_t) { return "none"; }

#endif

}  // namespace dsv4

namespace dsv4 {
void cuda_profiler_range(bool start) { DSV4_CU(start ? cudaProfilerStart() : cudaProfilerStop()); }
void cuda_trace_record_launches(bool on) { cuda::trace_record_launches(on); }
std::vector<std::string> cuda_trace_launch_names(int device) { return cuda::trace_launch_names(device); }
void cuda_trace_begin(int64_t capacity, const std::vector<int>& devices) { cuda::trace_begin(capacity, devices); }
std::vector<uint64_t> cuda_trace_end(int device) { return cuda::trace_end(device); }

double cuda_read_bandwidth(int device, size_t bytes) {
  DSV4_CU(cudaSetDevice(device));
  void* p = nullptr;
  float* sink = nullptr;
  DSV4_CU(cudaMalloc(&p, bytes));
  DSV4_CU(cudaMalloc(&sink, 4));
  DSV4_CU(cudaMemset(p, 0, bytes));
  cudaEvent_t a, b;
  DSV4_CU(cudaEventCreate(&a));
  DSV4_CU(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    DSV4_CU(cudaEventRecord(a));
    cuda::stream_read(p, bytes, sink, nullptr);
    DSV4_CU(cudaEventRecord(b));
    DSV4_CU(cudaEventSynchronize(b));
    float ms = 0;
    DSV4_CU(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a), cudaEventDestroy(b), cudaFree(p), cudaFree(sink);
  std::sort(t.begin(), t.end());
  return static_cast<double>(bytes) / t[t.size() / 2];
}
}  // namespace dsv4
