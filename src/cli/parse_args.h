#pragma once
// CLI11 parsing shared by the subcommands: returns -1 to go on, or the exit code to return (0 after --help, 2 on a
// usage error, with CLI11's message printed).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace dsv4::cli {
inline int parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 consumes a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}
}  // namespace dsv4::cli
