// dsv4 serve: the OpenAI-compatible HTTP server (docs/SERVER.md).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <pthread.h>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "dsv4/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "text/tokenizer.h"

namespace {

int cmd_serve(const std::vector<std::string>& args) {
  CLI::App app{"OpenAI-compatible HTTP server (chat completions, completions, models, health, metrics)", "dsv4 serve"};
  std::string model, backend = "cpu", numerics = "reference", speculative = "none";
  int64_t max_context = 4096;
  int tp = 1;
  dsv4::server::SchedulerOptions so;
  dsv4::server::ServerOptions ho;
  app.add_option("--model", model, "model directory (config.json, safetensors, tokenizer.json)")->required();
  app.add_option("--host", ho.host, "address to bind (default 127.0.0.1: loopback only)");
  app.add_option("--port", ho.port, "TCP port (0 = any free port, printed on start)")->check(CLI::Range(0, 65535));
  app.add_option("--backend", backend, "cpu|cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--numerics", numerics, "reference|official")->check(CLI::IsMember({"reference", "official"}));
  app.add_option("--tp", tp, "tensor-parallel GPUs for --backend cuda (1, 2, 4, 8)")->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--max-context", max_context, "tokens of state per slot (sized up front)")->check(CLI::PositiveNumber);
  app.add_option("--max-batch", so.max_batch, "concurrent requests (slots, one session each)")->check(CLI::Range(1, 1024));
  app.add_option("--max-queue", so.max_queue, "requests waiting for a slot before 429")->check(CLI::Range(0, 100000));
  auto* chunk_opt = app.add_option("--prefill-chunk", so.prefill_chunk,
                                   "prompt tokens per scheduling step, one forward pass (default: 2048 on CUDA, 256 on the CPU)")
                        ->check(CLI::PositiveNumber);
  app.add_option("--speculative", speculative,
                 "none|mtp: a lone decoding request drafts one token per step with the MTP block (same output)")
      ->check(CLI::IsMember({"none", "mtp"}));
  app.add_option("--api-key", ho.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  app.add_option("--served-model-name", ho.served_model_name, "model id reported by /v1/models and accepted in requests");
  // Test hook (docs/SERVER.md): lets a request script its completion text; hidden from --help on purpose.
  app.add_flag("--enable-test-hooks", ho.test_hooks)->group("");
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Signals are taken by one thread with sigwait (stop() is not async-signal-safe); SIGPIPE must never kill us.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // CUDA: a larger step prefills faster (more tokens per expert in the prefill kernels) but stalls the other streams
  // for longer; 2048 is a middle ground (a 43-layer Flash step of 2,048 tokens: roughly half a second at the 4-5 K
  // tok/s measured on 2 H200s, docs/BENCHMARKS.md).
  if (chunk_opt->count() == 0 && backend == "cuda") so.prefill_chunk = 2048;
  dsv4::EngineOptions eo;
  eo.model_dir = model;
  eo.backend = backend;
  eo.numerics = numerics;
  eo.tp = tp;
  eo.max_context = max_context;
  eo.prefill_chunk = so.prefill_chunk;  // a scheduling step's prompt tokens run as one forward
  eo.speculative = speculative;
  auto engine = dsv4::Engine::load(eo);
  auto tok = dsv4::text::Tokenizer::from_file(model + "/tokenizer.json");
  if (tok.vocab_size() > engine->info().vocab_size)
    dsv4::fail(model, "/tokenizer.json has ", tok.vocab_size(), " ids but the model's vocabulary is ",
               engine->info().vocab_size);
  dsv4::server::Metrics metrics;
  dsv4::server::Scheduler sched(*engine, tok, so, &metrics);
  metrics.set_gauges([&sched] { return sched.gauges(); });
  ho.http_threads = std::max(16, so.max_batch + so.max_queue + 8);  // a waiting request holds a connection thread
  dsv4::server::HttpServer http(sched, tok, metrics, ho);
  const int port = http.bind();
  std::fprintf(stderr, "[dsv4 serve] listening on http://%s:%d (model %s as '%s', backend %s, %d slots x %lld tokens%s)\n",
               ho.host.c_str(), port, model.c_str(), ho.served_model_name.c_str(), backend.c_str(), so.max_batch,
               (long long)max_context, ho.test_hooks ? ", TEST HOOKS ENABLED" : "");
  std::fflush(stderr);
  std::thread waiter([&http, set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "[dsv4 serve] signal %d: shutting down\n", sig);
    http.stop();
  });
  http.run();
  pthread_kill(waiter.native_handle(), SIGTERM);  // if run() ended on its own, release the waiter
  waiter.join();
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("serve", "OpenAI-compatible HTTP server", cmd_serve);
