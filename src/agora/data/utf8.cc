#include "agora/data/utf8.h"

#include <cstdint>
#include <cstring>

namespace agora {
namespace {

// The well-formed byte sequences are those of the Unicode Standard's table 3-7. For a lead byte
// this gives how many continuation bytes follow, and the allowed range of the first of them (the
// only one whose range depends on the lead: it excludes overlongs, surrogates and > U+10FFFF).
struct LeadInfo {
  uint8_t continuations;  // 0 for ASCII; 0xFF for a byte that cannot start a sequence
  uint8_t first_lo;
  uint8_t first_hi;
};

constexpr uint8_t kInvalidLead = 0xFF;

constexpr LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b < 0xC2) return {kInvalidLead, 0, 0};  // continuation bytes and overlong C0/C1
  if (b < 0xE0) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};  // no overlong 3-byte forms
  if (b == 0xED) return {2, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};  // no overlong 4-byte forms
  if (b < 0xF4) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};  // nothing above U+10FFFF
  return {kInvalidLead, 0, 0};
}

// Length of the valid sequence starting at `p` (1..4), or the negative length of the maximal
// subpart of an ill-formed one that begins there (at least 1 byte): the bytes that one U+FFFD
// replaces. This is the definition Python's "replace" and WHATWG follow.
inline int sequence_at(const uint8_t* p, const uint8_t* end) {
  const LeadInfo info = lead_info(p[0]);
  if (info.continuations == 0) return 1;
  if (info.continuations == kInvalidLead) return -1;
  int n = 1;
  for (int k = 0; k < info.continuations; ++k) {
    if (p + n >= end) return -n;
    const uint8_t lo = k == 0 ? info.first_lo : 0x80;
    const uint8_t hi = k == 0 ? info.first_hi : 0xBF;
    if (p[n] < lo || p[n] > hi) return -n;
    ++n;
  }
  return n;
}

// Skips the leading run of ASCII, eight bytes at a time: most text is mostly ASCII.
inline const uint8_t* skip_ascii(const uint8_t* p, const uint8_t* end) {
  while (end - p >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    if (word & 0x8080808080808080ULL) break;
    p += 8;
  }
  while (p < end && *p < 0x80) ++p;
  return p;
}

// Offset of the first byte of the first ill-formed sequence, or text.size() when all is valid.
size_t first_invalid(std::string_view text) {
  const auto* begin = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = begin + text.size();
  const uint8_t* p = begin;
  while (true) {
    p = skip_ascii(p, end);
    if (p == end) return text.size();
    const int n = sequence_at(p, end);
    if (n < 0) return static_cast<size_t>(p - begin);
    p += n;
  }
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  return first_invalid(text) == text.size();
}

std::string repair_utf8(std::string_view text) {
  size_t valid_prefix = first_invalid(text);
  if (valid_prefix == text.size()) return std::string(text);

  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size() + 16);
  out.append(text.data(), valid_prefix);
  const auto* begin = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = begin + text.size();
  const uint8_t* p = begin + valid_prefix;
  while (p < end) {
    const uint8_t* run = p;
    p = skip_ascii(p, end);
    while (p < end) {
      const int n = sequence_at(p, end);
      if (n < 0) break;
      p += n;
    }
    out.append(reinterpret_cast<const char*>(run), static_cast<size_t>(p - run));
    if (p == end) break;
    out.append(kReplacement, 3);
    p += -sequence_at(p, end);
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace agora
