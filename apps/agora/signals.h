// Ctrl-C and SIGTERM as a flag that long-running commands poll, so they stop at a clean point
// (a peer sends Leave, a coordinator saves its state) instead of dying mid-write.
#pragma once

#include <atomic>

namespace agora::cli {

// Installs the handlers (once) and returns the flag they set.
const std::atomic<bool>& stop_requested();

}  // namespace agora::cli
