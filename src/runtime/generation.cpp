#include "runtime/generation.h"

#include <chrono>

#include "core/error.h"
#include "text/chat_tokens.h"
#include "text/stream_detokenizer.h"

namespace dsv4 {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Holds back the tail of the streamed content that could still begin a stop string, so a stop string never leaks
// into a client's stream; reports the first full match.
class StopFilter {
 public:
  explicit StopFilter(const std::vector<std::string>& stops) : stops_(stops) {}
  // Returns content that is safe to emit; sets `hit` when a stop string completed (content is cut before it).
  std::string push(const std::string& s, bool& hit) {
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
  std::string flush() {
    std::string out;
    out.swap(pending_);
    emitted_ += out;
    return out;
  }
  const std::string& emitted() const { return emitted_; }

 private:
  const std::vector<std::string>& stops_;
  std::string pending_, emitted_;
};

}  // namespace

GenerationResult generate(Session& session, const text::Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb) {
  if (req.prompt_ids.empty()) fail("empty prompt");
  if (req.max_tokens < 0) fail("max_tokens must be >= 0");
  const int64_t room = session.max_context() - static_cast<int64_t>(req.prompt_ids.size());
  if (room < 0) fail("prompt of ", req.prompt_ids.size(), " tokens exceeds the max context ", session.max_context());
  GenerationResult r;
  r.timings.prompt_tokens = static_cast<int64_t>(req.prompt_ids.size());
  const int eos = 1;  // <｜end▁of▁sentence｜> (config eos_token_id; the tokenizer agrees)
  const auto t0 = Clock::now();
  session.sync(req.prompt_ids);
  r.timings.prompt_computed = session.last_computed();
  const auto t_prefill = Clock::now();
  r.timings.prefill_s = secs(t0, t_prefill);

  Sampler sampler(req.sampling);
  text::StreamDetokenizer detok(tok);
  text::CompletionParser parser(req.mode);
  StopFilter stop(req.stop);
  bool stop_hit = false;
  auto deliver = [&](text::CompletionDelta d) {
    if (!d.content.empty() && !stop_hit) d.content = stop.push(d.content, stop_hit);
    else if (stop_hit) d.content.clear();
    if (cb.on_delta && (!d.reasoning.empty() || !d.content.empty() || !d.tool_calls.empty())) cb.on_delta(d);
  };
  std::vector<int32_t> generated;
  const int64_t limit = std::min<int64_t>(req.max_tokens, room);
  std::string finish = "length";
  Clock::time_point t_first{};
  while (static_cast<int64_t>(generated.size()) < limit) {
    if (cb.cancelled && cb.cancelled()) {
      finish = "cancelled";
      break;
    }
    SampledToken st = sampler.sample(session.logits(), generated);
    generated.push_back(st.token);
    r.sampled.push_back(st);
    if (generated.size() == 1) {
      t_first = Clock::now();
      r.timings.ttft_s = secs(t0, t_first);
    }
    if (st.token == eos) {
      deliver(parser.feed(detok.finish() + std::string(text::chat::kEos)));
      finish = "stop";
      break;
    }
    std::string piece = detok.push(st.token);
    r.text += piece;
    deliver(parser.feed(piece));
    if (stop_hit) {
      finish = "stop";
      break;
    }
    if (static_cast<int64_t>(generated.size()) < limit) session.append(st.token);
  }
  if (!stop_hit) {
    std::string tail = detok.finish();
    r.text += tail;
    if (!tail.empty()) deliver(parser.feed(tail));
    deliver(parser.finish());
    if (!stop_hit) {
      text::CompletionDelta d;
      d.content = stop.flush();
      if (cb.on_delta && !d.content.empty()) cb.on_delta(d);
    } else {
      finish = "stop";
    }
  }
  r.completion_ids = generated;
  r.parsed = parser.result();
  if (r.parsed.reasoning_moved_to_content) {
    // EOS inside reasoning: the parser re-labelled the whole reasoning as the answer; apply stop strings to it.
    for (const auto& s : req.stop)
      if (!s.empty()) {
        size_t at = r.parsed.content.find(s);
        if (at != std::string::npos) r.parsed.content.resize(at);
      }
  } else {
    r.parsed.content = stop.emitted();  // content as streamed: cut at the stop string
  }
  r.finish_reason = finish;
  r.timings.generated_tokens = static_cast<int64_t>(generated.size());
  if (generated.size() > 1) r.timings.decode_s = secs(t_first, Clock::now());
  return r;
}

}  // namespace dsv4
