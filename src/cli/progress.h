#pragma once
// A one-line progress bar on stderr, drawn only when stderr is a terminal (logs and pipes stay clean).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dsv4::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), on_(isatty(STDERR_FILENO)) {}
  void update(int64_t done, int64_t total) {
    if (!on_ || total <= 0) return;
    const int width = 30;
    int filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld", label_.c_str(), bar.c_str(), (long long)done, (long long)total);
    if (done >= total) std::fputs("\r\x1b[K", stderr);  // erase the finished bar
    std::fflush(stderr);
  }
  void message(const char* text) {
    if (on_) std::fprintf(stderr, "\r%s\x1b[K", text), std::fflush(stderr);
  }
  void clear() {
    if (on_) std::fputs("\r\x1b[K", stderr), std::fflush(stderr);
  }

 private:
  std::string label_;
  bool on_;
};

}  // namespace dsv4::cli
