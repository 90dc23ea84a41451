#include "agora/data/shard.h"

#include <string>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"
#include "agora/data/chunk_source.h"

namespace agora {
namespace {

size_t token_bytes(int version) {
  return version == 1 ? 2 : 4;
}

// Tokens [begin, begin + count) of a shard in a folder that fills in as it is read are fetched
// (and checked) before they are read; elsewhere this is one atomic load.
void ensure_present(const ShardReader& shard, size_t begin, size_t count) {
  if (const auto source = chunk_source_for(shard.path())) {
    const uint64_t width = token_bytes(shard.version());
    source->ensure(shard.path().filename().string(), kShardHeaderBytes + begin * width,
                   kShardHeaderBytes + (begin + count) * width);
  }
}

const char* token_type(int version) {
  return version == 1 ? "uint16" : "uint32";
}

// Flush to disk in chunks of this size; large enough that write() calls are cheap.
constexpr size_t kWriteBufferBytes = size_t{1} << 20;

int checked_version(const std::filesystem::path& path, int version) {
  if (version != 1 && version != 2) {
    fail("shard {}: version {} is not supported; use 1 (uint16 tokens) or 2 (uint32 tokens)",
         path.string(), version);
  }
  return version;
}

}  // namespace

int shard_version_for_vocab(uint32_t vocab_size) {
  return vocab_size <= 65536 ? 1 : 2;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(std::filesystem::path path, int version)
    : version_(checked_version(path, version)), file_(std::move(path)) {
  // Room for the header, which finish() fills once the count is known. Until then the magic is
  // zero, so nobody mistakes the temporary file for a finished shard.
  buffer_.reserve(kWriteBufferBytes);
  buffer_.assign(kShardHeaderBytes, 0);
}

void ShardWriter::append(std::span<const TokenId> tokens) {
  if (!file_.is_open()) {
    fail("shard {}: append() after the writer was finished or failed", path().string());
  }
  if (tokens.size() > kShardMaxTokens - num_tokens_) {
    fail("shard {}: {} + {} tokens exceed the format's limit of {} tokens per shard",
         path().string(), num_tokens_, tokens.size(), kShardMaxTokens);
  }
  // Check everything first so a rejected call writes nothing.
  if (version_ == 1) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xffff) {
        fail(
            "shard {}: token {} at position {} does not fit version 1 (uint16, ids up to 65535); "
            "write version 2 for vocabularies above 65536",
            path().string(), tokens[i], num_tokens_ + i);
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
  file_.append(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void ShardWriter::finish() {
  if (!file_.is_open()) {
    fail("shard {}: finish() after the writer was finished or failed", path().string());
  }
  flush_buffer();
  uint8_t header[kShardHeaderBytes] = {};
  store_le32(static_cast<uint32_t>(kShardMagic), header);
  store_le32(static_cast<uint32_t>(version_), header + 4);
  store_le32(static_cast<uint32_t>(num_tokens_), header + 8);
  file_.write_at(0, header, sizeof(header));
  file_.commit();
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
  // A folder that fills in as it is read (data/chunk_source.h) fetches the header first.
  if (const auto source = chunk_source_for(path)) {
    source->ensure(path.filename().string(), 0, kShardHeaderBytes);
  }
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
  ensure_present(*this, i, 1);
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
  ensure_present(*this, begin, count);
  const uint8_t* tokens = file_.bytes().data() + kShardHeaderBytes;
  if (version_ == 1) {
    for (size_t i = 0; i < count; ++i) out[i] = load_le16(tokens + 2 * (begin + i));
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = load_le32(tokens + 4 * (begin + i));
  }
}

}  // namespace agora
