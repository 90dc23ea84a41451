// Error: the one exception type agora throws for failures a user can act on.
//
// A message says what failed, the offending value, and what is allowed or what to do, in plain
// words: "shard data/train_000000.bin: magic is 12345, expected 20240520 (llm.c token shard)".
// Callers at the top (the CLI, a network handler) catch Error, report it, and carry on or exit
// cleanly; nothing below them prints.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace agora {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with a message formatted by fmt.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace agora
