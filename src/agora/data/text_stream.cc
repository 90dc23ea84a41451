#include "agora/data/text_stream.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "agora/core/error.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 256 * 1024;

// Where the stream's bytes come from, still compressed: a file or a buffer.
class RawSource {
 public:
  virtual ~RawSource() = default;
  // Up to `size` bytes into `out`; 0 only at the end.
  virtual size_t read(char* out, size_t size) = 0;
};

class FileSource final : public RawSource {
 public:
  FileSource(const fs::path& path, std::string name) : name_(std::move(name)) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) fail("cannot open {}: {}", name_, std::strerror(errno));
  }
  ~FileSource() override { std::fclose(file_); }
  size_t read(char* out, size_t size) override {
    const size_t got = std::fread(out, 1, size, file_);
    if (got == 0 && std::ferror(file_)) fail("cannot read {}: {}", name_, std::strerror(errno));
    return got;
  }

 private:
  std::string name_;
  std::FILE* file_ = nullptr;
};

class MemorySource final : public RawSource {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t read(char* out, size_t size) override {
    const size_t take = std::min(size, bytes_.size() - pos_);
    std::memcpy(out, bytes_.data() + pos_, take);
    pos_ += take;
    return take;
  }

 private:
  std::string bytes_;
  size_t pos_ = 0;
};

// Turns the raw bytes into text, a chunk at a time.
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends decompressed bytes to `out`; false when the stream ended cleanly.
  virtual bool decode(std::string& out) = 0;
};

// The raw bytes already read while sniffing, then the rest of the source.
class Input {
 public:
  // `taken` counts the bytes taken (the stream's counter, which stays where it is).
  Input(std::unique_ptr<RawSource> raw, std::string head, uint64_t* taken)
      : raw_(std::move(raw)), head_(std::move(head)), bytes_(taken) {}
  size_t read(char* out, size_t size) {
    if (head_pos_ < head_.size()) {
      const size_t take = std::min(size, head_.size() - head_pos_);
      std::memcpy(out, head_.data() + head_pos_, take);
      head_pos_ += take;
      *bytes_ += take;
      return take;
    }
    const size_t got = raw_->read(out, size);
    *bytes_ += got;
    return got;
  }

 private:
  std::unique_ptr<RawSource> raw_;
  std::string head_;
  size_t head_pos_ = 0;
  uint64_t* bytes_;
};

class PlainDecoder final : public Decoder {
 public:
  explicit PlainDecoder(Input input) : input_(std::move(input)) {}
  bool decode(std::string& out) override {
    const size_t start = out.size();
    out.resize(start + kChunk);
    const size_t got = input_.read(out.data() + start, kChunk);
    out.resize(start + got);
    return got > 0;
  }

 private:
  Input input_;
};

class GzipDecoder final : public Decoder {
 public:
  GzipDecoder(Input input, std::string name) : input_(std::move(input)), name_(std::move(name)) {
    // 16 + MAX_WBITS: a gzip header and trailer (its CRC-32 and length are checked).
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) fail("zlib could not start on {}", name_);
  }
  ~GzipDecoder() override { inflateEnd(&stream_); }

  bool decode(std::string& out) override {
    for (;;) {
      // A call that filled its output may hold more (zlib's rule): call again before reading.
      if (stream_.avail_in == 0 && !output_full_) {
        const size_t got = input_.read(in_, sizeof in_);
        if (got == 0) {
          if (member_open_) fail("{} is truncated: its gzip stream ends inside a member", name_);
          return false;
        }
        stream_.next_in = reinterpret_cast<Bytef*>(in_);
        stream_.avail_in = static_cast<uInt>(got);
      }
      if (!member_open_) {
        // Another member follows the one that ended (gzip's concatenation).
        if (inflateReset(&stream_) != Z_OK) fail("zlib could not restart on {}", name_);
        member_open_ = true;
      }
      const size_t start = out.size();
      out.resize(start + kChunk);
      stream_.next_out = reinterpret_cast<Bytef*>(out.data() + start);
      stream_.avail_out = static_cast<uInt>(kChunk);
      const int status = inflate(&stream_, Z_NO_FLUSH);
      output_full_ = stream_.avail_out == 0 && status != Z_STREAM_END;
      out.resize(start + kChunk - stream_.avail_out);
      if (status == Z_STREAM_END) {
        member_open_ = false;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        fail("{} is not a valid gzip stream: {}", name_,
             stream_.msg ? stream_.msg : zError(status));
      }
      if (out.size() > start) return true;
    }
  }

 private:
  Input input_;
  std::string name_;
  z_stream stream_{};
  char in_[kChunk];
  bool member_open_ = true;
  bool output_full_ = false;
};

class ZstdDecoder final : public Decoder {
 public:
  ZstdDecoder(Input input, std::string name)
      : input_(std::move(input)), name_(std::move(name)), context_(ZSTD_createDCtx()) {
    if (!context_) fail("zstd could not start on {}", name_);
  }
  ~ZstdDecoder() override { ZSTD_freeDCtx(context_); }

  bool decode(std::string& out) override {
    for (;;) {
      // A call that filled its output may hold more: call again before reading.
      if (in_.pos == in_.size && !output_full_) {
        const size_t got = input_.read(buffer_, sizeof buffer_);
        if (got == 0) {
          if (frame_open_) fail("{} is truncated: its Zstandard stream ends inside a frame", name_);
          return false;
        }
        in_ = {buffer_, got, 0};
      }
      const size_t start = out.size();
      out.resize(start + kChunk);
      ZSTD_outBuffer target{out.data() + start, kChunk, 0};
      const size_t status = ZSTD_decompressStream(context_, &target, &in_);
      output_full_ = target.pos == target.size && status != 0;
      out.resize(start + target.pos);
      if (ZSTD_isError(status)) {
        fail("{} is not a valid Zstandard stream: {}", name_, ZSTD_getErrorName(status));
      }
      // 0: a frame ended; the next input, if any, starts another.
      frame_open_ = status != 0;
      if (target.pos > 0) return true;
    }
  }

