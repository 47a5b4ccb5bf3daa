// dsv4 make-tiny DIR: a small random DeepSeek-V4 checkpoint in the official layout, in any released format.
#include <CLI/CLI.hpp>

#include <fstream>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/error.h"
#include "model/tiny_model.h"

extern "C" const char dsv4_tokenizer_json_begin[], dsv4_tokenizer_json_end[];
extern "C" const char dsv4_tokenizer_config_begin[], dsv4_tokenizer_config_end[];

namespace {
int cmd_make_tiny(const std::vector<std::string>& args) {
  CLI::App app{"Write a small random DeepSeek-V4 checkpoint (official layout) with the real V4 tokenizer files",
               "dsv4 make-tiny"};
  std::string dir;
  dsv4::TinySpec sp;
  app.add_option("--out", dir, "output directory")->required();
  app.add_option("--format", sp.format, "bf16|fp8|base|nvfp4")->check(CLI::IsMember({"bf16", "fp8", "base", "nvfp4"}));
  app.add_option("--schedule", sp.schedule, "flash|pro")->check(CLI::IsMember({"flash", "pro"}));
  app.add_option("--vocab", sp.vocab, "vocabulary size")->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  app.add_option("--layers", sp.layers, "main layers")->check(CLI::Range(2, 64));
  app.add_option("--seed", sp.seed, "random seed");
  app.add_flag("--tp-ready", sp.tp_ready, "widths that split on whole tiles for --tp up to 8 (TP tests)");
  app.add_option("--hidden", sp.hidden, "hidden size, a multiple of 64 (default 64)");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  dsv4::write_tiny_model(dir, sp);
  // The real V4 tokenizer, when the vocabulary matches it (129280 ids incl. added tokens).
  if (sp.vocab == 129280) {
    auto put = [&](const std::string& name, const char* b, const char* e) {
      std::ofstream f(dir + "/" + name, std::ios::binary);
      f.write(b, e - b);
      if (!f) dsv4::fail(dir, "/", name, ": write failed");
    };
    put("tokenizer.json", dsv4_tokenizer_json_begin, dsv4_tokenizer_json_end);
    put("tokenizer_config.json", dsv4_tokenizer_config_begin, dsv4_tokenizer_config_end);
  }
  std::printf("wrote %s (%s, %s schedule, vocab %lld, %d layers)\n", dir.c_str(), sp.format.c_str(),
              sp.schedule.c_str(), (long long)sp.vocab, sp.layers);
  return 0;
}
}  // namespace
DSV4_REGISTER_COMMAND("make-tiny", "write a small random checkpoint (tests, default model)", cmd_make_tiny);
