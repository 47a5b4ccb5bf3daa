#include "text/pretokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode_class.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

constexpr const char* kSplitDigits = R"(\p{N}{1,3})";
constexpr const char* kSplitCjk = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr const char* kSplitWords =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

// The decoded text: one entry per code point, plus a sentinel offset at the end.
struct Decoded {
  std::vector<char32_t> cp;
  std::vector<std::uint8_t> cls;
  std::vector<std::uint32_t> off;
};

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);  // the two kana blocks are adjacent
}
bool is_ascii_alpha(char32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
bool is_ascii_punct(char32_t c) {  // the 32 characters of the first bracket expression
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}
bool is_crlf(char32_t c) { return c == '\r' || c == '\n'; }

// End of the match of the third regex starting exactly at i (within the piece [i, e)), or 0 if none starts there.
// Alternatives are tried in pattern order; the first that matches wins (leftmost-first alternation).
std::uint32_t match_words(const Decoded& d, std::uint32_t i, std::uint32_t e) {
  const char32_t c = d.cp[i];
  const std::uint8_t k = d.cls[i];
  const bool has_next = i + 1 < e;
  const std::uint8_t kn = has_next ? d.cls[i + 1] : 0;
  // A1  [ascii punct][A-Za-z]+
  if (is_ascii_punct(c) && has_next && is_ascii_alpha(d.cp[i + 1])) {
    std::uint32_t j = i + 1;
    while (j < e && is_ascii_alpha(d.cp[j])) ++j;
    return j;
  }
  // A2  [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+  (the optional prefix is taken greedily, given back if needed)
  {
    std::uint32_t s = 0xFFFFFFFF;
    if (!is_crlf(c) && !(k & (kLetter | kPunct | kSymbol)) && (kn & (kLetter | kMark)))
      s = i + 1;
    else if (k & (kLetter | kMark))
      s = i;
    if (s != 0xFFFFFFFF) {
      std::uint32_t j = s;
      while (j < e && (d.cls[j] & (kLetter | kMark))) ++j;
      return j;
    }
  }
  // A3   ?[\p{P}\p{S}]+[\r\n]*
  {
    std::uint32_t s = 0xFFFFFFFF;
    if (c == ' ' && (kn & (kPunct | kSymbol)))
      s = i + 1;
    else if (k & (kPunct | kSymbol))
      s = i;
    if (s != 0xFFFFFFFF) {
      std::uint32_t j = s;
      while (j < e && (d.cls[j] & (kPunct | kSymbol))) ++j;
      while (j < e && is_crlf(d.cp[j])) ++j;
      return j;
    }
  }
  if (!(k & kSpace)) return 0;
  std::uint32_t w = i;  // end of the whitespace run
  std::uint32_t last_crlf = 0xFFFFFFFF;
  while (w < e && (d.cls[w] & kSpace)) {
    if (is_crlf(d.cp[w])) last_crlf = w;
    ++w;
  }
  // A4  \s*[\r\n]+ : \s* backs off to the last CR/LF of the run.
  if (last_crlf != 0xFFFFFFFF) return last_crlf + 1;
  // A5  \s+(?!\S) : the whole run at the end of the piece, otherwise all but its last character.
  if (w == e) return w;
  if (w - i >= 2) return w - 1;
  // A6  \s+
  return w;
}

template <typename Emit>
void split_words(const Decoded& d, std::uint32_t b, std::uint32_t e, Emit&& emit) {
  std::uint32_t unmatched = b, i = b;
  while (i < e) {
    const std::uint32_t m = match_words(d, i, e);
    if (m == 0) {
      ++i;
      continue;
    }
    if (unmatched < i) emit(unmatched, i);
    emit(i, m);
    i = unmatched = m;
  }
  if (unmatched < e) emit(unmatched, e);
}

template <typename Emit>
void split_cjk(const Decoded& d, std::uint32_t b, std::uint32_t e, Emit&& emit) {
  std::uint32_t i = b;
  while (i < e) {
    std::uint32_t j = i;
    const bool cjk = is_cjk(d.cp[i]);
    while (j < e && is_cjk(d.cp[j]) == cjk) ++j;
    if (cjk)
      emit(i, j);
    else
      split_words(d, i, j, emit);
    i = j;
  }
}

template <typename Emit>
void split_digits(const Decoded& d, std::uint32_t b, std::uint32_t e, Emit&& emit) {
  std::uint32_t i = b;
  while (i < e) {
    std::uint32_t j = i;
    const bool num = d.cls[i] & kNumber;
    while (j < e && bool(d.cls[j] & kNumber) == num) ++j;
    if (num) {
      for (std::uint32_t g = i; g < j; g += 3) split_cjk(d, g, std::min(g + 3, j), emit);  // \p{N}{1,3}, from the left
    } else {
      split_cjk(d, i, j, emit);
    }
    i = j;
  }
}

}  // namespace

void check_pretokenizer_config(const nlohmann::json& pt) {
  auto bad = [&](const char* why) { fail("unsupported pre_tokenizer (", why, "): ", pt.dump()); };
  if (!pt.is_object() || pt.value("type", "") != "Sequence" || !pt.contains("pretokenizers")) bad("not a Sequence");
  const auto& seq = pt["pretokenizers"];
  if (!seq.is_array() || seq.size() != 4) bad("expected 3 Split + ByteLevel");
  const char* patterns[3] = {kSplitDigits, kSplitCjk, kSplitWords};
  for (int k = 0; k < 3; ++k) {
    const auto& s = seq[k];
    if (!s.is_object() || s.value("type", "") != "Split" || s.value("behavior", "") != "Isolated" ||
        s.value("invert", true) != false || !s.contains("pattern") || !s["pattern"].is_object() ||
        s["pattern"].value("Regex", "") != patterns[k])
      bad("split pattern differs from DeepSeek-V3/V4");
  }
  const auto& bl = seq[3];
  if (!bl.is_object() || bl.value("type", "") != "ByteLevel" || bl.value("add_prefix_space", true) != false ||
      bl.value("use_regex", true) != false)
    bad("ByteLevel must have add_prefix_space=false, use_regex=false");
}

void pretokenize(std::string_view text, std::vector<Piece>& out) {
  if (text.empty()) return;
  thread_local Decoded d;
  d.cp.clear();
  d.cls.clear();
  d.off.clear();
  std::size_t i = 0;
  while (i < text.size()) {
    char32_t c;
    const auto b = static_cast<std::uint8_t>(text[i]);
    std::size_t n = 1;
    if (b < 0x80) {
      c = b;
    } else {
      n = decode_utf8(text, i, c);
      if (n == 0) fail("pretokenize: invalid UTF-8 at byte ", i);
    }
    d.cp.push_back(c);
    d.cls.push_back(char_class(c));
    d.off.push_back(static_cast<std::uint32_t>(i));
    i += n;
  }
  d.off.push_back(static_cast<std::uint32_t>(text.size()));
  split_digits(d, 0, static_cast<std::uint32_t>(d.cp.size()),
               [&](std::uint32_t b, std::uint32_t e) { out.push_back(Piece{d.off[b], d.off[e]}); });
}

}  // namespace dsv4::text
