#include "text/utf8.h"

namespace dsv4::text {
namespace {

// Allowed range of the second byte for a lead byte (Unicode Table 3-7); later bytes are always 80..BF.
struct LeadInfo {
  std::uint8_t len;  // 0 = never a valid lead byte
  std::uint8_t lo, hi;
};

LeadInfo lead_info(std::uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

}  // namespace

std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  const LeadInfo li = lead_info(b0);
  if (li.len == 1) {
    cp = b0;
    return 1;
  }
  if (li.len == 0) {
    cp = 1;
    return 0;
  }
  char32_t v = b0 & (0xFF >> (li.len + 1));
  std::size_t k = 1;
  for (; k < li.len; ++k) {
    if (i + k >= s.size()) break;
    const auto b = static_cast<std::uint8_t>(s[i + k]);
    const std::uint8_t lo = k == 1 ? li.lo : 0x80, hi = k == 1 ? li.hi : 0xBF;
    if (b < lo || b > hi) break;
    v = (v << 6) | (b & 0x3F);
  }
  if (k == li.len) {
    cp = v;
    return k;
  }
  cp = static_cast<char32_t>(k);  // maximal subpart length
  return 0;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::size_t find_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<std::uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    const std::size_t n = decode_utf8(s, i, cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const std::size_t n = decode_utf8(s, i, cp);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      append_utf8(out, kReplacementChar);
      i += cp;  // skip the maximal subpart
    }
  }
  return out;
}

std::size_t utf8_stable_prefix_len(std::string_view s) {
  // A held-back tail must start at a lead byte within the last 3 bytes and be a valid but incomplete prefix.
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const std::size_t start = n - back;
    const auto b0 = static_cast<std::uint8_t>(s[start]);
    if (b0 >= 0x80 && b0 < 0xC0) continue;  // continuation byte: keep looking for the lead
    const LeadInfo li = lead_info(b0);
    if (li.len <= back) return n;  // ASCII, invalid lead, or a complete sequence: nothing to hold back
    for (std::size_t k = 1; k < back; ++k) {
      const auto b = static_cast<std::uint8_t>(s[start + k]);
      const std::uint8_t lo = k == 1 ? li.lo : 0x80, hi = k == 1 ? li.hi : 0xBF;
      if (b < lo || b > hi) return n;  // already ill-formed: decoding it now gives the same U+FFFD as later
    }
    return start;
  }
  return n;
}

}  // namespace dsv4::text
