#include "model/model.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

std::unique_ptr<StateSnapshot> SequenceState::snapshot() const { fail("this backend's sequence state has no snapshots"); }
void SequenceState::restore(const StateSnapshot&) { fail("this backend's sequence state has no snapshots"); }
void SequenceState::save_for_drop() { fail("this backend's sequence state cannot drop a token (no speculative decoding)"); }
void SequenceState::undo_last(int64_t) { fail("this backend's sequence state cannot drop a token (no speculative decoding)"); }

void SequenceState::prepare_drop_last() {
  if (tokens_ < 0) fail("prepare_drop_last: the sequence state is inconsistent (a forward failed)");
  save_for_drop();
  drop_base_ = tokens_;
  drop_sets_ = sets_;
}

void SequenceState::drop_last() {
  // Only right after prepare_drop_last() and ONE two-token forward: anything else (no prepare, a forward of another
  // size, a failed forward, a reset/restore in between) would leave a state that holds neither sequence.
  if (drop_base_ < 0 || tokens_ != drop_base_ + 2 || sets_ != drop_sets_ + 1)
    fail("drop_last: the state did not just run a two-token forward after prepare_drop_last (tokens ", tokens_,
         ", prepared at ", drop_base_, ")");
  undo_last(drop_base_ + 1);
  tokens_ = drop_base_ + 1, ++sets_;
  drop_base_ = -1;
}


void Backend::hc_post_pre(const float* y, float* post, float* comb, int n, float* X, int layer, HcSite site, float* x) {
  hc_post(y, post, comb, n, X);
  hc_pre(layer, site, X, n, x, post, comb);
}

void Backend::moe_post_pre(int layer, const float* x, const int32_t* ids, int n, float* y, float* post, float* comb,
                           float* X, int next_layer, HcSite site, float* x_next) {
  moe(layer, x, ids, n, y);
  hc_post_pre(y, post, comb, n, X, next_layer, site, x_next);
}

// Default batched ops: the single-sequence op once per row.
static const RowDims& dims_or_fail(const Backend& b) {
  const RowDims& d = b.row_dims();
  if (d.x <= 0) fail("backend row dims are not set (Forward sets them)");
  return d;
}

void Backend::attn_qkv_rows(int layer, const float* x, int n, const int64_t* pos, float* qr, float* q, float* kv) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i) attn_qkv(layer, x + i * d.x, 1, pos[i], qr + i * d.qr, q + i * d.q, kv + i * d.kv);
}

void Backend::compressor_step_rows(int layer, CompressorKind which, const float* x, int n, const int64_t* pos,
                                   SequenceState* const* sts) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i) compressor_step(layer, which, x + i * d.x, 1, pos[i], *sts[i]);
}

void Backend::indexer_topk_rows(int layer, const float* x, const float* qr, int n, const int64_t* pos,
                                SequenceState* const* sts, int32_t* topk) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i) indexer_topk(layer, x + i * d.x, qr + i * d.qr, 1, pos[i], *sts[i], topk + i * d.topk);
}

void Backend::attend_rows(int layer, const float* q, const float* kv, const int32_t* topk, int n, const int64_t* pos,
                          SequenceState* const* sts, float* o) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i)
    attend(layer, q + i * d.q, kv + i * d.kv, topk ? topk + i * d.topk : nullptr, 1, pos[i], *sts[i], o + i * d.o);
}

void Backend::window_store_rows(int layer, const float* kv, int n, const int64_t* pos, SequenceState* const* sts) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i) window_store(layer, kv + i * d.kv, 1, pos[i], *sts[i]);
}

void Backend::attn_out_rows(int layer, const float* o, int n, const int64_t* pos, float* out) {
  const RowDims& d = dims_or_fail(*this);
  for (int i = 0; i < n; ++i) attn_out(layer, o + i * d.o, 1, pos[i], out + i * d.x);
}

const char* numerics_name(Numerics n) { return n == Numerics::Reference ? "reference" : "official"; }

Numerics parse_numerics(const std::string& s) {
  if (s == "reference") return Numerics::Reference;
  if (s == "official") return Numerics::Official;
  fail("unknown numerics '", s, "' (expected reference or official)");
}

Model::Model(const std::string& dir, std::unique_ptr<Backend> backend, Numerics numerics)
    : cfg_(load_model_config(dir + "/config.json")),
      ckpt_(ckpt::Checkpoint::open(dir)),
      weights_(resolve_model_weights(ckpt_, cfg_)),
      backend_(std::move(backend)),
      numerics_(numerics) {
  backend_->load(cfg_, weights_, numerics_);
}

