// dsv4 render --tokenizer TOKENIZER_JSON --request REQUEST_JSON [--ids] -> the prompt string exactly (no newline
// added), or with --ids the JSON array of its token ids (issue 4 contract). REQUEST_JSON is a file path, or the
// JSON text itself when it starts with '{'. Request format: see src/text/chat_request.h.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/text_cli_util.h"
#include "core/error.h"
#include "text/chat_request.h"
#include "text/tokenizer.h"

namespace {

int cmd_render(const std::vector<std::string>& args) {
  CLI::App app{"Render an OpenAI-style conversation as a DeepSeek-V4 prompt (official encoder, byte-exact)",
               "dsv4 render"};
  std::string tokenizer_path, request;
  bool ids = false;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json (needed for --ids)");
  app.add_option("--request", request, "request JSON file, or inline JSON starting with '{'")->required();
  app.add_flag("--ids", ids, "print the prompt's token ids (whole-string tokenization) instead of the text");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  const std::size_t first = request.find_first_not_of(" \t\r\n");
  const std::string json =
      first != std::string::npos && request[first] == '{' ? request : dsv4::cli::read_file_bytes(request);
  const dsv4::text::ChatRequest req = dsv4::text::parse_chat_request(json);
  const std::string prompt = dsv4::text::encode_chat(req.messages, req.options);
  if (!ids) {
    dsv4::cli::write_stdout(prompt);
    return 0;
  }
  if (tokenizer_path.empty()) dsv4::fail("--ids needs --tokenizer");
  const auto tok = dsv4::text::Tokenizer::from_file(tokenizer_path);
  dsv4::cli::write_stdout(dsv4::cli::ids_to_json(tok.encode(prompt)) + "\n");
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("render", "conversation JSON -> DeepSeek-V4 prompt (or its ids)", cmd_render);
