#pragma once
// The scheduler: one thread that owns the model and every Session. HTTP threads submit requests and read their
// events from a RequestHandle; only the scheduler thread touches the engine.
//
// Each loop iteration: admit queued requests into free slots (a slot = one Session; the free slot whose tokens
// share the longest prefix with the prompt is chosen, so follow-up turns and shared system prompts skip prefill),
// drop cancelled requests (their slot is free at once), run ONE batched decode step over every decoding request
// (each samples its next token, then Session::append_batch feeds all of them through one multi-sequence forward:
// the position-free ops run once over all rows, so a step costs one pass over the weights, not one per request),
// then one prefill chunk of one prefilling request (round-robin). Long prompts therefore never stall the streams of
// other requests for more than one chunk. Rows of a batch are independent (bit-identical to running alone on the
// CPU), so a request's output does not depend on what else runs.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dsv4/engine.h"
#include "runtime/generation.h"
#include "server/metrics.h"
#include "text/tokenizer.h"

namespace dsv4::server {

struct SchedulerOptions {
  int max_batch = 4;      // slots
  int max_queue = 64;     // waiting requests beyond the slots; more -> QueueFull
  int prefill_chunk = 256;
};

struct QueueFull : std::runtime_error {
  QueueFull() : std::runtime_error("server overloaded: the request queue is full, retry later") {}
};

// What the scheduler reports for one request, in order: any number of Token events, then exactly one Done/Error.
struct RequestEvent {
  enum class Kind { Token, Done, Error } kind = Kind::Token;
  text::CompletionDelta delta;  // Token: the parsed text this token released (often empty while held back)
  SampledToken sampled{};       // Token: the token and its logprobs
  GenerationResult result;      // Done
  std::string error;            // Error
};

class RequestHandle {
 public:
  // Waits up to `timeout` for the next event; false on timeout.
  bool next(RequestEvent& out, std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this request and free its slot (client gone). Idempotent, any thread.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void push(RequestEvent e);
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  std::atomic<bool> cancelled_{false};
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const text::Tokenizer& tok, SchedulerOptions opts, Metrics* metrics = nullptr);
  ~Scheduler();  // cancels everything still running and joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Throws QueueFull when the queue is at its bound, dsv4::Error on a request the Generation rejects.
  std::shared_ptr<RequestHandle> submit(GenerationRequest req);
  GaugeSnapshot gauges() const;
  int64_t max_context() const { return engine_.options().max_context; }

 private:
  struct Job;
  struct Slot {
    std::unique_ptr<Session> session;  // created on first use (its state is sized up front)
    Job* job = nullptr;                 // written under m_ (gauges() reads it)
    std::atomic<int64_t> held{0};       // tokens the session holds, published for gauges()
    uint64_t last_used = 0;
  };
  void loop();
  void admit();                          // under m_
  void prefill_chunk(Job& j);
  bool sample_step(Job& j);              // false when the job finished
  void decode_batch(const std::vector<Job*>& jobs);
  bool speculate(Job& j);                // one job: a verified [token, MTP draft] pair; false = no draft made
  void finish(Job& j, const char* why);  // emits Done/Error and frees the slot

  Engine& engine_;
  const text::Tokenizer& tok_;
  SchedulerOptions opts_;
  Metrics* metrics_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Job>> active_;
  std::vector<Slot> slots_;
  size_t prefill_rr_ = 0;
  // Per-iteration lists, kept to reuse their storage.
  std::vector<Job*> decoding_, batch_jobs_;
  std::vector<Session*> batch_sessions_;
  std::vector<int32_t> batch_tokens_;
  uint64_t tick_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsv4::server
