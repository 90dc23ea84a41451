// Reading numbers out of a model's completion, for the task checkers.
//
// A completion is untrusted bytes: these readers bound what they accept (at most 10 digits, so a
// sum of two values cannot overflow int64; a checker that multiplies checks for overflow) and
// never read past the view.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace agora::rl_parse {

inline constexpr int kMaxDigits = 10;

// Reads a canonical non-negative integer at the front of `text` ("0", or digits without a
// leading zero) and removes it from `text`; nullopt (text unchanged) when there is none.
inline std::optional<int64_t> take_integer(std::string_view& text) {
  size_t n = 0;
  while (n < text.size() && text[n] >= '0' && text[n] <= '9') ++n;
  if (n == 0 || n > kMaxDigits || (n > 1 && text[0] == '0')) return std::nullopt;
  int64_t value = 0;
  for (size_t i = 0; i < n; ++i) value = value * 10 + (text[i] - '0');
  text.remove_prefix(n);
  return value;
}

// Removes one expected character at the front of `text`; false (text unchanged) otherwise.
inline bool take_char(std::string_view& text, char c) {
  if (text.empty() || text.front() != c) return false;
  text.remove_prefix(1);
  return true;
}

// `text` without trailing spaces and newlines (a tokenizer may end a completion with one).
inline std::string_view trim_end(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.remove_suffix(1);
  return text;
}

}  // namespace agora::rl_parse
