// Little-endian integers in byte buffers: the byte order of everything agora puts on disk or on
// the wire (token shards, safetensors headers, payloads, the bytes a commitment signs).
//
// Bytes are assembled one at a time, so the result is the same on any host and no access is
// ever misaligned; compilers turn the fixed-width forms into single loads and stores on x86 and
// ARM. `p` must point at enough bytes; nothing here checks bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace agora {

inline uint16_t load_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

inline uint64_t load_le64(const uint8_t* p) {
  return uint64_t{load_le32(p)} | uint64_t{load_le32(p + 4)} << 32;
}

inline void store_le16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

inline void store_le32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

inline void store_le64(uint64_t v, uint8_t* p) {
  store_le32(static_cast<uint32_t>(v), p);
  store_le32(static_cast<uint32_t>(v >> 32), p + 4);
}

// For fields whose width is itself data (a payload's position width): the first `n` bytes,
// n <= 8, as an unsigned integer.
inline uint64_t load_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Appends the low `n` bytes of `v`, n <= 8: how a message is built field by field.
inline void append_le(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace agora
