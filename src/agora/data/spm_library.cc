#include "agora/data/spm_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "agora/core/error.h"

namespace agora::spm {
namespace {

// RTLD_DEEPBIND makes SentencePiece bind to its own protobuf copy. The sanitizer runtimes
// refuse it (they must interpose malloc everywhere); sanitizer builds carry no libtorch and so
// no second protobuf, and plain RTLD_LOCAL is enough there.
#if defined(__SANITIZE_ADDRESS__)
#define AGORA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AGORA_SANITIZED 1
#endif
#endif
#ifdef AGORA_SANITIZED
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL;
#else
constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif

std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("AGORA_SPM_LIBRARY"); env && *env) paths.push_back(env);
  paths.push_back(AGORA_SPM_LIBRARY);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / "libagora_spm.so").string());
  return paths;
}

Library load_library() {
  std::string tried;
  for (const auto& path : candidates()) {
    if (!std::filesystem::exists(path)) {
      tried += "\n  " + path + ": no such file";
      continue;
    }
    void* handle = dlopen(path.c_str(), kOpenFlags);
    if (!handle) {
      tried += "\n  " + path + ": " + dlerror();
      continue;
    }
    const auto symbol = [&](const char* name) {
      void* address = dlsym(handle, name);
      if (!address) fail("SentencePiece bridge {} lacks {}; rebuild agora", path, name);
      return address;
    };
    Library lib;
    lib.load = reinterpret_cast<decltype(lib.load)>(symbol("agora_spm_load"));
    lib.release = reinterpret_cast<decltype(lib.release)>(symbol("agora_spm_release"));
    lib.piece_size = reinterpret_cast<decltype(lib.piece_size)>(symbol("agora_spm_piece_size"));
    lib.eos_id = reinterpret_cast<decltype(lib.eos_id)>(symbol("agora_spm_eos_id"));
    lib.encode = reinterpret_cast<decltype(lib.encode)>(symbol("agora_spm_encode"));
    lib.decode = reinterpret_cast<decltype(lib.decode)>(symbol("agora_spm_decode"));
    lib.train = reinterpret_cast<decltype(lib.train)>(symbol("agora_spm_train"));
    return lib;  // the handle stays open for the life of the process
  }
  fail(
      "cannot load the SentencePiece bridge libagora_spm.so; tried:{}\n"
      "build it (make build) or point AGORA_SPM_LIBRARY at it",
      tried);
}

}  // namespace

const Library& library() {
  static const Library lib = load_library();
  return lib;
}

}  // namespace agora::spm
