#include "agora/obs/event_log.h"

#include "agora/core/error.h"

namespace agora::obs {

EventLog::EventLog(const std::filesystem::path& path, bool append, std::function<double()> clock)
    : clock_(std::move(clock)) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) fail("cannot write the event log {}", path.string());
}

void EventLog::write(nlohmann::json row) {
  if (!out_.is_open()) return;
  row["elapsed_s"] =
      clock_ ? clock_()
             : std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
  out_ << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
}

}  // namespace agora::obs
