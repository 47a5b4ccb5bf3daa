// dsv4 run: one prompt -> one streamed answer (issue 5 contract), or one JSON object with --output-format json.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/progress.h"
#include "cli/stream_printer.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "runtime/generation.h"
#include "text/chat_encoder.h"
#include "text/tokenizer.h"

namespace {

using nlohmann::json;

int cmd_run(const std::vector<std::string>& args) {
  CLI::App app{"Run one prompt through the model (official chat encoding) and stream the answer", "dsv4 run"};
  dsv4::cli::GenerationFlags f;
  std::string prompt, system, output_format = "text";
  f.add_to(app);
  app.add_option("--prompt", prompt, "the user message")->required();
  app.add_option("--system", system, "system message");
  app.add_option("--output-format", output_format, "text|json")->check(CLI::IsMember({"text", "json"}));
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  f.apply_generation_config();
  auto ctx = f.load();
  dsv4::text::PyJson msgs = dsv4::text::PyJson::array();
  if (!system.empty())
    msgs.items().push_back(dsv4::text::PyJson::object(
        {{"role", dsv4::text::PyJson::string("system")}, {"content", dsv4::text::PyJson::string(system)}}));
  msgs.items().push_back(dsv4::text::PyJson::object(
      {{"role", dsv4::text::PyJson::string("user")}, {"content", dsv4::text::PyJson::string(prompt)}}));
  dsv4::GenerationRequest req = f.request();
  req.prompt_ids = ctx.tokenizer.encode(dsv4::text::encode_chat(msgs, f.chat_options()));
  auto session = ctx.engine->new_session();
  dsv4::cli::ProgressBar prefill_bar("prefill");
  session->set_progress([&](int64_t done, int64_t total) { prefill_bar.update(done, total); });

  const bool json_out = output_format == "json";
  dsv4::cli::StreamPrinter printer(isatty(STDOUT_FILENO));
  dsv4::GenerationCallbacks cb;
  if (!json_out) cb.on_delta = [&](const dsv4::text::CompletionDelta& d) { printer(d); };
  dsv4::GenerationResult r = dsv4::generate(*session, ctx.tokenizer, req, cb);
  const auto& t = r.timings;
  if (json_out) {
    json tools = json::array();
    for (const auto& tc : r.parsed.tool_calls) tools.push_back({{"name", tc.name}, {"arguments", tc.arguments}});
    json o = {{"prompt_ids", req.prompt_ids},
              {"completion_ids", r.completion_ids},
              {"text", r.text},
              {"reasoning_content", r.parsed.reasoning_content},
              {"content", r.parsed.content},
              {"tool_calls", tools},
              {"finish_reason", r.finish_reason},
              {"timings", {{"prompt_tokens", t.prompt_tokens}, {"generated_tokens", t.generated_tokens},
                           {"ttft_s", t.ttft_s}, {"prefill_s", t.prefill_s}, {"decode_s", t.decode_s},
                           {"prefill_tok_s", t.prefill_tok_s()}, {"decode_tok_s", t.decode_tok_s()},
                           {"draft_tokens", t.draft_tokens}, {"accepted_drafts", t.accepted_drafts}}}};
    std::printf("%s\n", o.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    printer.finish();
  }
  std::fprintf(stderr, "[dsv4] prompt %lld tok, generated %lld tok (%s), ttft %.3f s, prefill %.1f tok/s, decode %.1f tok/s\n",
               (long long)t.prompt_tokens, (long long)t.generated_tokens, r.finish_reason.c_str(), t.ttft_s,
               t.prefill_tok_s(), t.decode_tok_s());
  if (t.draft_tokens > 0)
    std::fprintf(stderr, "[dsv4] speculative: %lld of %lld draft tokens accepted (%.1f %%)\n", (long long)t.accepted_drafts,
                 (long long)t.draft_tokens, 100.0 * static_cast<double>(t.accepted_drafts) / static_cast<double>(t.draft_tokens));
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("run", "one prompt, streamed answer (or --output-format json)", cmd_run);
