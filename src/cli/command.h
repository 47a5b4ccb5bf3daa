#pragma once
// Subcommand registry: each src/cli/cmd_*.cpp registers itself with DSV4_REGISTER_COMMAND, so adding a command
// never touches main.cpp. A command returns the process exit code; dsv4::Error escaping it becomes exit code 1
// with the message on stderr.
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsv4::cli {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;  // args exclude "dsv4 <name>"

struct Command {
  std::string name;
  std::string summary;
  CommandFn fn;
};

std::map<std::string, Command>& registry();

struct Registrar {
  Registrar(std::string name, std::string summary, CommandFn fn) {
    auto n = name;
    registry().emplace(n, Command{std::move(name), std::move(summary), std::move(fn)});
  }
};

#define DSV4_REGISTER_COMMAND(name, summary, fn) \
  static ::dsv4::cli::Registrar dsv4_registrar_##fn{name, summary, fn}

}  // namespace dsv4::cli