Model::Model(ModelConfig cfg, ckpt::Checkpoint ck, std::unique_ptr<Backend> backend, Numerics numerics)
    : cfg_(std::move(cfg)),
      ckpt_(std::move(ck)),
      weights_(resolve_model_weights(ckpt_, cfg_)),
      backend_(std::move(backend)),
      numerics_(numerics) {
  backend_->load(cfg_, weights_, numerics_);
}

Forward::Forward(Model& m, int max_chunk) : m_(m), max_chunk_(max_chunk) {
  if (max_chunk <= 0) fail("max_chunk must be positive");
  const ModelConfig& c = m.config();
  Backend& b = m.backend();
  const size_t n = static_cast<size_t>(max_chunk);
  RowDims d;  // strides of the activations below, for the backend's default *_rows ops
  d.x = c.hidden;
  d.qr = c.q_lora_rank;
  d.q = d.o = static_cast<int64_t>(c.n_heads) * c.head_dim;
  d.kv = c.head_dim;
  d.topk = std::max(c.index_topk, 1);
  b.set_row_dims(d);
  X_ = b.alloc_f32(n * c.hc_mult * c.hidden);
  Y_ = m.weights().mtp ? b.alloc_f32(n * c.hc_mult * c.hidden) : nullptr;
  x_ = b.alloc_f32(n * c.hidden);
  post_ = b.alloc_f32(n * c.hc_mult);
  comb_ = b.alloc_f32(n * c.hc_mult * c.hc_mult);
  qr_ = b.alloc_f32(n * c.q_lora_rank);
  q_ = b.alloc_f32(n * c.n_heads * c.head_dim);
  kv_ = b.alloc_f32(n * c.head_dim);
  o_ = b.alloc_f32(n * c.n_heads * c.head_dim);
  y_ = b.alloc_f32(n * c.hidden);
  logits1_ = b.alloc_f32(c.vocab_size);
  ids_ = b.alloc_i32(n);
  mtp_ids_ = b.alloc_i32(n);
  topk_ = b.alloc_i32(n * static_cast<size_t>(std::max(c.index_topk, 1)));
}

// One block (MODEL.md §5.2) in the op order of §6.5; layer == n_layers is the MTP block. Every mHC post runs fused
// with the mHC pre that follows it (Backend::hc_post_pre): the attention's with the FFN's, and the FFN's with the next
// block's attention pre. So only the first block of a stack runs its own attention pre (otherwise x_, post_, comb_
// already hold it), and only the last ends with a plain post (the head follows). The observer sees the same X
// either way: the pre leaves X as the post wrote it.
void Forward::block(int l, float* X, int n, int64_t pos0, SequenceState& st, bool first, bool last) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  const AttnKind kind = c.kind(l);
  // Attention sub-layer.
  if (first) b.hc_pre(l, HcSite::Attn, X, n, x_, post_, comb_);
  b.attn_qkv(l, x_, n, pos0, qr_, q_, kv_);
  const int32_t* topk = nullptr;
  if (kind == AttnKind::CSA) {
    b.compressor_step(l, CompressorKind::Indexer, x_, n, pos0, st);
    b.indexer_topk(l, x_, qr_, n, pos0, st, topk_);
    topk = topk_;
  }
  if (kind != AttnKind::SWA) b.compressor_step(l, CompressorKind::Main, x_, n, pos0, st);
  b.attend(l, q_, kv_, topk, n, pos0, st, o_);
  b.window_store(l, kv_, n, pos0, st);
  b.attn_out(l, o_, n, pos0, y_);
  b.hc_post_pre(y_, post_, comb_, n, X, l, HcSite::Ffn, x_);
  if (observer_ && n > 1) observer_(l, "attn", X, n);
  // FFN sub-layer.
  ffn(l, X, n, last);
  if (observer_ && n > 1) observer_(l, "ffn", X, n);
}

// The FFN of block l and its mHC post, fused with block l + 1's attention pre unless l is the last block of its stack
// (the experts' output straight into that post: Backend::moe_post_pre).
void Forward::ffn(int l, float* X, int n, bool last) {
  Backend& b = m_.backend();
  if (last) {
    b.moe(l, x_, ids_, n, y_);
    b.hc_post(y_, post_, comb_, n, X);
  } else {
    b.moe_post_pre(l, x_, ids_, n, y_, post_, comb_, X, l + 1, HcSite::Attn, x_);
  }
}

