#pragma once
// GPT-2 byte-level alphabet (CHAT_FORMAT.md §4.5): every byte maps to one printable code point. Vocabulary and
// merge strings in tokenizer.json are written in this alphabet; dsv4 converts them back to raw bytes at load time
// so that BPE runs directly on the text's bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv4::text {

char32_t byte_to_char(std::uint8_t b);
std::optional<std::uint8_t> char_to_byte(char32_t c);

// Raw bytes of a string written in the byte-level alphabet, or nullopt if some character is outside it.
std::optional<std::string> byte_level_to_bytes(std::string_view s);

// What the ByteLevel decoder turns one token string into: mapped back to bytes when every character is in the
// alphabet, else the string's own UTF-8 bytes (e.g. "<｜User｜>").
std::string token_string_to_bytes(std::string_view s);

}  // namespace dsv4::text
