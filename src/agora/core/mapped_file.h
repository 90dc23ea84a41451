// MappedFile: a whole regular file mapped read-only into memory, for readers of large immutable
// files (token shards, checkpoints) that want the bytes without copying them.
//
// Promises:
// - open() either returns a mapping of the entire file or throws an Error that names the path,
//   the kind of file and the problem; the descriptor is closed either way (the mapping keeps the
//   file alive on its own).
// - bytes() stays valid, and unchanged, for as long as the object that returned it lives (moving
//   the object moves the mapping with it; the moved-from object is empty). Destroying the object
//   unmaps the file.
// - The file must not change underneath: replace a mapped file with a rename, never truncate or
//   rewrite it in place, or readers of the vanished pages crash with SIGBUS.
// - A MappedFile is immutable and its const methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace agora {

// A read-only memory map of one whole regular file. Move-only.
class MappedFile {
 public:
  // Maps the file at `path`. `what` names the kind of file in errors:
  // "cannot open shard data/x.bin: No such file or directory". Throws Error when the path cannot
  // be opened, is not a regular file, or cannot be mapped. An empty file is fine: bytes() is then
  // empty.
  static MappedFile open(const std::filesystem::path& path, std::string_view what);

  // Empty: no path, no bytes.
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The whole file; empty for an empty file or an empty (default or moved-from) object.
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // The path given to open(); empty for an empty object.
  const std::filesystem::path& path() const { return path_; }

 private:
  void unmap() noexcept;

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;  // nullptr when nothing is mapped (an empty file included)
  size_t size_ = 0;
};

}  // namespace agora
