#include <algorithm>
#include <new>

#include "core/error.h"
#include "dsv4/engine.h"
#include "model/model.h"
#include "runtime/backend_factory.h"

namespace dsv4 {

// What the engine's sessions share: the prefill Forward (activation buffers for prefill_chunk tokens -- a few GB at
// CUDA's default chunk -- once per engine, not once per session: sessions run one at a time), batched decode's own
// Forward (its multi-row logits buffer is allocated once, here, instead of in whichever session happened to come first
// in a batch) and host scratch, grown once to the largest batch (then a step allocates nothing).
struct Engine::BatchScratch {
  std::unique_ptr<Forward> prefill;
  std::unique_ptr<Forward> fwd;
  std::vector<SequenceState*> states;
  std::vector<int32_t> ids;
  std::vector<int64_t> pos;
  std::vector<float> logits;
};

Engine::Engine() = default;

std::unique_ptr<Engine> Engine::load(const EngineOptions& o) {
  if (o.max_context <= 0) fail("max context must be positive (got ", o.max_context, ")");
  if (o.prefill_chunk < 0) fail("prefill chunk must be positive (got ", o.prefill_chunk, ")");
  std::unique_ptr<Engine> e(new Engine());
  e->opts_ = o;
  if (o.prefill_chunk == 0) e->opts_.prefill_chunk = default_prefill_chunk(o.backend, o.max_context);
  // A forward never holds more tokens than a session can: a larger chunk would only size buffers nothing fills.
  e->opts_.prefill_chunk = static_cast<int>(std::min<int64_t>(e->opts_.prefill_chunk, o.max_context));
  if (o.speculative != "none" && o.speculative != "mtp")
    fail("unknown speculative decoding method '", o.speculative, "' (none | mtp)");
  e->model_ = std::make_unique<Model>(o.model_dir, make_backend(o.backend, o.tp), parse_numerics(o.numerics));
  const ModelConfig& c = e->model_->config();
  if (o.speculative == "mtp") {
    if (!e->model_->weights().mtp) fail("--speculative mtp: ", o.model_dir, " has no MTP block (mtp.0.*)");
    if (!e->model_->backend().new_sequence(1)->supports_drop_last())
      fail("--speculative mtp: the ", o.backend, " backend cannot drop a rejected draft token");
  }
  if (o.max_context > c.max_position_embeddings)
    fail("max context ", o.max_context, " exceeds the model's max_position_embeddings ", c.max_position_embeddings);
  e->info_ = ModelInfo{c.vocab_size, c.eos_token_id, c.bos_token_id, c.n_layers, o.backend, o.numerics};
  // The prefill buffers now, not at the first prompt: a chunk too large for the memory left is a load-time error.
  try {
    e->prefill_forward();
  } catch (const Error& err) {
    fail("cannot allocate the prefill buffers for ", e->opts_.prefill_chunk, " tokens per forward (", err.what(),
         "): use a smaller --prefill-chunk");
  } catch (const std::bad_alloc&) {
    fail("cannot allocate the prefill buffers for ", e->opts_.prefill_chunk, " tokens per forward (out of host memory): "
         "use a smaller --prefill-chunk");
  }
  return e;
}

Engine::~Engine() = default;

Forward& Engine::prefill_forward() {
  if (!batch_) batch_ = std::make_unique<BatchScratch>();
  if (!batch_->prefill) batch_->prefill = std::make_unique<Forward>(*model_, opts_.prefill_chunk);
  return *batch_->prefill;
}

std::unique_ptr<Session> Engine::new_session() { return std::unique_ptr<Session>(new Session(*this)); }

int default_prefill_chunk(const std::string& backend, int64_t max_context) {
  if (backend != "cuda") return 256;
  return static_cast<int>(std::min<int64_t>(8192, (std::max<int64_t>(max_context, 1) + 63) / 64 * 64));
}

// Snapshots every `interval` tokens bound the recomputation of a rollback to that many tokens: 64, or the prefill
// chunk rounded down to a multiple of 64 where that is more. A prefill's chunks end at snapshot positions, so a fixed
// 64 would cut every prefill into 64-token forwards: on CUDA a fraction of the speed of the chunk the user asked for
// (the expert kernels' tiles nearly empty). The tail snapshot (kTailBack tokens before the end of the last sync)
// keeps a chat turn's re-rendered suffix cheap whatever the interval.
static int64_t snapshot_interval(int chunk) { return std::max<int64_t>(64, chunk / 64 * 64); }
static constexpr int64_t kTailBack = 16;

struct Session::Impl {
  Engine& engine;
  const int64_t interval;  // snapshot_interval(the prefill chunk)
  std::unique_ptr<SequenceState> state;
  Forward fwd;
  std::vector<float> logits;
  bool logits_valid = false;
  // snapshots[i] holds the state after i * interval tokens (index 0 = empty, i.e. reset()).
  std::vector<std::unique_ptr<StateSnapshot>> snapshots;
  // One more snapshot kTailBack tokens before the end of the last synced sequence: a chat turn re-rendered with
  // its reasoning dropped diverges just before the previous generation prompt, so this makes the rollback cheap.
  std::unique_ptr<StateSnapshot> tail;
  int64_t tail_pos = -1;
  // Speculative decoding (Session::draft / append_verify / resolve_draft).
  const bool spec;
  int64_t mtp_next = 0;            // the next position the MTP block runs at (its window ring is filled in order)
  bool pending = false;            // append_verify ran, resolve_draft not yet
  std::vector<float> logits2;      // [2, vocab] of the verify forward; then the logits after the draft
  std::vector<float> mtp_logits;   // the draft's [vocab]
  // Speculation from n tokens: an accepted draft jumps to n + 2, past a snapshot the session must take at n + 1.
  bool pair_skips_snapshot(int64_t n) const { return state->supports_snapshots() && (n + 1) % interval == 0; }
  // Snapshot bookkeeping after a forward that ended at position p (shared by run() and append_batch()).
  void after_chunk(int64_t p, int64_t tail_at) {
    if (!state->supports_snapshots()) return;
    if (p % interval == 0 && static_cast<size_t>(p / interval) == snapshots.size())
      snapshots.push_back(state->snapshot());
    if (p == tail_at && p % interval != 0) {
      tail = state->snapshot();
      tail_pos = p;
    }
  }
  Impl(Engine& e)
      : engine(e),
        interval(snapshot_interval(e.options().prefill_chunk)),
        state(e.model().backend().new_sequence(e.options().max_context)),
        fwd(e.model(), e.options().speculative == "mtp" ? 2 : 1),  // speculation: [next, draft] on the own Forward
        logits(static_cast<size_t>(e.info().vocab_size)),
        spec(e.options().speculative == "mtp") {}
  // The MTP block at positions [from, to) of the chunk `f` just ran (their next tokens known): only the last
  // `window` positions before the end of the sequence matter (the block is sliding-window attention only).
  void mtp_fill(Forward& f, const std::vector<int32_t>& toks, int64_t from, int64_t to) {
    const int64_t keep_from = static_cast<int64_t>(toks.size()) - 1 - engine.model().config().window;
    from = std::max({from, mtp_next, keep_from});
    if (from >= to) return;
    f.forward_mtp(*state, toks.data() + from + 1, static_cast<int>(to - from), from, nullptr);
    mtp_next = to;
  }
};

Session::Session(Engine& e) : impl_(std::make_unique<Impl>(e)) {}
Session::~Session() = default;

int64_t Session::max_context() const { return impl_->state->max_context(); }

const std::vector<float>& Session::logits() const {
  if (!impl_->logits_valid) fail("session has no logits: sync a non-empty token sequence first");
  return impl_->logits;
}

void Session::run(int64_t from) {
  Impl& I = *impl_;
  const int64_t n = static_cast<int64_t>(tokens_.size());
  const int chunk = I.engine.options().prefill_chunk;
  const bool snaps = I.state->supports_snapshots();
  int64_t p = from;
  const int64_t tail_at = n - kTailBack;
  while (p < n) {
    // Chunks end at snapshot boundaries so that snapshots land exactly on multiples of the interval (and on the
    // tail position).
    int64_t next_snap = (p / I.interval + 1) * I.interval;
    if (snaps && tail_at > p && tail_at % I.interval != 0) next_snap = std::min(next_snap, tail_at);
    int64_t end = std::min({n, p + chunk, snaps ? next_snap : n});
    // Speculation: the last token runs alone on the session's own Forward, whose streams the first draft() needs.
    if (I.spec && end == n && n - p > 1) end = n - 1;
    // One token: the session's own Forward (on the GPU its decode step is a recorded graph keyed by that Forward's
    // buffers); more: the engine's shared prefill Forward.
    Forward& fwd = end - p == 1 ? I.fwd : I.engine.prefill_forward();
    fwd.forward(*I.state, tokens_.data() + p, static_cast<int>(end - p), p, end == n ? I.logits.data() : nullptr, true);
    if (I.spec) I.mtp_fill(fwd, tokens_, p, std::min(end, n - 1));
    p = end;
    if (progress_ && n - from > 1) progress_(p - from, n - from);
    I.after_chunk(p, tail_at);
  }
  last_computed_ = n - from;
  I.logits_valid = n > 0;
}

void Session::sync(const std::vector<int32_t>& tokens) {
  Impl& I = *impl_;
  if (I.pending) fail("sync() while a draft token awaits resolve_draft()");
  if (static_cast<int64_t>(tokens.size()) > max_context())
    fail("sequence of ", tokens.size(), " tokens exceeds the session's max context ", max_context());
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= I.engine.info().vocab_size) fail("token id ", tokens[i], " at index ", i, " is out of range");
  size_t common = 0;
  while (common < tokens.size() && common < tokens_.size() && tokens[common] == tokens_[common]) ++common;
  if (common == tokens.size() && common == tokens_.size() && (I.logits_valid || tokens.empty())) {
    last_computed_ = 0;
    return;
  }
  // Keep state for tokens[0..keep); the last token is always recomputed so that its logits exist.
  int64_t keep = static_cast<int64_t>(std::min(common, tokens.empty() ? size_t{0} : tokens.size() - 1));
  if (keep < static_cast<int64_t>(tokens_.size())) {
    // Roll back: restore the latest snapshot at or before `keep` (a regular one or the tail one), or start over.
    int64_t from = 0;
    if (I.state->supports_snapshots() && !I.snapshots.empty()) {
      size_t idx = std::min(static_cast<size_t>(keep / I.interval), I.snapshots.size() - 1);
      from = static_cast<int64_t>(idx) * I.interval;
      if (I.tail && I.tail_pos <= keep && I.tail_pos > from) {
        I.state->restore(*I.tail);
        from = I.tail_pos;
      } else if (idx == 0) {
        I.state->reset();
      } else {
        I.state->restore(*I.snapshots[idx]);
      }
      I.state->set_tokens(from);
      I.snapshots.resize(idx + 1);  // regular snapshots past `from` describe tokens that are going away
    } else {
      I.state->reset();
      I.state->set_tokens(0);
      I.snapshots.clear();
    }
    if (I.tail_pos > from) I.tail.reset(), I.tail_pos = -1;  // describes tokens past the kept prefix
    I.mtp_next = std::min(I.mtp_next, from);
    keep = from;
  }
  if (I.snapshots.empty() && I.state->supports_snapshots()) I.snapshots.push_back(I.state->snapshot());
  tokens_ = tokens;
  I.logits_valid = false;
  run_or_reset(keep);
}

