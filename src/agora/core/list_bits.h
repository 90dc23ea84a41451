// One bit per item of a list both sides already hold, as the protocol sends it (Finalized and
// Witness `of_collect`, the coordinator's witness holdings): bit i is bit i % 8 of byte i / 8,
// least significant first; ceil(n / 8) bytes; the padding bits past n are 0. A set of 1000
// commits takes 125 bytes this way instead of 1000 hashes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace agora {

inline std::string list_bits(size_t n) {
  return std::string((n + 7) / 8, '\0');
}

inline bool list_bit(const std::string& bits, size_t i) {
  return (static_cast<uint8_t>(bits[i / 8]) >> (i % 8)) & 1u;
}

inline void set_list_bit(std::string& bits, size_t i) {
  bits[i / 8] = static_cast<char>(static_cast<uint8_t>(bits[i / 8]) | (1u << (i % 8)));
}

// Whether `bits` (from a member: untrusted) is a well-formed set over a list of n: the exact
// length, and no padding bit set.
inline bool list_bits_valid(const std::string& bits, size_t n) {
  if (bits.size() != (n + 7) / 8) return false;
  for (size_t i = n; i < bits.size() * 8; ++i) {
    if (list_bit(bits, i)) return false;
  }
  return true;
}

}  // namespace agora
