#include "agora/data/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "agora/core/error.h"

namespace agora {
namespace {

// Bytes are assembled one at a time so the format is little-endian on any host and no load is
// ever misaligned; compilers turn these into single loads and stores on x86 and ARM.
uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

uint16_t load_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

void store_le32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

size_t token_bytes(int version) {
  return version == 1 ? 2 : 4;
}

const char* token_type(int version) {
  return version == 1 ? "uint16" : "uint32";
}

// Flush to disk in chunks of this size; large enough that write() calls are cheap.
constexpr size_t kWriteBufferBytes = size_t{1} << 20;

void write_all(int fd, const uint8_t* data, size_t size, off_t offset,
               const std::filesystem::path& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write {}: {}", path.string(), std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int shard_version_for_vocab(uint32_t vocab_size) {
  return vocab_size <= 65536 ? 1 : 2;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(std::filesystem::path path, int version)
    : path_(std::move(path)), version_(version) {
  if (version != 1 && version != 2) {
    fail("shard {}: version {} is not supported; use 1 (uint16 tokens) or 2 (uint32 tokens)",
         path_.string(), version);
  }
  // A unique name beside the final path: the rename stays within one file system, and two
  // writers aimed at the same path do not write into each other's file.
  std::string tmpl = path_.string() + ".tmp.XXXXXX";
  fd_ = ::mkstemp(tmpl.data());
  if (fd_ < 0) fail("cannot create a temporary file {}: {}", tmpl, std::strerror(errno));
  tmp_path_ = tmpl;
  // mkstemp makes the file private (0600); a shard is ordinary data.
  if (::fchmod(fd_, 0644) != 0) {
    const int err = errno;
    abandon();
    fail("cannot set permissions of {}: {}", tmpl, std::strerror(err));
  }
  // Room for the header, which finish() fills once the count is known. Until then the magic is
  // zero, so nobody mistakes the temporary file for a finished shard.
  buffer_.reserve(kWriteBufferBytes);
  buffer_.assign(kShardHeaderBytes, 0);
}

ShardWriter::~ShardWriter() {
  abandon();
}

ShardWriter::ShardWriter(ShardWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      version_(other.version_),
      fd_(std::exchange(other.fd_, -1)),
      num_tokens_(other.num_tokens_),
      buffer_(std::move(other.buffer_)) {}

ShardWriter& ShardWriter::operator=(ShardWriter&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    version_ = other.version_;
    fd_ = std::exchange(other.fd_, -1);
    num_tokens_ = other.num_tokens_;
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

void ShardWriter::abandon() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_path_.c_str());
}

void ShardWriter::append(std::span<const TokenId> tokens) {
  if (fd_ < 0) fail("shard {}: append() after the writer was finished or failed", path_.string());
  if (tokens.size() > kShardMaxTokens - num_tokens_) {
    fail("shard {}: {} + {} tokens exceed the format's limit of {} tokens per shard",
         path_.string(), num_tokens_, tokens.size(), kShardMaxTokens);
  }
  // Check everything first so a rejected call writes nothing.
  if (version_ == 1) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xffff) {
        fail(
            "shard {}: token {} at position {} does not fit version 1 (uint16, ids up to 65535); "
            "write version 2 for vocabularies above 65536",
            path_.string(), tokens[i], num_tokens_ + i);
      }
    }
  }
  const size_t width = token_bytes(version_);
  for (const TokenId token : tokens) {
    if (buffer_.size() + width > kWriteBufferBytes) flush_buffer();
    uint8_t bytes[4];
    store_le32(token, bytes);
    buffer_.insert(buffer_.end(), bytes, bytes + width);
  }
  num_tokens_ += tokens.size();
}

void ShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  try {
    if (end < 0) fail("cannot seek in {}: {}", tmp_path_.string(), std::strerror(errno));
    write_all(fd_, buffer_.data(), buffer_.size(), end, tmp_path_);
  } catch (...) {
    abandon();
    throw;
  }
  buffer_.clear();
}