// A failure mid-forward leaves the state inconsistent with tokens_: start the session over rather than keep it.
void Session::run_or_reset(int64_t from) {
  try {
    run(from);
  } catch (...) {
    reset_after_failure();
    throw;
  }
}

void Session::reset_after_failure() {
  impl_->state->reset();
  impl_->state->set_tokens(0);
  impl_->snapshots.clear();
  impl_->tail.reset();
  impl_->tail_pos = -1;
  impl_->logits_valid = false;
  impl_->mtp_next = 0;
  impl_->pending = false;
  tokens_.clear();
}

void Session::check_append(int32_t token) const {
  if (static_cast<int64_t>(tokens_.size()) + 1 > max_context())
    fail("context full: ", tokens_.size() + 1, " tokens exceed the session's max context ", max_context());
  if (token < 0 || token >= impl_->engine.info().vocab_size) fail("token id ", token, " is out of range");
  if (!tokens_.empty() && !impl_->logits_valid) fail("append() after a failed sync");
  if (impl_->pending) fail("append() while a draft token awaits resolve_draft()");
}

void Session::append(int32_t token) {
  check_append(token);
  tokens_.push_back(token);
  run_or_reset(static_cast<int64_t>(tokens_.size()) - 1);
}

bool Session::speculative() const { return impl_->spec; }
bool Session::draft_pending() const { return impl_->pending; }