// The same block for one token of each of n sequences (forward_batch): position/state ops use their *_rows form.
void Forward::block_rows(int l, float* X, int n, const int64_t* pos, SequenceState* const* sts, bool first, bool last) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  const AttnKind kind = c.kind(l);
  if (first) b.hc_pre(l, HcSite::Attn, X, n, x_, post_, comb_);
  b.attn_qkv_rows(l, x_, n, pos, qr_, q_, kv_);
  const int32_t* topk = nullptr;
  if (kind == AttnKind::CSA) {
    b.compressor_step_rows(l, CompressorKind::Indexer, x_, n, pos, sts);
    b.indexer_topk_rows(l, x_, qr_, n, pos, sts, topk_);
    topk = topk_;
  }
  if (kind != AttnKind::SWA) b.compressor_step_rows(l, CompressorKind::Main, x_, n, pos, sts);
  b.attend_rows(l, q_, kv_, topk, n, pos, sts, o_);
  b.window_store_rows(l, kv_, n, pos, sts);
  b.attn_out_rows(l, o_, n, pos, y_);
  b.hc_post_pre(y_, post_, comb_, n, X, l, HcSite::Ffn, x_);
  ffn(l, X, n, last);
}

void Forward::forward_batch(SequenceState* const* sts, const int32_t* ids, const int64_t* pos, int n, float* logits) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  if (n <= 0 || n > max_chunk_) fail("batch of ", n, " sequences does not fit the forward's max chunk ", max_chunk_);
  last_state_ = nullptr;  // X_ is about to hold several sequences' rows: no forward_mtp after a batch
  for (int i = 0; i < n; ++i) {
    if (!sts[i]) fail("batch row ", i, " has no sequence");
    for (int j = 0; j < i; ++j)
      if (sts[j] == sts[i]) fail("batch rows ", j, " and ", i, " are the same sequence (one token per sequence)");
    check_position(*sts[i], pos[i], 1);
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      fail("token id ", ids[i], " of batch row ", i, " is out of range [0, ", c.vocab_size, ")");
  }
  // One token of one sequence is an ordinary decode step (and may replay a recorded step on the backend).
  if (n == 1) return forward(*sts[0], ids, 1, pos[0], logits);
  b.upload_i32(ids_, ids, static_cast<size_t>(n));
  const float* lg = nullptr;
  try {
    lg = run_rows(sts, pos, n, logits != nullptr);
  } catch (...) {
    for (int i = 0; i < n; ++i) sts[i]->set_tokens(-1);
    throw;
  }
  for (int i = 0; i < n; ++i) sts[i]->set_tokens(pos[i] + 1);
  if (logits) b.download_f32(logits, lg, static_cast<size_t>(n) * static_cast<size_t>(c.vocab_size));
}

const float* Forward::run_rows(SequenceState* const* sts, const int64_t* pos, int n, bool with_logits) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  last_n_ = -1;  // forward_mtp follows forward() (or forward_pair) only
  float* lg = with_logits ? logits_for(n) : nullptr;  // before a recording starts (it may allocate)
  // Like a single-token step, a batched step may be recorded once and replayed whole (Backend::begin_decode_batch).
  const StepMode mode = b.begin_decode_batch(ids_, sts, pos, n, with_logits);
  try {
    if (mode != StepMode::Replay) {
      b.embed(ids_, n, X_);
      for (int l = 0; l < c.n_layers; ++l) block_rows(l, X_, n, pos, sts, l == 0, l + 1 == c.n_layers);
      if (lg) b.head(X_, n, lg);
    }
  } catch (...) {
    b.end_decode_step(false);
    throw;
  }
  b.end_decode_step(true);
  return lg;
}

void Forward::forward_pair(SequenceState& st, const int32_t* ids, int64_t pos0, float* logits) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  if (!b.pair_rows()) return forward(st, ids, 2, pos0, logits, false);
  if (max_chunk_ < 2) fail("forward_pair needs a Forward of max chunk >= 2 (this one: ", max_chunk_, ")");
  check_position(st, pos0, 2);
  for (int i = 0; i < 2; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      fail("token id ", ids[i], " at position ", pos0 + i, " is out of range [0, ", c.vocab_size, ")");
  SequenceState* sts[2] = {&st, &st};
  const int64_t pos[2] = {pos0, pos0 + 1};
  b.upload_i32(ids_, ids, 2);
  last_state_ = nullptr;
  const float* lg = nullptr;
  try {
    lg = run_rows(sts, pos, 2, logits != nullptr);
  } catch (...) {
    st.set_tokens(-1);
    throw;
  }
  st.set_tokens(pos0 + 2);
  // X_ holds the two rows' streams, as after forward() of the pair: the MTP block may start at either position.
  last_n_ = 2;
  last_pos0_ = pos0;
  last_state_ = &st;
  if (logits) b.download_f32(logits, lg, 2 * static_cast<size_t>(c.vocab_size));
}

