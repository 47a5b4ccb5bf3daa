#include "runtime/generation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "text/chat_tokens.h"

namespace dsv4 {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

constexpr int32_t kEosId = 1;  // <｜end▁of▁sentence｜> (config eos_token_id; the tokenizer agrees)

// log p(token) under the unmodified distribution, for forced tokens (the sampler reports it for sampled ones).
float token_logprob(const std::vector<float>& logits, int32_t token) {
  float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  return static_cast<float>(logits[static_cast<size_t>(token)] - mx - std::log(sum));
}

}  // namespace

std::string StopFilter::push(const std::string& s, bool& hit) {
  pending_ += s;
  size_t best = std::string::npos;
  for (const auto& st : stops_)
    if (!st.empty()) best = std::min(best, pending_.find(st));
  if (best != std::string::npos) {
    hit = true;
    std::string out = pending_.substr(0, best);
    emitted_ += out;
    pending_.clear();
    return out;
  }
  size_t keep = 0;  // longest suffix of pending_ that is a proper prefix of some stop string
  for (const auto& st : stops_)
    for (size_t k = std::min(st.size() - (st.empty() ? 0 : 1), pending_.size()); k > keep; --k)
      if (pending_.compare(pending_.size() - k, k, st, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  emitted_ += out;
  return out;
}

std::string StopFilter::flush() {
  std::string out;
  out.swap(pending_);
  emitted_ += out;
  return out;
}

Generation::Generation(const text::Tokenizer& tok, GenerationRequest req, int64_t max_context)
    : tok_(tok),
      req_(std::move(req)),
      sampler_(req_.sampling),
      detok_(tok),
      parser_(req_.mode),
      stop_(req_.stop),
      forced_(req_.forced),
      t0_(Clock::now()) {
  if (req_.prompt_ids.empty()) fail("empty prompt");
  if (req_.max_tokens < 0) fail("max_tokens must be >= 0");
  const int64_t room = max_context - static_cast<int64_t>(req_.prompt_ids.size());
  if (room < 0) fail("prompt of ", req_.prompt_ids.size(), " tokens exceeds the max context ", max_context);
  limit_ = std::min<int64_t>(req_.max_tokens, room);
  for (int32_t t : forced_)
    if (t < 0 || t >= tok.vocab_size()) fail("forced token ", t, " is out of range");
  if (auto id = tok.find_token("</think>")) think_end_ = *id;
  r_.timings.prompt_tokens = static_cast<int64_t>(req_.prompt_ids.size());
}

void Generation::prefilled(int64_t computed) {
  t_prefill_ = Clock::now();
  r_.timings.prompt_computed = computed;
  r_.timings.prefill_s = secs(t0_, t_prefill_);
  if (limit_ == 0) end("length", nullptr);
}

void Generation::deliver(text::CompletionDelta d, const DeltaFn& on_delta) {
  if (!d.content.empty() && !stop_hit_)
    d.content = stop_.push(d.content, stop_hit_);
  else if (stop_hit_)
    d.content.clear();
  if (on_delta && (!d.reasoning.empty() || !d.content.empty() || !d.tool_calls.empty())) on_delta(d);
}

bool Generation::step(const std::vector<float>& logits, const DeltaFn& on_delta) {
  if (done_) fail("step() on a finished generation");
  SampledToken st;
  if (forced_pos_ < forced_.size()) {
    st.token = forced_[forced_pos_++];
    st.logprob = token_logprob(logits, st.token);
  } else {
    st = sampler_.sample(logits, r_.completion_ids);
  }
  r_.completion_ids.push_back(st.token);
  r_.sampled.push_back(std::move(st));
  const int32_t token = r_.completion_ids.back();
  if (r_.completion_ids.size() == 1) {
    t_first_ = Clock::now();
    r_.timings.ttft_s = secs(t0_, t_first_);
  }
  if (token == kEosId) {
    std::string tail = detok_.finish();
    r_.text += tail;
    deliver(req_.parse ? parser_.feed(tail + std::string(text::chat::kEos)) : text::CompletionDelta{{}, tail, {}},
            on_delta);
    end("stop", on_delta);
    return true;
  }
  if (token == think_end_ && req_.mode == text::ThinkingMode::kThinking && !req_.forced_after_think.empty()) {
    // Splice the forced continuation in right after </think>; later forced tokens (if any) follow it.
    forced_.insert(forced_.begin() + static_cast<std::ptrdiff_t>(forced_pos_), req_.forced_after_think.begin(),
                   req_.forced_after_think.end());
    req_.forced_after_think.clear();
  }
  std::string piece = detok_.push(token);
  r_.text += piece;
  deliver(req_.parse ? parser_.feed(piece) : text::CompletionDelta{{}, piece, {}}, on_delta);
  if (stop_hit_) {
    end("stop", on_delta);
    return true;
  }
  if (static_cast<int64_t>(r_.completion_ids.size()) >= limit_) {
    end("length", on_delta);
    return true;
  }
  return false;
}

void Generation::cancel(const DeltaFn& on_delta) {
  if (!done_) end("cancelled", on_delta);
}

void Generation::end(const std::string& finish, const DeltaFn& on_delta) {
  std::string reason = finish;
  if (!stop_hit_) {
    std::string tail = detok_.finish();
    r_.text += tail;
    if (!tail.empty()) deliver(req_.parse ? parser_.feed(tail) : text::CompletionDelta{{}, tail, {}}, on_delta);
    if (req_.parse) deliver(parser_.finish(), on_delta);
    if (!stop_hit_) {
      text::CompletionDelta d;
      d.content = stop_.flush();
      if (on_delta && !d.content.empty()) on_delta(d);
    } else {
      reason = "stop";
    }
  }
  if (req_.parse) {
    r_.parsed = parser_.result();
  } else {
    r_.parsed = text::ParsedCompletion{};
    r_.parsed.saw_eos = !r_.completion_ids.empty() && r_.completion_ids.back() == kEosId;
  }
  if (r_.parsed.reasoning_moved_to_content) {
    // EOS inside reasoning: the parser re-labelled the whole reasoning as the answer; apply stop strings to it.
    for (const auto& s : req_.stop)
      if (!s.empty()) {
        size_t at = r_.parsed.content.find(s);
        if (at != std::string::npos) r_.parsed.content.resize(at);
      }
  } else {
    r_.parsed.content = stop_.emitted();  // content as streamed: cut at the stop string
  }
  r_.finish_reason = reason;
  r_.timings.generated_tokens = static_cast<int64_t>(r_.completion_ids.size());
  if (r_.completion_ids.size() > 1) r_.timings.decode_s = secs(t_first_, Clock::now());
  done_ = true;
}

GenerationResult generate(Session& session, const text::Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb) {
  Generation g(tok, req, session.max_context());
  session.sync(req.prompt_ids);
  g.prefilled(session.last_computed());
  auto cancelled = [&] {
    if (!cb.cancelled || !cb.cancelled()) return false;
    g.cancel(cb.on_delta);
    return true;
  };
  if (cancelled() || g.step(session.logits(), cb.on_delta)) return g.result();
  // `next`: sampled, not yet in the session. With speculation, one forward of [next, draft] gives the logits after
  // `next` (the next step() draws from exactly those, as plain decoding would) and, when that draw IS the draft, the
  // logits after it too: two tokens for one forward.
  int32_t next = g.last_token();
  while (!cancelled()) {
    const int32_t d = session.draft(next);
    if (d < 0) {
      session.append(next);
      if (g.step(session.logits(), cb.on_delta)) break;
      next = g.last_token();
      continue;
    }
    session.append_verify(next, d);
    if (g.step(session.logits(), cb.on_delta)) {
      session.resolve_draft(false);
      break;
    }
    const bool accepted = g.last_token() == d;
    g.drafted(accepted);
    session.resolve_draft(accepted);
    if (!accepted) {
      next = g.last_token();
      continue;
    }
    if (cancelled() || g.step(session.logits(), cb.on_delta)) break;
    next = g.last_token();
  }
  return g.result();
}

}  // namespace dsv4
