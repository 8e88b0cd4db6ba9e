#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

// Valid second-byte range for each lead byte (Unicode Table 3-7, "Well-Formed UTF-8 Byte
// Sequences"); later continuation bytes are always 0x80..0xBF.
struct LeadInfo {
  int length;  // 0: not a lead byte
  unsigned char lo, hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // up to U+10FFFF
  return {0, 0, 0};
}

// Number of bytes of a maximal valid prefix of a sequence starting at s[i] (>= 1 when s[i] is a
// lead byte), and whether that prefix is a complete character.
struct Prefix {
  size_t len;
  bool complete;
};

Prefix valid_prefix(std::string_view s, size_t i) {
  const LeadInfo li = lead_info(static_cast<unsigned char>(s[i]));
  if (li.length == 0) return {0, false};
  if (li.length == 1) return {1, true};
  size_t n = 1;
  while (n < static_cast<size_t>(li.length)) {
    if (i + n >= s.size()) return {n, false};
    const unsigned char c = static_cast<unsigned char>(s[i + n]);
    const unsigned char lo = n == 1 ? li.lo : 0x80, hi = n == 1 ? li.hi : 0xBF;
    if (c < lo || c > hi) return {n, false};
    ++n;
  }
  return {n, true};
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const Prefix p = valid_prefix(s, i);
  return p.complete ? p.len : 0;
}

std::optional<size_t> utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Prefix p = valid_prefix(s, i);
    if (!p.complete) return i;
    i += p.len;
  }
  return std::nullopt;
}

std::string utf8_repair(std::string_view s) {
  if (!utf8_find_invalid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const Prefix p = valid_prefix(s, i);
    if (p.complete) {
      out.append(s.substr(i, p.len));
      i += p.len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal subpart (at least one byte)
      i += p.len == 0 ? 1 : p.len;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // An incomplete sequence is at most 3 bytes long, so only the tail needs looking at.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80 || (b & 0xC0) == 0x80) continue;  // ASCII or continuation byte
    const Prefix p = valid_prefix(s, i);
    if (!p.complete && p.len > 0 && i + p.len == s.size()) return i;  // a valid start cut short
  }
  return s.size();
}

void utf8_append(std::string& out, uint32_t cp) {
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

}  // namespace sparrow
