// Token shards: llm.c's .bin format, written atomically and read through a memory map.
//
// Layout (every integer little-endian):
//   256 x int32 header: [0] magic 20240520, [1] version (1 = uint16 tokens, 2 = uint32 tokens),
//                       [2] token count; the other 253 ints are zero.
//   count x token      (2 bytes each for version 1, 4 bytes for version 2).
// A FineWeb shard written by llm.c or modded-nanogpt (version 1) opens unchanged, and what
// ShardWriter writes opens in their Python loaders.
//
// Promises:
// - ShardWriter never leaves a torn file at the final path: tokens stream into a temporary file
//   beside it, and finish() writes the header, fsyncs and renames. A writer destroyed before
//   finish() removes its temporary file.
// - ShardReader::open() checks magic, version and that the count matches the file size before
//   it hands out a single token, so any bytes at all are either rejected with an Error that names
//   the file and the problem, or read without touching memory outside the file.
// - A ShardReader is immutable and its const methods are thread-safe. Shards are treated as
//   immutable files: replace one with a rename (as ShardWriter does), never truncate it in place
//   while a reader has it mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "agora/core/file.h"
#include "agora/core/mapped_file.h"
#include "agora/data/tokenizer.h"

namespace agora {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// The header stores the count as an int32.
inline constexpr uint64_t kShardMaxTokens = 0x7fffffff;

// 1 when every id of a vocabulary of `vocab_size` fits in uint16 (vocab_size <= 65536), else 2.
int shard_version_for_vocab(uint32_t vocab_size);

// Streams tokens into a new shard at `path`. Not thread-safe; move-only.
class ShardWriter {
 public:
  // Creates the temporary file beside `path`. Throws Error for a version other than 1 or 2, or
  // when the file cannot be created.
  ShardWriter(std::filesystem::path path, int version);

  ShardWriter(ShardWriter&& other) noexcept = default;
  ShardWriter& operator=(ShardWriter&& other) noexcept = default;
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends `tokens`. All or nothing: a token that does not fit the version (or a count past
  // kShardMaxTokens) throws Error naming the token and its position in the shard, and none of
  // `tokens` is written, so the caller may go on appending.
  void append(std::span<const TokenId> tokens);

  // Writes the header, fsyncs, and renames the file into place (replacing any file there).
  // The writer is closed afterwards; append() and finish() then throw.
  void finish();

  uint64_t num_tokens() const { return num_tokens_; }
  int version() const { return version_; }
  const std::filesystem::path& path() const { return file_.path(); }

 private:
  void flush_buffer();

  int version_ = 0;
  AtomicFile file_;  // the temporary file, renamed into place by finish()
  uint64_t num_tokens_ = 0;
  std::vector<uint8_t> buffer_;  // encoded tokens not yet written
};

// Writes a whole shard at once (through ShardWriter, so atomically).
void write_shard(const std::filesystem::path& path, std::span<const TokenId> tokens, int version);

// A validated, read-only memory map of one shard. Move-only.
class ShardReader {
 public:
  // Maps `path` and validates its header. Throws Error naming the path for a missing or
  // unreadable file, an empty file or one shorter than the header, a bad magic, an unknown
  // version, or a count that disagrees with the file size.
  static ShardReader open(const std::filesystem::path& path);

  ~ShardReader() = default;
  ShardReader(ShardReader&& other) noexcept = default;
  ShardReader& operator=(ShardReader&& other) noexcept = default;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Derived from the mapping, so a moved-from reader (whose mapping moved away) has 0 tokens.
  size_t num_tokens() const {
    const size_t size = file_.bytes().size();
    return size <= kShardHeaderBytes ? 0 : (size - kShardHeaderBytes) >> (version_ == 1 ? 1 : 2);
  }
  int version() const { return version_; }
  const std::filesystem::path& path() const { return file_.path(); }

  // Token `i`; throws Error when i >= num_tokens().
  TokenId token(size_t i) const;
  // Copies tokens [begin, begin + count) to `out`; throws Error when the range leaves the shard.
  void copy(size_t begin, size_t count, TokenId* out) const;

 private:
  ShardReader() = default;

  MappedFile file_;  // the whole file, validated by open()
  int version_ = 0;
};

}  // namespace agora
