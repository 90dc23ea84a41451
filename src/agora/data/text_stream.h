// Reads a corpus file as a stream of lines or as one text, decompressing it on the way.
//
// Corpora come compressed: gzip (.gz, read with zlib) and Zstandard (.zst, read with libzstd).
// The compression is recognised by the stream's first bytes (gzip 1f 8b, Zstandard 28 b5 2f fd),
// not by the file's name, so a misnamed file still reads right; anything else is read as it is.
//
// Promises:
// - Memory is bounded by the caller's limit, never by the input: a line longer than `max_line`
//   is read through to its end and reported as too long, not held; read_all() stops with an
//   Error past its limit, so a small compressed file that expands without end (a bomb) cannot
//   exhaust memory. Zstandard frames may ask for a window of at most 2^27 bytes (zstd's default
//   limit); a larger one is an Error.
// - A damaged or truncated stream is an Error naming the file and what was wrong (zlib's or
//   zstd's own words), never a silent end: a gzip member or Zstandard frame cut short is
//   "truncated". Concatenated gzip members and Zstandard frames are read one after another, as
//   the gzip and zstd tools do.
// - Lines are split at "\n" only, which is dropped; a last line without one is still a line. A
//   "\r" before it stays (callers that want it gone strip it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace agora {

enum class Compression { kNone, kGzip, kZstd };

const char* to_string(Compression compression);

class TextStream {
 public:
  enum class Line { kLine, kTooLong, kEnd };

  // Opens `path` (an Error names it when it cannot be read).
  static TextStream open(const std::filesystem::path& path);
  // The same over bytes in memory (fuzzing, tests); `name` is what errors call it.
  static TextStream from_bytes(std::string bytes, std::string name);

  TextStream(TextStream&&) noexcept;
  TextStream& operator=(TextStream&&) noexcept;
  ~TextStream();

  Compression compression() const;

  // The next line into `line`. kTooLong: a line longer than `max_line` bytes was skipped
  // (`line` is then empty); kEnd: nothing is left.
  Line next_line(std::string& line, size_t max_line);

  // Everything not read yet, decompressed; an Error past `max_bytes`.
  std::string read_all(size_t max_bytes);

  // Decompressed bytes handed out so far (lines count their "\n").
  uint64_t bytes_read() const;
  // Bytes taken from the file so far, as stored (compressed for a compressed file).
  uint64_t input_bytes_read() const;

 private:
  class Impl;
  explicit TextStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agora
