#pragma once
// UTF-8 primitives shared by the tokenizer, the detokenizer and the JSON code. Conversions follow the Unicode
// "well-formed byte sequence" table (no overlongs, no surrogates, nothing above U+10FFFF); lossy decoding replaces
// each maximal invalid subpart by one U+FFFD, which is exactly what Rust's String::from_utf8_lossy (and therefore
// Hugging Face `tokenizers`' decode) does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the well-formed sequence starting at s[i]. On success returns its length (1..4) and sets `cp`; on an
// ill-formed or truncated sequence returns 0 and sets `cp` to the length of the maximal subpart (>= 1) so a lossy
// decoder knows how many bytes one U+FFFD replaces.
std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t& cp);

void append_utf8(std::string& out, char32_t cp);

// Offset of the first ill-formed byte, or npos if `s` is entirely valid UTF-8.
std::size_t find_invalid_utf8(std::string_view s);

// Rust from_utf8_lossy semantics.
std::string utf8_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that can be decoded now without changing the result of decoding the
// whole stream later: everything except a trailing sequence that is still a valid, incomplete prefix (<= 3 bytes).
std::size_t utf8_stable_prefix_len(std::string_view bytes);

}  // namespace dsv4::text
