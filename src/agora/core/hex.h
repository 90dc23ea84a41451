// Hexadecimal text of raw bytes: how keys, hashes and signatures appear wherever a person or a
// text format sees them (key files, allowlists, the coordinator's database, JSON, log lines).
//
// Promises:
// - hex_encode() writes two lower-case digits per byte, nothing else; hex_decode() of its output
//   gives the bytes back.
// - hex_decode() is strict: an even number of digits (either case) and nothing else, no prefix,
//   no spaces. Anything else throws Error that names what was being read and quotes the text.
// - The log forms never throw and never print an empty string for empty bytes, so a line such
//   as "key <empty> is not allowed" still reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace agora {

std::string hex_encode(std::string_view bytes);
std::string hex_encode(std::span<const uint8_t> bytes);  // a digest in a std::array

// The bytes `text` spells. `what` names the text in the error ("key file k.json: seed").
std::string hex_decode(std::string_view text, std::string_view what = "hex text");
// The same, and the text must spell exactly `bytes` bytes.
std::string hex_decode(std::string_view text, size_t bytes, std::string_view what);

// For log lines and error messages about bytes that may be anything: every digit, or "<empty>".
std::string hex_for_log(std::string_view bytes);
// The first 8 digits (4 bytes), enough to tell keys and hashes apart in a log; "<empty>" for
// no bytes.
std::string short_hex(std::string_view bytes);

}  // namespace agora
