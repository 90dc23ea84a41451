// Wall-clock time as seconds since the Unix epoch, the one time base of everything agora records
// or shows across processes and restarts: the coordinator's deadlines and events, step rows, log
// timestamps, process start times. Not for measuring durations (use steady_clock): it can jump.
#pragma once

#include <chrono>

namespace agora {

inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace agora
