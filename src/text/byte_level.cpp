#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace dsv4::text {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<std::int16_t, 0x144> to_byte{};  // every mapped code point is below U+0144
};

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t.to_char[b] = printable ? char32_t(b) : next++;
      t.to_byte[t.to_char[b]] = static_cast<std::int16_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

char32_t byte_to_char(std::uint8_t b) { return tables().to_char[b]; }

std::optional<std::uint8_t> char_to_byte(char32_t c) {
  const auto& t = tables();
  if (c >= t.to_byte.size() || t.to_byte[c] < 0) return std::nullopt;
  return static_cast<std::uint8_t>(t.to_byte[c]);
}

std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    const std::size_t n = decode_utf8(s, i, c);
    if (n == 0) return std::nullopt;
    const auto b = char_to_byte(c);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += n;
  }
  return out;
}

std::string token_string_to_bytes(std::string_view s) {
  if (auto b = byte_level_to_bytes(s)) return *b;
  return std::string(s);
}

}  // namespace dsv4::text
