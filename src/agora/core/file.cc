#include "agora/core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "agora/core/crash_point.h"
#include "agora/core/error.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

// A name beside `target` that no other writer uses: the process id keeps processes apart and the
// counter keeps this process's writers apart. A file left by a crashed process that had the same
// id can still be in the way; callers create with O_EXCL and ask again.
fs::path temporary_beside(const fs::path& target) {
  static std::atomic<uint64_t> counter{0};
  return fs::path(target.string() + ".tmp." + std::to_string(::getpid()) + "." +
                  std::to_string(counter.fetch_add(1)));
}

}  // namespace

// The file is already complete and in place either way: a folder that refuses is not an error.
void sync_parent_folder(const fs::path& path) {
  fs::path folder = path.parent_path();
  if (folder.empty()) folder = ".";
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {

// Writes all of `data`, at `offset` or (offset < 0) at the file position; false with errno set
// when the system refuses.
bool write_fully(int fd, const void* data, size_t size, off_t offset) {
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        offset < 0 ? ::write(fd, bytes + done, size - done)
                   : ::pwrite(fd, bytes + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}: {}", path.string(), std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("cannot read {}: {}", path.string(), std::strerror(errno));
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// AtomicFile

AtomicFile::AtomicFile(fs::path path, mode_t mode) : path_(std::move(path)) {
  do {
    temporary_ = temporary_beside(path_);
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  } while (fd_ < 0 && errno == EEXIST);
  if (fd_ < 0) fail("cannot create {}: {}", temporary_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  abandon();
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      temporary_(std::move(other.temporary_)),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    temporary_ = std::move(other.temporary_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void AtomicFile::append(const void* data, size_t size) {
  check_open("append to");
  if (!write_fully(fd_, data, size, -1)) abandon_and_fail("write", errno);
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t size) {
  check_open("write to");
  if (!write_fully(fd_, data, size, static_cast<off_t>(offset))) abandon_and_fail("write", errno);
}

void AtomicFile::commit() {
  check_open("commit");
  if (::fsync(fd_) != 0) abandon_and_fail("flush", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    fail("cannot close {}: {}", temporary_.string(), std::strerror(error));
  }
  crash_point("file.before_rename");
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    fail("cannot rename {} to {}: {}", temporary_.string(), path_.string(), std::strerror(error));
  }
  crash_point("file.after_rename");
  sync_parent_folder(path_);
}

void AtomicFile::check_open(const char* operation) const {
  if (fd_ < 0) {
    fail("cannot {} {}: it was committed, or an earlier write failed", operation,
         temporary_.string());
  }
}

void AtomicFile::abandon_and_fail(const char* verb, int error) {
  abandon();
  fail("cannot {} {}: {}", verb, temporary_.string(), std::strerror(error));
}

void AtomicFile::abandon() noexcept {
  if (fd_ < 0) return;
  ::close(std::exchange(fd_, -1));
  ::unlink(temporary_.c_str());
}

// ---------------------------------------------------------------------------------------------

void write_file_atomic(const fs::path& path, std::string_view bytes, mode_t mode) {
  AtomicFile file(path, mode);
  file.append(bytes);
  file.commit();
}

void replace_symlink(const fs::path& link, const fs::path& target) {
  fs::path temporary;
  int made;
  do {
    temporary = temporary_beside(link);
    made = ::symlink(target.c_str(), temporary.c_str());
  } while (made != 0 && errno == EEXIST);
  if (made != 0) {
    fail("cannot create the symlink {} -> {}: {}", temporary.string(), target.string(),
         std::strerror(errno));
  }
  crash_point("symlink.before_rename");
  if (::rename(temporary.c_str(), link.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail("cannot rename {} to {}: {}", temporary.string(), link.string(), std::strerror(error));
  }
  crash_point("symlink.after_rename");
  sync_parent_folder(link);
}

}  // namespace agora
