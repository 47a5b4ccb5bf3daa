// dsv4 detokenize --tokenizer TOKENIZER_JSON --ids 1,2,3 -> the decoded text, exactly (issue 4 contract).
// Test extension: --jsonl FILE (one JSON id array per line -> one JSON string per line).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/text_cli_util.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace {

int cmd_detokenize(const std::vector<std::string>& args) {
  CLI::App app{"Decode token ids to text (added tokens shown; invalid UTF-8 becomes U+FFFD)", "dsv4 detokenize"};
  std::string tokenizer_path, ids_text, jsonl;
  bool skip_special = false;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  auto* o_ids = app.add_option("--ids", ids_text, "comma-separated ids, e.g. 1,2,3");
  auto* o_jsonl = app.add_option("--jsonl", jsonl, "file with one JSON id array per line");
  o_ids->excludes(o_jsonl);
  app.add_flag("--skip-special", skip_special, "drop added tokens flagged special");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (!*o_ids && !*o_jsonl) {
    std::fprintf(stderr, "dsv4 detokenize: --ids or --jsonl is required\n");
    return 2;
  }
  const auto tok = dsv4::text::Tokenizer::from_file(tokenizer_path);
  if (*o_ids) {
    dsv4::cli::write_stdout(tok.decode(dsv4::cli::parse_id_list(ids_text), skip_special));
    return 0;
  }
  std::istringstream in(dsv4::cli::read_file_bytes(jsonl));
  std::string line, out;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::vector<dsv4::text::TokenId> ids;
    try {
      ids = nlohmann::json::parse(line).get<std::vector<dsv4::text::TokenId>>();
    } catch (const nlohmann::json::exception& e) {
      dsv4::fail(jsonl, ":", lineno, ": ", e.what());
    }
    out += nlohmann::json(tok.decode(ids, skip_special)).dump();
    out += '\n';
  }
  dsv4::cli::write_stdout(out);
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("detokenize", "token ids -> text with a tokenizer.json", cmd_detokenize);