 private:
  Input input_;
  std::string name_;
  ZSTD_DCtx* context_;
  char buffer_[kChunk];
  ZSTD_inBuffer in_{buffer_, 0, 0};
  bool frame_open_ = false;
  bool output_full_ = false;
};

Compression sniff(const std::string& head) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(head[i]); };
  if (head.size() >= 2 && byte(0) == 0x1f && byte(1) == 0x8b) return Compression::kGzip;
  if (head.size() >= 4 && byte(0) == 0x28 && byte(1) == 0xb5 && byte(2) == 0x2f &&
      byte(3) == 0xfd) {
    return Compression::kZstd;
  }
  return Compression::kNone;
}

}  // namespace

const char* to_string(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kGzip:
      return "gzip";
    case Compression::kZstd:
      return "zstd";
  }
  return "?";
}

class TextStream::Impl {
 public:
  Impl(std::unique_ptr<RawSource> raw, std::string name) : name_(name) {
    std::string head(4, '\0');
    size_t got = 0;
    while (got < head.size()) {
      const size_t n = raw->read(head.data() + got, head.size() - got);
      if (n == 0) break;
      got += n;
    }
    head.resize(got);
    compression_ = sniff(head);
    Input input(std::move(raw), std::move(head), &input_bytes_read_);
    switch (compression_) {
      case Compression::kNone:
        decoder_ = std::make_unique<PlainDecoder>(std::move(input));
        break;
      case Compression::kGzip:
        decoder_ = std::make_unique<GzipDecoder>(std::move(input), std::move(name));
        break;
      case Compression::kZstd:
        decoder_ = std::make_unique<ZstdDecoder>(std::move(input), std::move(name));
        break;
    }
  }

  Line next_line(std::string& line, size_t max_line) {
    bool too_long = false;
    size_t checked = 0;  // bytes after pos_ known to hold no newline
    for (;;) {
      const size_t newline = buffer_.find('\n', pos_ + checked);
      const size_t end = newline == std::string::npos ? buffer_.size() : newline;
      if (end - pos_ > max_line) too_long = true;
      if (newline != std::string::npos) {
        bytes_read_ += newline + 1 - pos_;
        if (too_long) {
          line.clear();
        } else {
          line.assign(buffer_, pos_, newline - pos_);
        }
        pos_ = newline + 1;
        return too_long ? Line::kTooLong : Line::kLine;
      }
      if (too_long) {
        // Forget what is held of a line that is already too long, and read on to its end.
        bytes_read_ += buffer_.size() - pos_;
        buffer_.clear();
        pos_ = 0;
      }
      compact();
      checked = buffer_.size();
      if (!decoder_->decode(buffer_)) {
        const size_t rest = buffer_.size() - pos_;
        bytes_read_ += rest;
        if (too_long) {
          line.clear();
        } else {
          line.assign(buffer_, pos_, rest);
        }
        pos_ = buffer_.size();
        if (too_long) return Line::kTooLong;
        return rest == 0 ? Line::kEnd : Line::kLine;
      }
    }
  }

  std::string read_all(size_t max_bytes) {
    compact();
    while (decoder_->decode(buffer_)) {
      if (buffer_.size() > max_bytes) {
        fail("{} holds more than {} bytes of text, the most one document may have", name_,
             max_bytes);
      }
    }
    if (buffer_.size() > max_bytes) {
      fail("{} holds more than {} bytes of text, the most one document may have", name_, max_bytes);
    }
    std::string all = std::move(buffer_);
    buffer_.clear();
    pos_ = 0;
    bytes_read_ += all.size();
    return all;
  }

  Compression compression() const { return compression_; }
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t input_bytes_read() const { return input_bytes_read_; }

 private:
  void compact() {
    if (pos_ == 0) return;
    buffer_.erase(0, pos_);
    pos_ = 0;
  }

  std::string name_;
  Compression compression_ = Compression::kNone;
  std::unique_ptr<Decoder> decoder_;
  std::string buffer_;
  size_t pos_ = 0;
  uint64_t bytes_read_ = 0;
  uint64_t input_bytes_read_ = 0;
};

TextStream TextStream::open(const fs::path& path) {
  return TextStream(
      std::make_unique<Impl>(std::make_unique<FileSource>(path, path.string()), path.string()));
}

TextStream TextStream::from_bytes(std::string bytes, std::string name) {
  return TextStream(
      std::make_unique<Impl>(std::make_unique<MemorySource>(std::move(bytes)), std::move(name)));
}

TextStream::TextStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TextStream::TextStream(TextStream&&) noexcept = default;
TextStream& TextStream::operator=(TextStream&&) noexcept = default;
TextStream::~TextStream() = default;

Compression TextStream::compression() const {
  return impl_->compression();
}

TextStream::Line TextStream::next_line(std::string& line, size_t max_line) {
  return impl_->next_line(line, max_line);
}

std::string TextStream::read_all(size_t max_bytes) {
  return impl_->read_all(max_bytes);
}

uint64_t TextStream::bytes_read() const {
  return impl_->bytes_read();
}

uint64_t TextStream::input_bytes_read() const {
  return impl_->input_bytes_read();
}

}  // namespace agora
