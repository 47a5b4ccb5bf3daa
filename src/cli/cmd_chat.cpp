// dsv4 chat: a multi-turn REPL. Each turn re-renders the whole conversation with the official encoder and syncs the
// session to it, so only the new tokens are prefilled (in thinking mode the encoder drops earlier turns' reasoning,
// which changes the prefix: the session then rolls back to the divergence and recomputes from there).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/progress.h"
#include "cli/stream_printer.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "runtime/generation.h"

namespace {

using dsv4::text::PyJson;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

PyJson message(const std::string& role, const std::string& content) {
  return PyJson::object({{"role", PyJson::string(role)}, {"content", PyJson::string(content)}});
}

int cmd_chat(const std::vector<std::string>& args) {
  CLI::App app{"Interactive multi-turn chat (/reset, /system TEXT, /mode chat|thinking, /quit; Ctrl-C stops a reply)",
               "dsv4 chat"};
  dsv4::cli::GenerationFlags f;
  std::string system;
  f.add_to(app);
  app.add_option("--system", system, "system message");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  f.apply_generation_config();
  auto ctx = f.load();
  auto session = ctx.engine->new_session();
  dsv4::cli::ProgressBar prefill_bar("prefill");
  session->set_progress([&](int64_t done, int64_t total) { prefill_bar.update(done, total); });
  const bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C cancels the current generation, not the program

  std::vector<PyJson> history;
  auto reset = [&] {
    history.clear();
    if (!system.empty()) history.push_back(message("system", system));
  };
  reset();
  std::fprintf(stderr, "dsv4 chat (%s mode). /reset, /system TEXT, /mode chat|thinking, /quit\n", f.mode.c_str());
  std::string line;
  while (true) {
    if (tty) std::fputs("\n> ", stdout), std::fflush(stdout);
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt: clear the line and ask again
        std::cin.clear();
        continue;
      }
      break;  // EOF
    }
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      reset();
      std::fprintf(stderr, "[conversation cleared]\n");
      continue;
    }
    if (line.rfind("/system", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : "";
      reset();
      std::fprintf(stderr, "[system message set; conversation cleared]\n");
      continue;
    }
    if (line.rfind("/mode", 0) == 0) {
      std::string m = line.size() > 6 ? line.substr(6) : "";
      if (m != "chat" && m != "thinking") {
        std::fprintf(stderr, "usage: /mode chat|thinking\n");
        continue;
      }
      f.mode = m;
      std::fprintf(stderr, "[%s mode]\n", m.c_str());
      continue;
    }
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command %s\n", line.c_str());
      continue;
    }
    history.push_back(message("user", line));
    PyJson msgs = PyJson::array(history);
    dsv4::GenerationRequest req = f.request();
    try {
      req.prompt_ids = ctx.tokenizer.encode(dsv4::text::encode_chat(msgs, f.chat_options()));
      dsv4::cli::StreamPrinter printer(tty);
      dsv4::GenerationCallbacks cb;
      cb.cancelled = [] { return g_interrupted.load(); };
      cb.on_delta = [&](const dsv4::text::CompletionDelta& d) { printer(d); };
      dsv4::GenerationResult r = dsv4::generate(*session, ctx.tokenizer, req, cb);
      printer.finish();
      PyJson reply = message("assistant", r.parsed.content);
      if (!r.parsed.reasoning_content.empty()) reply.set("reasoning_content", PyJson::string(r.parsed.reasoning_content));
      history.push_back(reply);
      const auto& t = r.timings;
      std::fprintf(stderr, "[%lld prompt tok (%lld prefilled), %lld generated (%s), ttft %.3f s, %.1f tok/s]\n",
                   (long long)t.prompt_tokens, (long long)t.prompt_computed, (long long)t.generated_tokens,
                   r.finish_reason.c_str(), t.ttft_s, t.decode_tok_s());
    } catch (const dsv4::Error& e) {
      history.pop_back();  // the turn did not happen
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("chat", "interactive multi-turn chat with prefix reuse", cmd_chat);