int32_t Session::draft(int32_t next) {
  Impl& I = *impl_;
  if (!I.spec) return -1;
  check_append(next);
  const int64_t n = static_cast<int64_t>(tokens_.size());
  // The MTP block at position n - 1 reads its main streams, which only the forward that just ran it still holds.
  if (n == 0 || n + 2 > max_context() || !I.fwd.holds_streams(*I.state, n - 1)) return -1;
  if (I.pair_skips_snapshot(n)) return -1;  // a plain step takes that snapshot
  // Positions of the last forward the MTP block has not run yet (a verified pair: both), in order; the last one's
  // next token is `next`.
  int64_t from = n - 1;
  while (from > I.mtp_next && I.fwd.holds_streams(*I.state, from - 1)) --from;
  std::vector<int32_t> next_ids(tokens_.begin() + from + 1, tokens_.end());
  next_ids.push_back(next);
  const size_t V = static_cast<size_t>(I.engine.info().vocab_size);
  I.mtp_logits.resize(V);
  try {
    I.fwd.forward_mtp(*I.state, next_ids.data(), static_cast<int>(n - from), from, I.mtp_logits.data(), true);
  } catch (...) {
    reset_after_failure();  // the MTP block's window may be half-written
    throw;
  }
  I.mtp_next = n;
  return static_cast<int32_t>(std::max_element(I.mtp_logits.begin(), I.mtp_logits.end()) - I.mtp_logits.begin());
}

