#include "server/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::server {

using Clock = std::chrono::steady_clock;
static double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Scheduler::Job {
  std::shared_ptr<RequestHandle> handle;
  Generation gen;
  Clock::time_point submitted, last_token;
  int slot = -1;
  int64_t prefilled = 0;  // prompt tokens the slot's session holds so far
  int64_t computed = 0;   // of which actually recomputed
  bool decoding = false;
  bool carry = false;     // its last sampled token is not in the session yet (after a verified draft pair)
  Job(std::shared_ptr<RequestHandle> h, const text::Tokenizer& tok, GenerationRequest req, int64_t ctx)
      : handle(std::move(h)), gen(tok, std::move(req), ctx), submitted(Clock::now()) {}
};

bool RequestHandle::next(RequestEvent& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(m_);
  if (!cv_.wait_for(l, timeout, [&] { return !events_.empty(); })) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestHandle::push(RequestEvent e) {
  {
    std::lock_guard<std::mutex> l(m_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

Scheduler::Scheduler(Engine& engine, const text::Tokenizer& tok, SchedulerOptions opts, Metrics* metrics)
    : engine_(engine), tok_(tok), opts_(opts), metrics_(metrics) {
  if (opts_.max_batch < 1) fail("--max-batch must be >= 1");
  if (opts_.max_queue < 0) fail("--max-queue must be >= 0");
  if (opts_.prefill_chunk < 1) fail("prefill chunk must be >= 1");
  slots_ = std::vector<Slot>(static_cast<size_t>(opts_.max_batch));
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestHandle> Scheduler::submit(GenerationRequest req) {
  auto h = std::make_shared<RequestHandle>();
  auto job = std::make_unique<Job>(h, tok_, std::move(req), max_context());  // validates before queueing
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_) throw QueueFull();
    const size_t free_slots = static_cast<size_t>(opts_.max_batch) - active_.size();
    if (queue_.size() >= free_slots + static_cast<size_t>(opts_.max_queue)) throw QueueFull();
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return h;
}

GaugeSnapshot Scheduler::gauges() const {
  std::lock_guard<std::mutex> l(m_);
  GaugeSnapshot g;
  g.queue_depth = static_cast<int64_t>(queue_.size());
  g.active_requests = static_cast<int64_t>(active_.size());
  g.slots_total = static_cast<int64_t>(slots_.size());
  g.kv_tokens_capacity = g.slots_total * max_context();
  for (const Slot& s : slots_) {
    if (s.job) {
      ++g.slots_busy;
      g.kv_tokens_active += s.held.load();
    } else {
      g.kv_tokens_cached += s.held.load();
    }
  }
  return g;
}

void Scheduler::admit() {
  while (!queue_.empty() && active_.size() < slots_.size()) {
    std::unique_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    if (job->handle->cancelled()) {  // client left while queued: never touches a slot
      RequestEvent e;
      e.kind = RequestEvent::Kind::Error;
      e.error = "cancelled";
      job->handle->push(std::move(e));
      if (metrics_) metrics_->generation_finished("cancelled", 0, 0, 0);
      continue;
    }
    const auto& prompt = job->gen.request().prompt_ids;
    int best = -1;
    size_t best_lcp = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].job) continue;
      size_t lcp = 0;
      if (slots_[i].session) {
        const auto& t = slots_[i].session->tokens();
        while (lcp < t.size() && lcp < prompt.size() && t[lcp] == prompt[lcp]) ++lcp;
      }
      // Longest shared prefix wins; ties go to the least recently used slot (keeps other prefixes around longer).
      if (best < 0 || lcp > best_lcp || (lcp == best_lcp && slots_[i].last_used < slots_[best].last_used)) {
        best = static_cast<int>(i);
        best_lcp = lcp;
      }
    }
    Slot& s = slots_[static_cast<size_t>(best)];
    s.job = job.get();
    s.last_used = ++tick_;
    job->slot = best;
    active_.push_back(std::move(job));
  }
}

void Scheduler::prefill_chunk(Job& j) {
  Slot& s = slots_[static_cast<size_t>(j.slot)];
  if (!s.session) s.session = engine_.new_session();
  const auto& prompt = j.gen.request().prompt_ids;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (j.prefilled == 0) {  // first chunk: start after what the slot already shares with the prompt
    const auto& t = s.session->tokens();
    int64_t lcp = 0;
    while (lcp < static_cast<int64_t>(t.size()) && lcp < n && t[static_cast<size_t>(lcp)] == prompt[static_cast<size_t>(lcp)]) ++lcp;
    j.prefilled = lcp;
  }
  const int64_t target = std::min(n, j.prefilled + opts_.prefill_chunk);
  s.session->sync(std::vector<int32_t>(prompt.begin(), prompt.begin() + target));
  j.computed += s.session->last_computed();
  s.held = static_cast<int64_t>(s.session->tokens().size());
  j.prefilled = target;
  if (target == n) {
    j.gen.prefilled(j.computed);
    j.decoding = true;
    if (j.gen.done()) finish(j, "done");  // max_tokens 0
  }
}

// Samples the next token of a decoding job from its session's logits and streams it. True when the job goes on
// (its token must be appended); false when it has finished.
bool Scheduler::sample_step(Job& j) {
  Session& session = *slots_[static_cast<size_t>(j.slot)].session;
  RequestEvent ev;
  bool ended = j.gen.step(session.logits(), [&](const text::CompletionDelta& d) {
    ev.delta.reasoning += d.reasoning;
    ev.delta.content += d.content;
    ev.delta.tool_calls.insert(ev.delta.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  });
  const auto now = Clock::now();
  const auto& r = j.gen.result();
  if (metrics_) {
    if (r.completion_ids.size() == 1)
      metrics_->observe_ttft(secs(j.submitted, now));
    else
      metrics_->observe_inter_token(secs(j.last_token, now));
  }
  j.last_token = now;
  ev.sampled = r.sampled.back();
  j.handle->push(std::move(ev));
  if (ended) {
    finish(j, "done");
    return false;
  }
  if (static_cast<int64_t>(session.tokens().size()) + 1 > session.max_context()) {  // would fail the whole batch
    finish(j, "context full: the session's max context is reached");
    return false;
  }
  return true;
}

// One decode step of every decoding job: sample each job's token, then append all of them in one batched forward.
void Scheduler::decode_batch(const std::vector<Job*>& jobs) {
  batch_jobs_.clear();
  batch_sessions_.clear();
  batch_tokens_.clear();
  for (Job* j : jobs) {
    try {
      if (!j->carry && !sample_step(*j)) continue;
    } catch (const std::exception& e) {
      finish(*j, e.what());
      continue;
    }
    j->carry = false;
    batch_jobs_.push_back(j);
    batch_sessions_.push_back(slots_[static_cast<size_t>(j->slot)].session.get());
    batch_tokens_.push_back(j->gen.last_token());
  }
  if (batch_jobs_.empty()) return;
  const auto t0 = Clock::now();
  if (batch_jobs_.size() == 1 && speculate(*batch_jobs_[0])) return;
  try {
    Session::append_batch(batch_sessions_, batch_tokens_);
  } catch (const std::exception& e) {
    for (Job* j : batch_jobs_) finish(*j, e.what());
    return;
  }
  if (metrics_) metrics_->observe_decode_batch(static_cast<int64_t>(batch_jobs_.size()), secs(t0, Clock::now()));
  for (Job* j : batch_jobs_) {
    Slot& s = slots_[static_cast<size_t>(j->slot)];
    s.held = static_cast<int64_t>(s.session->tokens().size());
  }
}

// A lone decoding job on a speculative engine: its sampled token and the MTP block's draft after it in ONE forward
// (Session::append_verify); the token after the sampled one is drawn from exactly the logits a plain step gives, and
// when it is the draft, the one after that too. False when no draft was made (the caller appends as usual).
bool Scheduler::speculate(Job& j) {
  Slot& slot = slots_[static_cast<size_t>(j.slot)];
  Session& s = *slot.session;
  const int32_t next = j.gen.last_token();
  // Room for the pair and one more token: sample_step's context check sees the provisional draft.
  if (!s.speculative() || static_cast<int64_t>(s.tokens().size()) + 3 > s.max_context()) return false;
  const auto t0 = Clock::now();
  try {
    const int32_t d = s.draft(next);
    if (d < 0) return false;
    s.append_verify(next, d);
    const bool go = sample_step(j);  // the token after `next` (finishes the job when it ends the generation)
    const bool accepted = go && j.gen.last_token() == d;
    if (go) j.gen.drafted(accepted);
    s.resolve_draft(accepted);
    if (metrics_) metrics_->observe_decode_batch(1, secs(t0, Clock::now()));
    // Dropped: the token sampled instead of the draft goes in next step. Accepted: the one after the draft.
    if (go) j.carry = !accepted || sample_step(j);
  } catch (const std::exception& e) {
    if (s.draft_pending()) s.resolve_draft(false);
    if (j.slot >= 0) finish(j, e.what());
  }
  slot.held = static_cast<int64_t>(s.tokens().size());
  return true;
}

void Scheduler::finish(Job& j, const char* why) {
  RequestEvent e;
  const std::string w = why;
  if (w == "done" || w == "cancelled") {
    e.kind = RequestEvent::Kind::Done;
    e.result = j.gen.result();
    if (metrics_) {
      const auto& t = e.result.timings;
      metrics_->generation_finished(e.result.finish_reason, t.prompt_tokens, t.prompt_tokens - t.prompt_computed,
                                    t.generated_tokens);
    }
  } else {
    e.kind = RequestEvent::Kind::Error;
    e.error = w;
    if (metrics_) metrics_->generation_finished("error", j.gen.request().prompt_ids.size(), 0, 0);
  }
  {
    // Free the slot before the client hears "done", so a client that sees the end never sees its slot busy.
    std::lock_guard<std::mutex> l(m_);
    Slot& s = slots_[static_cast<size_t>(j.slot)];
    if (s.session) s.held = static_cast<int64_t>(s.session->tokens().size());
    s.job = nullptr;
    j.slot = -1;
  }
  j.handle->push(std::move(e));
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty() || !active_.empty(); });
      if (stop_) {
        for (auto& j : active_) j->handle->cancel();
        for (auto& j : queue_) j->handle->cancel();
        l.unlock();
        for (auto& j : active_) {
          j->gen.cancel(nullptr);
          finish(*j, "cancelled");
        }
        std::lock_guard<std::mutex> l2(m_);
        for (auto& j : queue_) {
          RequestEvent e;
          e.kind = RequestEvent::Kind::Error;
          e.error = "server shutting down";
          j->handle->push(std::move(e));
        }
        active_.clear();
        queue_.clear();
        return;
      }
      admit();
    }
    // Jobs are only added/removed by this thread (admit runs here), so iterating without the lock is safe; the lock
    // only guards the containers against gauges() readers when we erase.
    // Cancellations first (their slots free at once), then one batched decode step of every decoding request.
    std::vector<Job*>& decoding = decoding_;
    decoding.clear();
    for (auto& jp : active_) {
      Job& j = *jp;
      if (j.slot < 0) continue;
      if (j.handle->cancelled()) {
        j.gen.cancel(nullptr);
        finish(j, "cancelled");
      } else if (j.decoding) {
        decoding.push_back(&j);
      }
    }
    if (!decoding.empty()) decode_batch(decoding);
    std::vector<Job*> prefilling;
    for (auto& jp : active_)
      if (jp->slot >= 0 && !jp->decoding) prefilling.push_back(jp.get());
    if (!prefilling.empty()) {
      Job& j = *prefilling[prefill_rr_++ % prefilling.size()];
      try {
        prefill_chunk(j);
      } catch (const std::exception& e) {
        finish(j, e.what());
      }
    }
    std::lock_guard<std::mutex> l(m_);
    active_.erase(std::remove_if(active_.begin(), active_.end(), [](const auto& j) { return j->slot < 0; }),
                  active_.end());
  }
}

}  // namespace dsv4::server
