// ByteReader: reads a binary format from untrusted bytes, front to back, and never past the end.
//
// Every read names what it reads and where (the format's part, e.g. "payload tensor 3 [64, 8]"),
// so a truncated input fails with an Error that says which field was cut, at which offset, and
// how many bytes it needed against how many remained. Integers are little-endian
// (core/little_endian.h). The reader does not own the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"

namespace agora {

class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes)
      : data_(reinterpret_cast<const uint8_t*>(bytes.data())), size_(bytes.size()) {}
  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  // The next n bytes. Error when fewer remain.
  const uint8_t* take(uint64_t n, std::string_view where, std::string_view what) {
    if (n > remaining()) {
      fail("{}: truncated: {} needs {} bytes at offset {}, but only {} remain", where, what, n,
           pos_, remaining());
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  // An unsigned little-endian integer of n bytes (1 to 8).
  uint64_t uint(size_t n, std::string_view where, std::string_view what) {
    return load_le(take(n, where, what), n);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace agora