void Session::append_verify(int32_t next, int32_t draft) {
  Impl& I = *impl_;
  if (!I.spec) fail("append_verify: the engine was not loaded with speculative decoding");
  check_append(next);
  if (draft < 0 || draft >= I.engine.info().vocab_size) fail("draft token id ", draft, " is out of range");
  const int64_t n = static_cast<int64_t>(tokens_.size());
  if (n + 2 > max_context()) fail("context full: ", n + 2, " tokens exceed the session's max context ", max_context());
  if (I.pair_skips_snapshot(n))
    fail("append_verify: position ", n + 1, " is a snapshot position (draft() returns -1 there; append() instead)");
  const size_t V = static_cast<size_t>(I.engine.info().vocab_size);
  I.logits2.resize(2 * V);
  tokens_.push_back(next);
  tokens_.push_back(draft);
  I.logits_valid = false;
  try {
    I.state->prepare_drop_last();
    I.fwd.forward_pair(*I.state, tokens_.data() + n, n, I.logits2.data());
  } catch (...) {
    reset_after_failure();
    throw;
  }
  std::copy(I.logits2.begin(), I.logits2.begin() + static_cast<std::ptrdiff_t>(V), I.logits.begin());
  I.logits2.erase(I.logits2.begin(), I.logits2.begin() + static_cast<std::ptrdiff_t>(V));  // now the draft's
  I.logits_valid = true;
  I.pending = true;
  last_computed_ = 2;
}

