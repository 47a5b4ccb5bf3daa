#pragma once
// The DeepSeek-V4 op interface. The model forward (model.cpp) is written once against it; backend/cpu (the fp32
// reference) and backend/cuda implement it. Ops are model-specific so that backends can fuse freely: each op names a
// layer and works on a chunk of `n` consecutive tokens of ONE sequence at absolute positions [pos0, pos0 + n).
// Batched decode (Forward::forward_batch) runs one token of each of n DIFFERENT sequences: the position-free ops
// (embed, hc_pre, hc_post, moe, head) take the n rows as they are, and the ops that read a position or a sequence's
// state have `*_rows` variants (row i = one token of sts[i] at position pos[i]) whose default loops over the rows
// calling the single-sequence op with n = 1, so every backend supports batching; a backend overrides them to fuse.
// All float* / int32_t* activation pointers live in backend memory (host for CPU, device for CUDA) and come from
// Backend::alloc_*; the model never dereferences them.
#include <cstdint>
#include <memory>

#include "checkpoint/config.h"
#include "model/model_weights.h"

namespace dsv4 {

// reference: exact fp32 math (what HF transformers computes). official: the release's quantization simulation
// (MODEL.md §4: FP8 1x128 activations into FP8/FP4 linears, SIM8 on KV nope dims, Hadamard + SIM4 in the indexer,
// BF16 roundings).
enum class Numerics { Reference, Official };
const char* numerics_name(Numerics n);
Numerics parse_numerics(const std::string& s);  // throws on unknown names

enum class HcSite { Attn, Ffn };

// How the ops of a single-token forward step run (Backend::begin_decode_step). Eager: the model calls them as usual.
// Record: the same, while the backend records them instead of running them (CUDA: stream capture into a graph, which
// it runs at end_decode_step). Replay: the backend has already run a recording of the whole step at the new position;
// the model skips the ops.
enum class StepMode { Eager, Record, Replay };
enum class CompressorKind { Main, Indexer };

// A copy of the part of a sequence's state that later tokens overwrite: window rings, compressor running state and
// the compressed-cache entry counts. Compressed entries themselves are append-only, so restoring a snapshot only
// truncates them (entries past the snapshot are recomputed identically).
class StateSnapshot {
 public:
  virtual ~StateSnapshot() = default;
};

// Per-sequence decode state (window rings, compressed caches, compressor running state). Owned by the backend;
// sized once from max_context and never grown.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  // Tokens the state holds, as far as its users know (-1 = unknown): Forward advances it after every forward and
  // checks a chunk's start position against it; whoever calls reset()/restore() sets it (Session does), since
  // backends implement those. A chunk at position 0 is always accepted (a fresh or reset sequence).
  int64_t tokens() const { return tokens_; }
  void set_tokens(int64_t n) { tokens_ = n, ++sets_; }
  virtual int64_t max_context() const = 0;
  virtual void reset() = 0;  // back to an empty sequence (state must be re-initialised per sequence)
  // Rollback support for prefix reuse. A backend without it makes sessions recompute from position 0 (correct,
  // slower); supports_snapshots() says which.
  virtual bool supports_snapshots() const { return false; }
  virtual std::unique_ptr<StateSnapshot> snapshot() const;
  virtual void restore(const StateSnapshot& s);

  // Speculative decoding with one draft token (Session): prepare_drop_last() right before a forward of exactly two
  // tokens; drop_last() after it leaves the state exactly as a forward of the FIRST token alone would have. Cheap by
  // construction -- no copy of the window rings: a dropped token's ring slot (and its compressor row) held a position
  // no later query can see, and the next token at that position overwrites it before anything reads it. What the
  // dropped token can change that the state after the first token still needs is saved by prepare_drop_last(): the
  // entry counts, and the overlapping compressors' previous window (which an emission replaces). A backend without it
  // makes speculation unavailable; supports_drop_last() says which.
  virtual bool supports_drop_last() const { return false; }
  void prepare_drop_last();
  void drop_last();
  // The backend's part of the two above (a composite state -- tensor parallelism -- forwards them to its parts):
  virtual void save_for_drop();               // what drop_last() needs, taken before the two-token forward
  virtual void undo_last(int64_t dropped);    // undo the token at position `dropped` (the two-token forward's second)

