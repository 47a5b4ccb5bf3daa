#include "text/unicode_class.h"

#include <memory>

namespace dsv4::text {
namespace {

struct Range {
  char32_t first, last;
  std::uint8_t bits;
};

constexpr Range kRanges[] = {
#include "text/unicode_tables.inc"
};

constexpr char32_t kCodeSpace = 0x110000;

// One byte per code point (1.1 MB): the pre-tokenizer classifies every character of every prompt, so the lookup
// must be a single load rather than a binary search over ~1600 ranges.
const std::uint8_t* build_table() {
  static const std::unique_ptr<std::uint8_t[]> table = [] {
    std::unique_ptr<std::uint8_t[]> t(new std::uint8_t[kCodeSpace]());
    for (const Range& r : kRanges)
      for (char32_t c = r.first; c <= r.last; ++c) t[c] = r.bits;
    return t;
  }();
  return table.get();
}

}  // namespace

std::uint8_t char_class(char32_t cp) {
  static const std::uint8_t* table = build_table();
  return cp < kCodeSpace ? table[cp] : 0;
}

}  // namespace dsv4::text
