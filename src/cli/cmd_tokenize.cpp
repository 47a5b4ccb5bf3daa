// dsv4 tokenize --tokenizer TOKENIZER_JSON (--text TEXT | --text-file FILE) -> JSON array of ids (issue 4 contract).
// Test/benchmark extensions: --jsonl FILE (one JSON string per line -> one id array per line) and --bench
// (times encoding of the input, excluding loading, and prints a JSON report instead of ids).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/text_cli_util.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace {

using dsv4::text::TokenId;
using dsv4::text::Tokenizer;

std::vector<std::string> read_jsonl_strings(const std::string& path) {
  std::vector<std::string> docs;
  std::istringstream in(dsv4::cli::read_file_bytes(path));
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      dsv4::fail(path, ":", lineno, ": ", e.what());
    }
    if (!j.is_string()) dsv4::fail(path, ":", lineno, ": expected a JSON string");
    docs.push_back(j.get<std::string>());
  }
  return docs;
}

int run_bench(const Tokenizer& tok, const std::vector<std::string>& docs, int repeat) {
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<double> seconds;
  std::size_t tokens = 0;
  std::vector<TokenId> ids;
  for (int r = 0; r < repeat; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : docs) {
      ids.clear();
      tok.encode_append(d, ids);
      tokens += ids.size();
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double best = *std::min_element(seconds.begin(), seconds.end());
  nlohmann::json report = {{"engine", "dsv4"},          {"documents", docs.size()}, {"bytes", bytes},
                           {"tokens", tokens},          {"repeat", repeat},         {"first_seconds", seconds[0]},
                           {"best_seconds", best},      {"mb_per_s", bytes / best / 1e6}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

int cmd_tokenize(const std::vector<std::string>& args) {
  CLI::App app{"Tokenize text with a Hugging Face tokenizer.json (no BOS added; added tokens matched)",
               "dsv4 tokenize"};
  std::string tokenizer_path, text, text_file, jsonl;
  bool bench = false;
  int repeat = 3;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  auto* o_text = app.add_option("--text", text, "text to tokenize");
  auto* o_file = app.add_option("--text-file", text_file, "file whose bytes are tokenized");
  auto* o_jsonl = app.add_option("--jsonl", jsonl, "file with one JSON string per line; prints one id array per line");
  o_text->excludes(o_file)->excludes(o_jsonl);
  o_file->excludes(o_jsonl);
  app.add_flag("--bench", bench, "time encoding (single thread, best of --repeat) and print a JSON report");
  app.add_option("--repeat", repeat, "benchmark repetitions")->check(CLI::Range(1, 100));
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (!*o_text && !*o_file && !*o_jsonl) {
    std::fprintf(stderr, "dsv4 tokenize: one of --text, --text-file, --jsonl is required\n");
    return 2;
  }
  const Tokenizer tok = Tokenizer::from_file(tokenizer_path);
  std::vector<std::string> docs;
  if (*o_jsonl)
    docs = read_jsonl_strings(jsonl);
  else
    docs.push_back(*o_file ? dsv4::cli::read_file_bytes(text_file) : text);
  if (bench) return run_bench(tok, docs, repeat);
  std::string out;
  for (const auto& d : docs) {
    out += dsv4::cli::ids_to_json(tok.encode(d));
    out += '\n';
  }
  dsv4::cli::write_stdout(out);
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("tokenize", "text -> token ids with a tokenizer.json", cmd_tokenize);