 private:
  int64_t tokens_ = 0;
  int64_t drop_base_ = -1;  // tokens() at prepare_drop_last(); -1: none pending
  int64_t sets_ = 0, drop_sets_ = 0;  // set_tokens() calls, and their count at prepare_drop_last()
};

// Row strides (elements per token) of the activations the *_rows ops exchange; Forward sets them.
struct RowDims {
  int64_t x = 0, qr = 0, q = 0, kv = 0, o = 0, topk = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Prepares weights in the backend's own storage (CPU: fp32; CUDA: device copies in their stored formats).
  virtual void load(const ModelConfig& cfg, const ModelWeights& w, Numerics numerics) = 0;
  virtual std::unique_ptr<SequenceState> new_sequence(int64_t max_context) = 0;

  virtual float* alloc_f32(size_t count) = 0;      // lives as long as the backend
  virtual int32_t* alloc_i32(size_t count) = 0;
  virtual void upload_i32(int32_t* dst, const int32_t* host, size_t count) = 0;
  virtual void download_f32(float* host, const float* src, size_t count) = 0;
  virtual void download_i32(int32_t* host, const int32_t* src, size_t count) = 0;
  virtual void synchronize() {}

  // X[n, hc, d] = embed[ids] broadcast to every stream.
  virtual void embed(const int32_t* ids, int n, float* X) = 0;
  // mHC collapse + the following RMSNorm: x[n, d] = rms(Σ_s pre_s X_s, attn_norm|ffn_norm); post[n, hc]; comb[n, hc, hc].
  virtual void hc_pre(int layer, HcSite site, const float* X, int n, float* x, float* post, float* comb) = 0;
  // X[n, hc, d] = post ⊗ y + combᵀ X (in place).
  virtual void hc_post(const float* y, const float* post, const float* comb, int n, float* X) = 0;
  // hc_post(y, post, comb, n, X) then hc_pre(layer, site, X, n, x, post, comb): post/comb are read for the post and
  // then overwritten by the pre. One op so that a backend can fuse the two (a sub-layer's output into the next
  // sub-layer's input); the default runs them one after the other.
  virtual void hc_post_pre(const float* y, float* post, float* comb, int n, float* X, int layer, HcSite site, float* x);
  // moe(layer, x, ids, n, y) then hc_post_pre(y, post, comb, n, X, next_layer, site, x_next): the FFN's output
  // straight into the next sub-layer's mHC (x_next may be x: the pre overwrites it after the experts read it). One op
  // so that a backend can sum the experts' outputs inside the post (y is then scratch the op may leave unwritten);
  // the default runs the two ops one after the other.
  virtual void moe_post_pre(int layer, const float* x, const int32_t* ids, int n, float* y, float* post, float* comb,
                            float* X, int next_layer, HcSite site, float* x_next);
  // Query path and this chunk's window KV: qr[n, q_lora] (normed, also the indexer's input), q[n, H, D] (per-head
  // norm + RoPE at its position), kv[n, D] (norm, RoPE, and SIM8 in official mode).
  virtual void attn_qkv(int layer, const float* x, int n, int64_t pos0, float* qr, float* q, float* kv) = 0;
  // Feeds the chunk through a compressor, appending every entry it completes to the state's compressed cache.
  virtual void compressor_step(int layer, CompressorKind which, const float* x, int n, int64_t pos0,
                               SequenceState& st) = 0;
  // Lightning indexer: topk[n, index_topk] = entries chosen for each query (-1 = none), only visible ones, in an
  // order each backend defines -- attend() takes the set in any order.
  virtual void indexer_topk(int layer, const float* x, const float* qr, int n, int64_t pos0, SequenceState& st,
                            int32_t* topk) = 0;
  // Sparse attention with sink over: window (ring entries of earlier chunks + this chunk's kv) and compressed
  // entries (CSA: topk; HCA: all visible). o[n, H, D].
  virtual void attend(int layer, const float* q, const float* kv, const int32_t* topk, int n, int64_t pos0,
                      SequenceState& st, float* o) = 0;
  // Writes the chunk's window KV into the ring (after attention, so a chunk longer than the window stays correct).
  virtual void window_store(int layer, const float* kv, int n, int64_t pos0, SequenceState& st) = 0;
  // Inverse RoPE at the query position, grouped wo_a, wo_b: out[n, d].
  virtual void attn_out(int layer, const float* o, int n, int64_t pos0, float* out) = 0;
  // Routed (hash or score) + shared experts: out[n, d]. ids are the chunk's token ids (for hash routing).
  virtual void moe(int layer, const float* x, const int32_t* ids, int n, float* out) = 0;
  // hc_head collapse, final norm, LM head: logits[n, vocab].
  virtual void head(const float* X, int n, float* logits) = 0;

