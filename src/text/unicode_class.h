#pragma once
// Character classes of the DeepSeek-V4 pre-tokenizer regexes (\p{L}, \p{M}, \p{N}, \p{P}, \p{S}, \s), as
// measured on the reference regex engine (see tools/text/gen_unicode_tables.py).
#include <cstdint>

namespace dsv4::text {

enum CharClass : std::uint8_t {
  kLetter = 1 << 0,
  kMark = 1 << 1,
  kNumber = 1 << 2,
  kPunct = 1 << 3,
  kSymbol = 1 << 4,
  kSpace = 1 << 5,  // Unicode White_Space, i.e. Oniguruma's \s
};

// Class bits of a Unicode scalar value (0 for unassigned / other); O(1) table lookup.
std::uint8_t char_class(char32_t cp);

}  // namespace dsv4::text
