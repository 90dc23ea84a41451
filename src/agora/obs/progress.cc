#include "agora/obs/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace agora {

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000.0 && unit < 4) {
    bytes /= 1000.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-:--:--";
  const auto total = static_cast<long long>(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", total / 3600, (total / 60) % 60, total % 60);
}

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  finish();
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(uint64_t amount) {
  const uint64_t done = done_.fetch_add(amount, std::memory_order_relaxed) + amount;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    const int decile = total_ ? static_cast<int>(10 * done / total_) : 10;
    if (decile <= last_decile_) return;
  }
  // Whoever holds the lock draws; others skip rather than wait.
  std::unique_lock lock(draw_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  draw(false);
  last_draw_ = now;
}

void Progress::finish() {
  std::lock_guard lock(draw_mutex_);
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final_line) {
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const double elapsed = std::max(elapsed_seconds(), 1e-9);
  const double rate = done / elapsed;
  const double fraction = total_ ? std::min(1.0, double(done) / total_) : 1.0;
  const bool bytes = unit_ == "B";
  const auto amount = [&](double v) {
    return bytes ? format_bytes(v) : fmt::format("{:.0f} {}", v, unit_);
  };
  const std::string rate_text =
      bytes ? format_bytes(rate) + "/s" : fmt::format("{:.1f} {}/s", rate, unit_);
  std::string line;
  if (final_line) {
    line = fmt::format("{}  {} in {}  ({})", label_, amount(done), format_duration(elapsed),
                       rate_text);
  } else {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(fraction * kWidth);
    const double eta = rate > 0 ? (total_ - std::min(done, total_)) / rate : NAN;
    line = fmt::format("{}  [{}{}]  {:5.1f}%  {}/{}  {}  ETA {}", label_, std::string(filled, '#'),
                       std::string(kWidth - filled, '-'), 100 * fraction, amount(done),
                       amount(total_), rate_text, format_duration(eta));
    last_decile_ = total_ ? static_cast<int>(10 * done / total_) : 10;
  }
  if (tty_) {
    std::fprintf(stderr, "\r\033[2K%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace agora
