#pragma once
// One exception type for every user-facing failure (bad checkpoint, bad config, bad input). The CLI turns it into
// a one-line message on stderr and a non-zero exit code; nothing in dsv4 aborts on bad input.
#include <stdexcept>
#include <string>
#include <utility>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string msg) : std::runtime_error(std::move(msg)) {}
};

// Concatenates its arguments with operator<< into an Error message.
template <typename... Args>
[[noreturn]] void fail(Args&&... args);

}  // namespace dsv4

#include <sstream>
namespace dsv4 {
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  throw Error(os.str());
}
// Cheap precondition check that throws (never asserts away in Release).
#define DSV4_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) ::dsv4::fail("check failed: " #cond ": ", __VA_ARGS__); \
  } while (0)
}  // namespace dsv4