void ShardWriter::finish() {
  if (fd_ < 0) fail("shard {}: finish() after the writer was finished or failed", path_.string());
  flush_buffer();
  uint8_t header[kShardHeaderBytes] = {};
  store_le32(static_cast<uint32_t>(kShardMagic), header);
  store_le32(static_cast<uint32_t>(version_), header + 4);
  store_le32(static_cast<uint32_t>(num_tokens_), header + 8);
  try {
    write_all(fd_, header, sizeof(header), 0, tmp_path_);
    if (::fsync(fd_) != 0) fail("cannot flush {}: {}", tmp_path_.string(), std::strerror(errno));
  } catch (...) {
    abandon();
    throw;
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    fail("cannot close {}: {}", tmp_path_.string(), std::strerror(err));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    fail("cannot rename {} to {}: {}", tmp_path_.string(), path_.string(), std::strerror(err));
  }
  // Make the rename itself durable. Best effort: some file systems refuse fsync on a folder,
  // and the shard is already complete and in place either way.
  std::filesystem::path dir = path_.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_shard(const std::filesystem::path& path, std::span<const TokenId> tokens, int version) {
  ShardWriter writer(path, version);
  writer.append(tokens);
  writer.finish();
}

// ---------------------------------------------------------------------------------------------
// ShardReader

ShardReader ShardReader::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  ShardReader reader;
  reader.file_ = MappedFile::open(path, "shard");
  const std::span<const uint8_t> bytes = reader.file_.bytes();
  const uint64_t size = bytes.size();
  if (size == 0) fail("shard {}: the file is empty; a shard starts with a 1024-byte header", name);
  if (size < kShardHeaderBytes) {
    fail("shard {}: the file has {} bytes, shorter than the 1024-byte header of a token shard",
         name, size);
  }
  const int32_t magic = static_cast<int32_t>(load_le32(bytes.data()));
  const int32_t version = static_cast<int32_t>(load_le32(bytes.data() + 4));
  const int32_t count = static_cast<int32_t>(load_le32(bytes.data() + 8));
  if (magic != kShardMagic) {
    fail("shard {}: magic is {}, expected {} (llm.c token shard)", name, magic, kShardMagic);
  }
  if (version != 1 && version != 2) {
    fail("shard {}: version is {}, expected 1 (uint16 tokens) or 2 (uint32 tokens)", name, version);
  }
  if (count < 0) fail("shard {}: header says {} tokens; a count cannot be negative", name, count);
  const uint64_t body = size - kShardHeaderBytes;
  const uint64_t expected = static_cast<uint64_t>(count) * token_bytes(version);
  if (body != expected) {
    fail(
        "shard {}: header says {} tokens ({} bytes of {}) but the file has {} bytes after its "
        "1024-byte header",
        name, count, expected, token_type(version), body);
  }
  // num_tokens() is derived from the size, which the check above just tied to `count`.
  reader.version_ = version;
  return reader;
}

TokenId ShardReader::token(size_t i) const {
  const size_t num_tokens = this->num_tokens();
  if (i >= num_tokens) {
    fail("shard {}: token index {} is out of range; the shard has {} tokens", path().string(), i,
         num_tokens);
  }
  const uint8_t* tokens = file_.bytes().data() + kShardHeaderBytes;
  return version_ == 1 ? load_le16(tokens + 2 * i) : load_le32(tokens + 4 * i);
}

void ShardReader::copy(size_t begin, size_t count, TokenId* out) const {
  // Written so that begin + count cannot overflow.
  const size_t num_tokens = this->num_tokens();
  if (begin > num_tokens || count > num_tokens - begin) {
    fail("shard {}: tokens [{}, {}+{}) are out of range; the shard has {} tokens", path().string(),
         begin, begin, count, num_tokens);
  }
  const uint8_t* tokens = file_.bytes().data() + kShardHeaderBytes;
  if (version_ == 1) {
    for (size_t i = 0; i < count; ++i) out[i] = load_le16(tokens + 2 * (begin + i));
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = load_le32(tokens + 4 * (begin + i));
  }
}

}  // namespace agora
