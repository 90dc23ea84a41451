// Progress: a live progress line for long work, with rate and ETA.
//
// On a terminal it redraws one line on stderr at most ten times a second:
//   tokenize  [#########-----------]  45.2%  5.9/13.1 MB  12.3 MB/s  ETA 0:00:04
// When stderr is not a terminal (CI logs, pipes) it prints a plain line every 10% instead, so
// logs stay readable. add() is thread-safe and cheap; workers call it as they finish pieces.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace agora {

class Progress {
 public:
  // `unit` "B" formats amounts as bytes (KB, MB, ...); anything else is printed after a count.
  Progress(std::string label, uint64_t total, std::string unit = "B");
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t amount);
  // Prints the final line (100%, mean rate, elapsed time). Called by the destructor if needed.
  void finish();

  double elapsed_seconds() const;

 private:
  void draw(bool final_line);

  const std::string label_;
  const uint64_t total_;
  const std::string unit_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::mutex draw_mutex_;
  std::chrono::steady_clock::time_point last_draw_;
  int last_decile_ = -1;
  bool finished_ = false;
};

// "13.1 MB", "512 B", "1.2 GB": decimal units, as rates are usually quoted.
std::string format_bytes(double bytes);
// "0:01:05" for 65 seconds.
std::string format_duration(double seconds);

}  // namespace agora
