#pragma once
// The DeepSeek-V4 forward pass, written once against the Backend op interface (MODEL.md §5, order of §6.5).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "model/backend.h"
#include "model/model_weights.h"

namespace dsv4 {

// A loaded model: config + mmapped checkpoint + resolved weights + a backend holding them.
class Model {
 public:
  // Reads MODEL_DIR/config.json and the safetensors shards, resolves and validates every tensor, loads the backend.
  Model(const std::string& model_dir, std::unique_ptr<Backend> backend, Numerics numerics);
  // A model over an already opened checkpoint (in-memory synthetic weights for benchmarks).
  Model(ModelConfig cfg, ckpt::Checkpoint ck, std::unique_ptr<Backend> backend, Numerics numerics);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return *backend_; }
  Numerics numerics() const { return numerics_; }

 private:
  ModelConfig cfg_;
  ckpt::Checkpoint ckpt_;
  ModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  Numerics numerics_;
};

// Runs chunks of one sequence (or one token of each of several sequences) through the model. All activation
// buffers are allocated once for `max_chunk` tokens; forward() and forward_batch() perform no allocation, except that
// the logits buffer for more than one row ([max_chunk, vocab], 132 MB at V4's vocabulary and a 256-token chunk) is
// allocated the first time a call needs it: most Forwards (one per server session) only ever produce the last row.
class Forward {
 public:
  Forward(Model& model, int max_chunk);
  int max_chunk() const { return max_chunk_; }
  // Processes ids[0..n) at positions [pos0, pos0+n) (pos0 must equal the number of tokens already in `st`);
  // writes logits[n, vocab] to host memory if `logits` is non-null (only the last position's [vocab] when
  // last_only, which skips the LM head for the others).
  void forward(SequenceState& st, const int32_t* ids, int n, int64_t pos0, float* logits, bool last_only = false);
  // Batched decode: one token ids[i] of each of n distinct sequences sts[i] at position pos[i] (host arrays; pos[i]
  // must equal the tokens already in sts[i], n <= max_chunk). Writes logits[n, vocab] to host memory if non-null.
  // Per row the result is what forward(*sts[i], &ids[i], 1, pos[i], ...) computes (bit-identical on the CPU); the
  // position-free ops run once over all n rows (one pass over the weights). n == 1 is forward().
  void forward_batch(SequenceState* const* sts, const int32_t* ids, const int64_t* pos, int n, float* logits);
  // Speculative decoding's verify: two consecutive tokens ids[0..2) of `st` at positions pos0, pos0 + 1, both rows'
  // logits written to logits[2, vocab] (host) -- what forward(st, ids, 2, pos0, logits) computes. On a backend whose
  // *_rows ops take one sequence's consecutive positions as rows (Backend::pair_rows(): the CPU, CUDA on one GPU in
  // official numerics) it runs as a batched decode step of those two rows, which a backend with decode graphs records
  // once and replays like a single-token step; otherwise as that two-token chunk. Either way the state advances by
  // one set_tokens() (drop_last() may follow) and forward_mtp() can run at both positions afterwards; no observer
  // sees it (as no decode step).
  void forward_pair(SequenceState& st, const int32_t* ids, int64_t pos0, float* logits);
  // MTP draft logits for positions [pos0, pos0 + n) of the chunk just run by forward() on `st` (any consecutive run of
  // its rows): position t's main streams + token t+1 (next_ids[i] is the token after position pos0 + i) predict token
  // t + 2. Uses (and advances) the MTP block's own window state in `st`, so a sequence's MTP positions must be run in
  // order. logits: [n, vocab] host memory, only the last row's when last_only, or nullptr for none (the LM head is
  // then skipped: a prompt's MTP window is filled without it).
  void forward_mtp(SequenceState& st, const int32_t* next_ids, int n, int64_t pos0, float* logits, bool last_only = false);
  // Whether the last forward() ran on `st` and covered position `pos` (forward_mtp can start there).
  bool holds_streams(const SequenceState& st, int64_t pos) const {
    return last_state_ == &st && pos >= last_pos0_ && pos < last_pos0_ + last_n_;
  }

  // Debugging/A-B hook: called after every sub-layer with the residual streams X[n, hc, d] (backend memory; copy with
  // Backend::download_f32). site is "attn" or "ffn". Only multi-token chunks are observed: a single-token step may
  // be a replayed CUDA graph, where nothing runs on the host between ops.
  using Observer = std::function<void(int layer, const char* site, const float* X, int n)>;
  void set_observer(Observer fn) { observer_ = std::move(fn); }

 private:
  // first: the block runs its own attention hc_pre; last: its FFN hc_post is not fused with a next block's hc_pre.
  void block(int layer, float* X, int n, int64_t pos0, SequenceState& st, bool first, bool last);
  void block_rows(int layer, float* X, int n, const int64_t* pos, SequenceState* const* sts, bool first, bool last);
  void ffn(int layer, float* X, int n, bool last);
  // The rows of a batched step (forward_batch, forward_pair) after their checks; sets no sequence's token count and
  // downloads nothing: returns the [n, vocab] logits in backend memory when with_logits (else nullptr).
  const float* run_rows(SequenceState* const* sts, const int64_t* pos, int n, bool with_logits);
  void check_position(const SequenceState& st, int64_t pos0, int n) const;
  Model& m_;
  int max_chunk_;
  // Backend-memory activations.
  int last_n_ = -1;
  int64_t last_pos0_ = -1;
  const SequenceState* last_state_ = nullptr;  // the sequence of the last forward (its streams are in X_)
  float *X_, *Y_, *x_, *post_, *comb_, *qr_, *q_, *kv_, *o_, *y_;
  // Logits in backend memory: one row (decode steps, last-row prefill; a recorded decode graph keeps writing to this
  // buffer, so it never moves), and [max_chunk, vocab] allocated on first need.
  float* logits1_ = nullptr;
  float* logits_n_ = nullptr;
  float* logits_for(int rows);
  int32_t *ids_, *mtp_ids_, *topk_;
  Observer observer_;
};

}  // namespace dsv4
