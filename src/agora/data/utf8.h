// UTF-8 validation and repair: the one place that decides what invalid text becomes.
#pragma once

#include <string>
#include <string_view>

namespace agora {

// Appends the UTF-8 encoding of the scalar value `code_point` (below 0x110000, not a surrogate).
void append_utf8(std::string& out, char32_t code_point);

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view text);

// `text` with every maximal ill-formed subsequence replaced by U+FFFD (EF BF BD), following the
// Unicode Standard's "best practice for U+FFFD substitution" (section 3.9), as Python's
// bytes.decode("utf-8", errors="replace") and the WHATWG decoder do. Valid input comes back
// unchanged.
std::string repair_utf8(std::string_view text);

}  // namespace agora