float* Forward::logits_for(int rows) {
  if (rows <= 1) return logits1_;
  if (!logits_n_) logits_n_ = m_.backend().alloc_f32(static_cast<size_t>(max_chunk_) * static_cast<size_t>(m_.config().vocab_size));
  return logits_n_;
}

void Forward::check_position(const SequenceState& st, int64_t pos0, int n) const {
  if (pos0 < 0) fail("negative position ", pos0);
  if (pos0 + n > st.max_context())
    fail("sequence of ", pos0 + n, " tokens exceeds the session's max context ", st.max_context());
  if (pos0 != 0 && st.tokens() >= 0 && st.tokens() != pos0)
    fail("chunk starts at position ", pos0, " but the sequence holds ", st.tokens(), " tokens");
}

void Forward::forward_mtp(SequenceState& st, const int32_t* next_ids, int n, int64_t pos0, float* logits, bool last_only) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  if (!m_.weights().mtp) fail("this checkpoint has no MTP block (mtp.0.*)");
  if (n <= 0 || !holds_streams(st, pos0) || !holds_streams(st, pos0 + n - 1))
    fail("forward_mtp must follow forward() of a chunk of the same sequence that covers its positions");
  for (int i = 0; i < n; ++i)
    if (next_ids[i] < 0 || next_ids[i] >= c.vocab_size) fail("MTP token id ", next_ids[i], " is out of range");
  const size_t row = static_cast<size_t>(c.hc_mult) * static_cast<size_t>(c.hidden);
  const int rows = last_only ? 1 : n;
  float* lg = logits ? logits_for(rows) : nullptr;
  b.upload_i32(mtp_ids_, next_ids, static_cast<size_t>(n));
  b.mtp_input(mtp_ids_, X_ + static_cast<size_t>(pos0 - last_pos0_) * row, n, Y_);
  block(c.n_layers, Y_, n, pos0, st, true, true);
  if (!logits) return;
  b.mtp_head(Y_ + static_cast<size_t>(n - rows) * row, rows, lg);
  b.download_f32(logits, lg, static_cast<size_t>(rows) * static_cast<size_t>(c.vocab_size));
}

void Forward::forward(SequenceState& st, const int32_t* ids, int n, int64_t pos0, float* logits, bool last_only) {
  const ModelConfig& c = m_.config();
  Backend& b = m_.backend();
  if (n <= 0 || n > max_chunk_) fail("chunk of ", n, " tokens does not fit the forward's max chunk ", max_chunk_);
  check_position(st, pos0, n);
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size) fail("token id ", ids[i], " at position ", pos0 + i, " is out of range [0, ", c.vocab_size, ")");
  b.upload_i32(ids_, ids, static_cast<size_t>(n));
  const int rows = last_only ? 1 : n;
  float* lg = logits ? logits_for(rows) : nullptr;  // before a decode recording starts (it may allocate)
  // A single-token step may be recorded once and replayed whole by the backend (Backend::begin_decode_step); the
  // ops and their order are the same either way.
  const StepMode mode = n == 1 ? b.begin_decode_step(ids_, st, pos0, logits != nullptr) : StepMode::Eager;
  try {
    if (mode != StepMode::Replay) {
      b.embed(ids_, n, X_);
      for (int l = 0; l < c.n_layers; ++l) block(l, X_, n, pos0, st, l == 0, l + 1 == c.n_layers);
      if (logits) b.head(X_ + static_cast<size_t>(n - rows) * c.hc_mult * c.hidden, rows, lg);
    }
  } catch (...) {
    st.set_tokens(-1);
    last_state_ = nullptr;
    if (n == 1) b.end_decode_step(false);
    throw;
  }
  if (n == 1) b.end_decode_step(true);
  st.set_tokens(pos0 + n);
  last_n_ = n;
  last_pos0_ = pos0;
  last_state_ = &st;
  if (logits) b.download_f32(logits, lg, static_cast<size_t>(rows) * static_cast<size_t>(c.vocab_size));
}

}  // namespace dsv4
