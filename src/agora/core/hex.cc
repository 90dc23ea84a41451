#include "agora/core/hex.h"

#include "agora/core/error.h"

namespace agora {
namespace {

constexpr char kDigits[] = "0123456789abcdef";
constexpr size_t kShortBytes = 4;

// The value of one hex digit, or -1.
int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string hex_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string hex_encode(std::span<const uint8_t> bytes) {
  return hex_encode(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string hex_decode(std::string_view text, std::string_view what) {
  if (text.size() % 2 != 0) {
    fail("{} has an odd number of hexadecimal digits ({}): '{}'", what, text.size(), text);
  }
  std::string out(text.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int high = digit_value(text[2 * i]), low = digit_value(text[2 * i + 1]);
    if (high < 0 || low < 0) fail("{} is not hexadecimal: '{}'", what, text);
    out[i] = static_cast<char>(high * 16 + low);
  }
  return out;
}

std::string hex_decode(std::string_view text, size_t bytes, std::string_view what) {
  if (text.size() != bytes * 2) {
    fail("{} has {} characters; expected {} hexadecimal characters", what, text.size(), bytes * 2);
  }
  return hex_decode(text, what);
}

std::string hex_for_log(std::string_view bytes) {
  return bytes.empty() ? "<empty>" : hex_encode(bytes);
}

std::string short_hex(std::string_view bytes) {
  return hex_for_log(bytes.substr(0, kShortBytes));
}

}  // namespace agora
