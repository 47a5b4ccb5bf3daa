// dsv4 parse --mode thinking|chat (--text TEXT | --text-file FILE) -> {"reasoning_content": ..., "content": ...,
// "tool_calls": [{"name": ..., "arguments": "<json string>"}]} (issue 4 contract). The text is the generated
// completion after the prompt, special tokens visible (EOS included when generation stopped on it).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/text_cli_util.h"
#include "core/error.h"
#include "text/completion_parser.h"
#include "text/py_json.h"
#include "text/utf8.h"

namespace {

using dsv4::text::PyJson;

int cmd_parse(const std::vector<std::string>& args) {
  CLI::App app{"Parse a DeepSeek-V4 completion into reasoning, content and tool calls (tolerant)", "dsv4 parse"};
  std::string mode, text, text_file;
  app.add_option("--mode", mode, "thinking or chat (the mode the prompt was rendered in)")
      ->required()
      ->check(CLI::IsMember({"thinking", "chat"}));
  auto* o_text = app.add_option("--text", text, "completion text");
  auto* o_file = app.add_option("--text-file", text_file, "file holding the completion text");
  o_text->excludes(o_file);
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (!*o_text && !*o_file) {
    std::fprintf(stderr, "dsv4 parse: --text or --text-file is required\n");
    return 2;
  }
  if (*o_file) text = dsv4::cli::read_file_bytes(text_file);
  if (const auto bad = dsv4::text::find_invalid_utf8(text); bad != std::string::npos)
    dsv4::fail("completion text is not valid UTF-8 (byte ", bad, ")");
  const auto r = dsv4::text::parse_completion(
      text, mode == "thinking" ? dsv4::text::ThinkingMode::kThinking : dsv4::text::ThinkingMode::kChat);
  PyJson calls = PyJson::array();
  for (const auto& c : r.tool_calls)
    calls.items().push_back(PyJson::object({{"name", PyJson::string(c.name)}, {"arguments", PyJson::string(c.arguments)}}));
  const PyJson out = PyJson::object({{"reasoning_content", PyJson::string(r.reasoning_content)},
                                     {"content", PyJson::string(r.content)},
                                     {"tool_calls", std::move(calls)}});
  dsv4::cli::write_stdout(dsv4::text::py_json_dumps(out) + "\n");
  for (const auto& w : r.warnings) std::fprintf(stderr, "dsv4 parse: note: %s\n", w.c_str());
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("parse", "completion text -> reasoning / content / tool calls JSON", cmd_parse);