  // Batched decode: row i is one token of sequence sts[i] at position pos[i] (pos and sts are host arrays, the
  // sequences distinct, except for the pairs pair_rows() allows). Same contracts as the single-sequence ops above;
  // the defaults run those with n = 1 per row (pointer arithmetic on backend pointers is valid for every backend), so
  // a backend overrides them only to fuse.
  virtual void attn_qkv_rows(int layer, const float* x, int n, const int64_t* pos, float* qr, float* q, float* kv);
  virtual void compressor_step_rows(int layer, CompressorKind which, const float* x, int n, const int64_t* pos,
                                    SequenceState* const* sts);
  virtual void indexer_topk_rows(int layer, const float* x, const float* qr, int n, const int64_t* pos,
                                 SequenceState* const* sts, int32_t* topk);
  virtual void attend_rows(int layer, const float* q, const float* kv, const int32_t* topk, int n, const int64_t* pos,
                           SequenceState* const* sts, float* o);
  virtual void window_store_rows(int layer, const float* kv, int n, const int64_t* pos, SequenceState* const* sts);
  virtual void attn_out_rows(int layer, const float* o, int n, const int64_t* pos, float* out);
  // Whether the *_rows ops (and begin_decode_batch) also take rows that are ONE sequence at ascending consecutive
  // positions (and no other sequence), each row seeing the earlier rows' effects as a chunk would (their window
  // entries, compressor state, emitted entries): Forward::forward_pair then runs a speculative verify as a batched
  // step. Other repetitions of a sequence are errors. The defaults above do not (their
  // row loop runs every row's attend before any row's window_store), so the default is no.
  virtual bool pair_rows() const { return false; }
  void set_row_dims(const RowDims& d) { rows_ = d; }
  const RowDims& row_dims() const { return rows_; }

  // Whole-step recording for single-token decode (CUDA graphs remove the per-kernel launch cost). Called by
  // Forward::forward for n == 1 after the token id is uploaded: `buffers` identifies the caller's activation buffers
  // (a recording has their addresses baked in), `head` says whether the step ends with head(). Every call is paired
  // with end_decode_step (completed = false when an op threw: a recording in progress is discarded). The default
  // (CPU) runs every step eagerly.
  virtual StepMode begin_decode_step(const void* buffers, SequenceState& st, int64_t pos, bool head) {
    (void)buffers, (void)st, (void)pos, (void)head;
    return StepMode::Eager;
  }
  // The same for a batched decode step (Forward::forward_batch, and forward_pair's two rows of one sequence; n >= 2
  // rows; sts / pos as in the *_rows ops, host arrays): a recording is keyed by the buffers, the head flag and the
  // ordered list of sequences (a pair's: the sequence twice), and reads each row's position from the backend, so it
  // serves every later step of the same batch. Paired with end_decode_step.
  virtual StepMode begin_decode_batch(const void* buffers, SequenceState* const* sts, const int64_t* pos, int n,
                                      bool head) {
    (void)buffers, (void)sts, (void)pos, (void)n, (void)head;
    return StepMode::Eager;
  }
  virtual void end_decode_step(bool completed) { (void)completed; }

  // MTP block (layer index n_layers; MODEL.md §5.11). Input fusion: Y[n, hc, d] = h_proj(rms(X_s, hnorm)) +
  // e_proj(rms(embed[next_ids], enorm)) for every stream s, where X are the main streams before hc_head and
  // next_ids the tokens at positions +1. The block itself runs through the ordinary ops with layer = n_layers.
  virtual void mtp_input(const int32_t* next_ids, const float* X, int n, float* Y) = 0;
  // MTP output: mtp.hc_head collapse, mtp.norm, the shared LM head: logits[n, vocab].
  virtual void mtp_head(const float* Y, int n, float* logits) = 0;

 private:
  RowDims rows_;
};

}  // namespace dsv4
