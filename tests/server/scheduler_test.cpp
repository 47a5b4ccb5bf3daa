// The scheduler on a tiny random model: interleaved requests give exactly what each gives alone, cancellation frees
// the slot at once, the queue bound holds, prefixes are reused across requests.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "model/tiny_model.h"
#include "server/scheduler.h"

namespace dsv4::server {
namespace {

struct Fixture {
  std::unique_ptr<Engine> engine;
  text::Tokenizer tok;
};

Fixture& fx() {
  static Fixture* f = [] {
    // One directory per process: CTest runs these tests as parallel processes, which must not race on the files.
    std::string dir = std::string(DSV4_BINARY_DIR) + "/test_server_tiny_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    TinySpec spec;
    spec.seed = 21;
    spec.layers = 2;
    write_tiny_model(dir, spec);
    EngineOptions o;
    o.model_dir = dir;
    o.max_context = 256;
    auto* f = new Fixture{Engine::load(o), text::Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/models/default/tokenizer.json")};
    std::filesystem::remove_all(dir);  // the weights stay mapped; nothing is left behind in the build tree
    return f;
  }();
  return *f;
}

GenerationRequest request(int i, int max_tokens = 6) {
  GenerationRequest r;
  r.prompt_ids = fx().tok.encode("prompt number " + std::to_string(i) + std::string(static_cast<size_t>(i) * 3, 'x'));
  r.mode = text::ThinkingMode::kChat;
  r.max_tokens = max_tokens;
  r.sampling.seed = 100 + static_cast<uint64_t>(i);
  return r;
}

GenerationResult wait_done(RequestHandle& h, std::string* streamed = nullptr) {
  RequestEvent e;
  for (;;) {
    EXPECT_TRUE(h.next(e, std::chrono::seconds(60)));
    if (e.kind == RequestEvent::Kind::Token && streamed) *streamed += e.delta.content;
    if (e.kind == RequestEvent::Kind::Done) return e.result;
    if (e.kind == RequestEvent::Kind::Error) {
      ADD_FAILURE() << e.error;
      return {};
    }
  }
}

TEST(Scheduler, InterleavedEqualsAlone) {
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 5; ++i) {
    auto s = fx().engine->new_session();
    alone.push_back(generate(*s, fx().tok, request(i)));
  }
  Metrics metrics;
  Scheduler sched(*fx().engine, fx().tok, SchedulerOptions{2, 8, 4}, &metrics);  // 2 slots, 4-token prefill chunks
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 5; ++i) hs.push_back(sched.submit(request(i)));
  for (int i = 0; i < 5; ++i) {
    std::string streamed;
    GenerationResult r = wait_done(*hs[static_cast<size_t>(i)], &streamed);
    EXPECT_EQ(r.completion_ids, alone[static_cast<size_t>(i)].completion_ids) << "request " << i;
    EXPECT_EQ(streamed, r.parsed.content);
  }
  GaugeSnapshot g = sched.gauges();
  EXPECT_EQ(g.slots_busy, 0);
  EXPECT_EQ(g.queue_depth, 0);
  EXPECT_EQ(g.slots_total, 2);
  EXPECT_GT(g.kv_tokens_cached, 0);
  EXPECT_NE(metrics.render().find("dsv4_generations_total{finish_reason=\"length\"} 5"), std::string::npos);
}

double metric(const std::string& text, const std::string& name) {
  size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "metric " << name << " missing";
    return -1;
  }
  return std::stod(text.substr(at + name.size() + 2));
}

// Decoding requests share one batched forward per step, and each still gets exactly its output alone.
TEST(Scheduler, DecodeStepsAreBatched) {
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 4; ++i) {
    auto s = fx().engine->new_session();
    alone.push_back(generate(*s, fx().tok, request(i, 12)));
  }
  Metrics metrics;
  Scheduler sched(*fx().engine, fx().tok, SchedulerOptions{4, 8, 256}, &metrics);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(sched.submit(request(i, 12)));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(wait_done(*hs[static_cast<size_t>(i)]).completion_ids, alone[static_cast<size_t>(i)].completion_ids);
  const std::string m = metrics.render();
  const double steps = metric(m, "dsv4_decode_batch_size_count"), rows = metric(m, "dsv4_decode_batch_size_sum");
  const double single = metric(m, "dsv4_decode_batch_size_bucket{le=\"1\"}");
  // Every sampled token but each request's last is appended; one prefill per iteration makes only the first few
  // steps smaller than 4 rows.
  double want_rows = 0;
  for (const auto& r : alone) want_rows += static_cast<double>(r.completion_ids.size()) - 1;
  EXPECT_EQ(rows, want_rows);
  EXPECT_LT(steps, 20) << "decode steps were not batched";
  EXPECT_LT(single, steps);
}

