#include "agora/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "agora/core/error.h"

namespace agora {

MappedFile MappedFile::open(const std::filesystem::path& path, std::string_view what) {
  const std::string name = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} {}: {}", what, name, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat {} {}: {}", what, name, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} {}: not a regular file", what, name);
  }
  MappedFile file;
  file.path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    // mmap refuses a length of 0; an empty file simply has no bytes.
    ::close(fd);
    return file;
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
  if (map == MAP_FAILED) fail("cannot map {} {}: {}", what, name, std::strerror(map_err));
  file.data_ = static_cast<const uint8_t*>(map);
  file.size_ = size;
  return file;
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::exchange(other.path_, {})),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::exchange(other.path_, {});
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace agora
