// Fuzzes ShardReader: any bytes must be rejected with an Error or read without leaving the file.
//
// The input goes to a file (ShardReader maps files, not buffers); the path is per process and
// reused, so parallel fuzzing jobs do not collide and no files pile up. An accepted shard is read
// whole, token by token and in ranges, so a read past the mapping trips AddressSanitizer or
// faults; a few sampler windows over it exercise Sampler's arithmetic too.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/data/sampler.h"
#include "agora/data/shard.h"

namespace {

// Never destroyed, so the exit handler that removes the file can still read it.
const std::string& input_path() {
  static const std::string* path = [] {
    auto* p = new std::string("/tmp/agora_shard_fuzz." + std::to_string(::getpid()) + ".bin");
    std::atexit([] { ::unlink(input_path().c_str()); });
    return p;
  }();
  return *path;
}

bool write_input(const uint8_t* data, size_t size) {
  const int fd = ::open(input_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();  // the harness itself is broken, not the code under test
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_input(data, size);
  try {
    auto reader =
        std::make_shared<const agora::ShardReader>(agora::ShardReader::open(input_path()));
    const size_t n = reader->num_tokens();
    uint64_t sum = 0;
    for (size_t i = 0; i < n; ++i) sum += reader->token(i);
    std::vector<agora::TokenId> all(n);
    reader->copy(0, n, all.data());
    for (size_t i = 0; i < n; ++i) {
      if (all[i] != reader->token(i)) std::abort();
    }
    // The last byte of the input picks a sequence length; windows must stay inside the shard.
    if (n >= 2 && size > 0) {
      const uint32_t seq_len = 1 + data[size - 1] % 16;
      if (n >= seq_len + 1) {
        const agora::Sampler sampler({reader}, seq_len, sum);
        std::vector<agora::TokenId> window(sampler.window_tokens());
        for (uint64_t q = 0; q < 8; ++q) sampler.read(q * 7919, window.data());
      }
    }
  } catch (const agora::Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
  return 0;
}
