// Whole-file reads, and writes that replace a file or a symlink atomically. Errors name the path.
//
// How a replacement is atomic (AtomicFile, write_file_atomic, replace_symlink): the new file or
// link is made under a unique temporary name in the target's folder, "<name>.tmp.<pid>.<n>", so
// the rename stays within one file system and two writers aimed at the same path, in one process
// or in several, never touch each other's temporary. The file is flushed with fsync, renamed over
// the target, and then the folder is fsynced so that the rename survives a crash too.
//
// Promises: a reader sees the old file or the new one, never a torn one; of two writers the last
// rename wins, whole. A temporary that is abandoned, or whose writing fails, is removed; one
// whose process is killed stays ("<name>.tmp.<pid>.<n>"; in a checkpoint folder the next
// checkpoint removes it, train/checkpoint.h). Tests kill at file.before_rename, file.after_rename,
// symlink.before_rename and symlink.after_rename (core/crash_point.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace agora {

// The file's bytes. Throws Error naming the path when it cannot be opened or read.
std::string read_file(const std::filesystem::path& path);

// A file written in pieces that replaces `path` when commit() is called. Move-only; not
// thread-safe.
class AtomicFile {
 public:
  // Creates the temporary file with permissions `mode`, less the umask (as open() does). Throws
  // Error naming the temporary when it cannot be created.
  explicit AtomicFile(std::filesystem::path path, mode_t mode = 0644);
  // Removes the temporary unless commit() renamed it into place.
  ~AtomicFile();

  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Writes after what was appended so far.
  void append(const void* data, size_t size);
  void append(std::string_view bytes) { append(bytes.data(), bytes.size()); }
  // Overwrites bytes already appended, e.g. a header whose contents are known last.
  void write_at(uint64_t offset, const void* data, size_t size);

  // fsync, rename over path(), fsync the folder. Every method but the accessors throws Error
  // after commit() or after any failure, which also removes the temporary.
  void commit();

  // False once committed or failed.
  bool is_open() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temporary_path() const { return temporary_; }

 private:
  void check_open(const char* operation) const;
  [[noreturn]] void abandon_and_fail(const char* verb, int error);
  void abandon() noexcept;  // closes and removes the temporary

  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
};

// Writes `bytes` as a new file that replaces `path` (see AtomicFile).
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                       mode_t mode = 0644);

// Makes a rename into the folder that holds `path` durable (fsync of that folder). Best effort:
// some file systems refuse fsync on a folder.
void sync_parent_folder(const std::filesystem::path& path);

// Points the symlink `link` at `target` (stored as given: a relative target is relative to
// link's folder), replacing any link there in one rename, so a reader that follows `link`
// finds the old target or the new one, never nothing. Throws Error naming the link.
void replace_symlink(const std::filesystem::path& link, const std::filesystem::path& target);

}  // namespace agora
