// Test inputs compressed the way corpora come: gzip (zlib) and Zstandard (libzstd) bytes.
#pragma once

#include <zlib.h>
#include <zstd.h>

#include <stdexcept>
#include <string>

namespace agora::testing_compress {

// One gzip member holding `text`.
inline std::string gzip(const std::string& text, int level = 6) {
  z_stream stream{};
  if (deflateInit2(&stream, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2");
  }
  std::string out(deflateBound(&stream, text.size()), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// One Zstandard frame holding `text`.
inline std::string zstd(const std::string& text, int level = 3) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t size = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), level);
  if (ZSTD_isError(size)) throw std::runtime_error(ZSTD_getErrorName(size));
  out.resize(size);
  return out;
}

}  // namespace agora::testing_compress
