#pragma once
// Prints streamed completion deltas on a terminal: reasoning dim (ANSI) when stdout is a TTY, then the answer; tool
// calls on their own lines.
#include <cstdio>

#include "text/completion_parser.h"

namespace dsv4::cli {

class StreamPrinter {
 public:
  explicit StreamPrinter(bool tty) : tty_(tty) {}
  void operator()(const text::CompletionDelta& d) {
    if (!d.reasoning.empty()) {
      if (!in_reasoning_ && tty_) std::fputs("\x1b[2m", stdout);
      in_reasoning_ = true;
      std::fputs(d.reasoning.c_str(), stdout);
    }
    if (!d.content.empty() || !d.tool_calls.empty()) {
      end_reasoning();
      std::fputs(d.content.c_str(), stdout);
      for (const auto& tc : d.tool_calls) std::printf("\n[tool call] %s(%s)\n", tc.name.c_str(), tc.arguments.c_str());
    }
    std::fflush(stdout);
  }
  // Closes the dim section and ends the line.
  void finish() {
    if (in_reasoning_ && tty_) std::fputs("\x1b[0m", stdout);
    in_reasoning_ = false;
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

 private:
  void end_reasoning() {
    if (!in_reasoning_) return;
    std::fputs(tty_ ? "\x1b[0m\n" : "\n", stdout);
    in_reasoning_ = false;
  }
  bool tty_;
  bool in_reasoning_ = false;
};

}  // namespace dsv4::cli