// A speculative engine (EngineOptions::speculative = "mtp"): a lone decoding request verifies [token, MTP draft]
// pairs, requests decoding together are batched as usual, and every output is the plain engine's.
TEST(Scheduler, SpeculativeEngineGivesThePlainOutputs) {
  std::string dir = std::string(DSV4_BINARY_DIR) + "/test_server_spec_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TinySpec spec;
  spec.seed = 21;
  spec.layers = 2;
  write_tiny_model(dir, spec);  // the fixture's model, loaded a second time with speculation
  EngineOptions o;
  o.model_dir = dir;
  o.max_context = 256;
  o.speculative = "mtp";
  auto engine = Engine::load(o);
  std::filesystem::remove_all(dir);
  std::vector<GenerationResult> alone;
  for (int i = 0; i < 3; ++i) {
    auto s = fx().engine->new_session();
    alone.push_back(generate(*s, fx().tok, request(i, 20)));
  }
  {  // one request at a time: every decode step can speculate
    Scheduler sched(*engine, fx().tok, SchedulerOptions{1, 8, 256}, nullptr);
    for (int i = 0; i < 3; ++i) {
      GenerationResult r = wait_done(*sched.submit(request(i, 20)));
      EXPECT_EQ(r.completion_ids, alone[static_cast<size_t>(i)].completion_ids) << "request " << i;
      EXPECT_GT(r.timings.draft_tokens, 5) << "request " << i;
    }
  }
  {  // three at once: batched steps, speculation only where one request is left decoding
    Scheduler sched(*engine, fx().tok, SchedulerOptions{3, 8, 256}, nullptr);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 3; ++i) hs.push_back(sched.submit(request(i, 20)));
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(wait_done(*hs[static_cast<size_t>(i)]).completion_ids, alone[static_cast<size_t>(i)].completion_ids);
  }
}

TEST(Scheduler, CancelFreesSlotAndQueueBound) {
  Scheduler sched(*fx().engine, fx().tok, SchedulerOptions{1, 1, 64});
  auto a = sched.submit(request(1, 200));
  auto b = sched.submit(request(2, 2));
  EXPECT_THROW(sched.submit(request(3, 2)), QueueFull);  // 1 slot + 1 queued
  RequestEvent e;
  ASSERT_TRUE(a->next(e, std::chrono::seconds(60)));  // a is decoding
  a->cancel();
  GenerationResult ra = wait_done(*a);
  EXPECT_EQ(ra.finish_reason, "cancelled");
  EXPECT_LT(ra.completion_ids.size(), 200u);
  EXPECT_EQ(wait_done(*b).finish_reason, "length");  // b got the freed slot
  EXPECT_EQ(sched.gauges().slots_busy, 0);
}

TEST(Scheduler, PrefixReuseAcrossRequests) {
  Scheduler sched(*fx().engine, fx().tok, SchedulerOptions{2, 4, 256});
  GenerationRequest r = request(0, 2);
  for (int i = 0; i < 100; ++i) r.prompt_ids.push_back(1000 + i);  // > one 64-token snapshot interval
  GenerationResult first = wait_done(*sched.submit(r));
  GenerationRequest follow = r;
  follow.prompt_ids.push_back(7);
  GenerationResult second = wait_done(*sched.submit(follow));
  EXPECT_EQ(first.timings.prompt_computed, static_cast<int64_t>(r.prompt_ids.size()));
  EXPECT_LT(second.timings.prompt_computed, 64);  // resumed from the slot's snapshot, not from scratch
}

TEST(Scheduler, InvalidRequestRejectedAtSubmit) {
  Scheduler sched(*fx().engine, fx().tok, SchedulerOptions{1, 1, 64});
  GenerationRequest r = request(0);
  r.prompt_ids.assign(300, 5);  // > max_context 256
  EXPECT_THROW(sched.submit(r), Error);
  r.prompt_ids.clear();
  EXPECT_THROW(sched.submit(r), Error);
}

}  // namespace
}  // namespace dsv4::server
