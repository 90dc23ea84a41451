#include "agora/obs/log.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

#include "agora/core/clock.h"
#include "agora/core/error.h"

namespace agora::obs {
namespace {

struct LoggerState {
  std::mutex mutex;
  std::string process = "agora";
  LogFormat format = LogFormat::kText;
  std::shared_ptr<spdlog::logger> logger;
};

LoggerState& state() {
  static LoggerState s;
  return s;
}

// spdlog carries the line to stderr (thread-safe, flushed per line); the line is formatted here
// so that the JSON is real JSON (spdlog's patterns cannot escape a message).
std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("agora", std::move(sink));
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::debug);
  logger->flush_on(spdlog::level::debug);
  return logger;
}

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

spdlog::level::level_enum spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

LogFormat parse_log_format(std::string_view text, std::string_view flag) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  fail("{} {}: unknown log format; allowed: text (human lines) or json (one JSON object per line)",
       flag, text);
}

std::string_view to_string(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

void configure_logging(std::string_view process, LogFormat format) {
  LoggerState& s = state();
  std::lock_guard lock(s.mutex);
  s.process = process;
  s.format = format;
  if (!s.logger) s.logger = make_logger();
}

LogFormat log_format() {
  LoggerState& s = state();
  std::lock_guard lock(s.mutex);
  return s.format;
}

std::string format_log_line(LogFormat format, std::string_view process, LogLevel level,
                            const LogContext& context, std::string_view message,
                            double unix_seconds) {
  const int64_t ms = std::llround(unix_seconds * 1000);
  const auto whole = static_cast<std::time_t>(ms / 1000);
  const int millis = static_cast<int>(ms % 1000);
  if (format == LogFormat::kJson) {
    std::tm utc{};
    gmtime_r(&whole, &utc);
    nlohmann::ordered_json j;
    j["ts"] = fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03}Z", utc, millis);
    j["level"] = level_name(level);
    j["msg"] = message;
    if (context.step) j["step"] = *context.step;
    if (!context.peer.empty()) j["peer"] = context.peer;
    j["process"] = process;
    if (!context.event.empty()) {
      j["event"] = context.event;
      for (const LogField& f : context.fields) {
        if (j.contains(f.key)) continue;  // the fixed keys keep their meaning
        std::visit([&](const auto& v) { j[f.key] = v; }, f.value);
      }
    }
    // Invalid UTF-8 (a peer's agent string) must not make the line unwritable.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::tm local{};
  localtime_r(&whole, &local);
  std::string who(process);
  if (!context.peer.empty()) who += " " + context.peer;
  if (context.step) who += fmt::format(" step {}", *context.step);
  return fmt::format("{:%H:%M:%S}.{:03} {:<5} {}: {}", local, millis, level_name(level), who,
                     message);
}

void log(LogLevel level, const LogContext& context, std::string_view message) {
  LoggerState& s = state();
  std::shared_ptr<spdlog::logger> logger;
  std::string line;
  {
    std::lock_guard lock(s.mutex);
    if (!s.logger) s.logger = make_logger();
    logger = s.logger;
    line = format_log_line(s.format, s.process, level, context, message, unix_seconds());
  }
  logger->log(spdlog_level(level), "{}", line);
}

}  // namespace agora::obs