void Session::resolve_draft(bool accepted) {
  Impl& I = *impl_;
  if (!I.pending) fail("resolve_draft() without a pending draft (append_verify first)");
  I.pending = false;
  if (accepted) {
    I.logits.swap(I.logits2);
  } else {
    try {
      I.state->drop_last();
    } catch (...) {
      reset_after_failure();
      throw;
    }
    tokens_.pop_back();
    last_computed_ = 1;
  }
  const int64_t n = static_cast<int64_t>(tokens_.size());
  I.after_chunk(n, n - kTailBack);
}

void Session::append_batch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens) {
  if (sessions.size() != tokens.size())
    fail("append_batch: ", sessions.size(), " sessions but ", tokens.size(), " tokens");
  if (sessions.empty()) return;
  Engine& engine = sessions[0]->impl_->engine;
  for (size_t i = 0; i < sessions.size(); ++i) {  // validate everything before touching any session
    if (!sessions[i]) fail("append_batch: session ", i, " is null");
    if (&sessions[i]->impl_->engine != &engine) fail("append_batch: sessions of different engines");
    for (size_t j = 0; j < i; ++j)
      if (sessions[j] == sessions[i]) fail("append_batch: session ", i, " appears twice");
    sessions[i]->check_append(tokens[i]);
  }
  // Sessions share the engine's model; the engine's batch Forward (buffers for prefill_chunk tokens) runs the batch,
  // in groups of at most that many sequences. A group of one is an ordinary decode step of that session's own
  // Forward (on the GPU its recorded decode graph is keyed by the Forward's buffers).
  if (!engine.batch_) engine.batch_ = std::make_unique<Engine::BatchScratch>();
  Engine::BatchScratch& B = *engine.batch_;  // (its prefill Forward is not used here)
  if (!B.fwd) B.fwd = std::make_unique<Forward>(engine.model(), engine.options().prefill_chunk);
  const size_t group = static_cast<size_t>(B.fwd->max_chunk());
  const size_t V = static_cast<size_t>(engine.info().vocab_size);
  const size_t need = std::min(group, sessions.size());
  if (B.ids.size() < need) {
    B.states.resize(need), B.ids.resize(need), B.pos.resize(need);
    B.logits.resize(need * V);
  }
  for (size_t g0 = 0; g0 < sessions.size(); g0 += group) {
    const size_t n = std::min(group, sessions.size() - g0);
    for (size_t i = 0; i < n; ++i) {
      Session& s = *sessions[g0 + i];
      B.states[i] = s.impl_->state.get();
      B.ids[i] = tokens[g0 + i];
      B.pos[i] = static_cast<int64_t>(s.tokens_.size());
      s.tokens_.push_back(tokens[g0 + i]);
      s.impl_->logits_valid = false;
    }
    try {
      Forward& fwd = n == 1 ? sessions[g0]->impl_->fwd : *B.fwd;
      fwd.forward_batch(B.states.data(), B.ids.data(), B.pos.data(), static_cast<int>(n), B.logits.data());
    } catch (...) {
      // Every session of this group may be half-updated: start them over, as a failed append() does. Earlier groups
      // are complete; later ones untouched.
      for (size_t i = 0; i < n; ++i) sessions[g0 + i]->reset_after_failure();
      throw;
    }
    for (size_t i = 0; i < n; ++i) {
      Session& s = *sessions[g0 + i];
      Impl& I = *s.impl_;
      std::copy(B.logits.begin() + static_cast<std::ptrdiff_t>(i * V), B.logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * V),
                I.logits.begin());
      const int64_t n_tok = static_cast<int64_t>(s.tokens_.size());
      I.after_chunk(n_tok, n_tok - kTailBack);  // what run() does after append()'s one-token chunk
      I.logits_valid = true;
      s.last_computed_ = 1;
    }
  }
}

}  // namespace dsv4
