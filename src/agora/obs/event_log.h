// EventLog: a file of JSON lines, one event per line, the way every agora process writes what
// happened for tests, benchmarks and operators to read (events.jsonl, rl.jsonl, a worker's
// --log, ...). obs/log.h is for people (stderr, text or JSON); EventLog is for programs.
//
// Promises:
//   - every row gets one time key, "elapsed_s": seconds on the log's clock (by default since the
//     log was opened; a role may give its own, such as the asynchronous run's clock);
//   - every row is one whole line, flushed when written: a reader tailing the file while the
//     process runs sees whole events only (a kill may cut the last line, never an earlier one);
//   - bytes that are not UTF-8 (text a peer sent) are replaced, never thrown on;
//   - a closed log (default-constructed) drops rows: a worker without --log writes nothing.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

namespace agora::obs {

class EventLog {
 public:
  EventLog() = default;
  // Opens `path` (emptied, or appended to when `append`). Error naming the path when it cannot
  // be written.
  explicit EventLog(const std::filesystem::path& path, bool append = false,
                    std::function<double()> clock = {});

  void write(nlohmann::json row);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::function<double()> clock_;
  std::chrono::steady_clock::time_point opened_ = std::chrono::steady_clock::now();
};

}  // namespace agora::obs
