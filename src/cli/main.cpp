// dsv4 command-line entry point: dispatches to the registered subcommands (see command.h).
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"
#include "dsv4/version.h"

namespace dsv4::cli {
std::map<std::string, Command>& registry() {
  static std::map<std::string, Command> r;
  return r;
}
}  // namespace dsv4::cli

static void usage(std::FILE* f) {
  std::fprintf(f, "usage: dsv4 <command> [options]   (dsv4 <command> --help for its options)\n\ncommands:\n");
  for (const auto& [name, c] : dsv4::cli::registry()) std::fprintf(f, "  %-12s %s\n", name.c_str(), c.summary.c_str());
  std::fprintf(f, "\n  --version    print the version and whether the CUDA backend was compiled\n");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::printf("%s\n", dsv4::version_string().c_str());
    return 0;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  auto& reg = dsv4::cli::registry();
  auto it = reg.find(cmd);
  if (it == reg.end()) {
    std::fprintf(stderr, "dsv4: unknown command '%s'\n", cmd.c_str());
    usage(stderr);
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.fn(args);
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dsv4 %s: error: out of memory\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
