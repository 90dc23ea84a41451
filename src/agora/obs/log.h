// Logging: one logger per process (spdlog), human lines by default, JSON lines on request.
//
// Every diagnostic and event line of `agora coordinator`, `agora peer` and `agora demo` goes
// through here, on stderr, so operators read one format and machines parse the other:
//
//   text:  12:00:01.234 info  peer 487f147b step 12: loss 3.2140  24 seqs  0.41 s
//   json:  {"ts":"2024-05-01T12:00:01.234Z","level":"info","msg":"loss 3.2140 ...","step":12,
//           "peer":"487f147b","process":"peer","event":"trained","loss":3.214,"sequences":24}
//
// What it promises: configure_logging() may be called once per process, before other threads
// log (a second call replaces the format); until then lines come out as text for process
// "agora". Lines are whole (concurrent threads never interleave within a line) and flushed as
// written. "step" and "peer" appear only when the line is about one, "event" and its fields only
// on lines that record one; "ts" is UTC. A field never replaces one of the keys above.
//
// Not for the coordinator's step table or --json rows on stdout: those are the run's output,
// not its log.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace agora::obs {

enum class LogFormat { kText, kJson };

// "text" or "json"; throws Error naming `flag`, the value and what is allowed.
LogFormat parse_log_format(std::string_view text, std::string_view flag = "--log-format");
std::string_view to_string(LogFormat format);

// `process`: what the lines come from ("coordinator", "peer", "demo").
void configure_logging(std::string_view process, LogFormat format);
LogFormat log_format();

// A named value of a structured line: JSON lines carry it as a key of its own, text lines leave
// it to the message.
using LogValue = std::variant<bool, int64_t, uint64_t, double, std::string>;
struct LogField {
  std::string key;
  LogValue value;
};

// What a line is about: the run's step (the coordinator: finalized steps; a peer: the step it
// trained or applied) and the peer's short key. A line that records something a program may act
// on (a peer joined, trained a step, reported its state) names it in `event` and carries its
// numbers in `fields`, so tests and tools read JSON keys instead of parsing the sentence.
struct LogContext {
  LogContext() = default;
  LogContext(std::optional<uint64_t> step_, std::string peer_, std::string event_ = {},
             std::vector<LogField> fields_ = {})
      : step(step_), peer(std::move(peer_)), event(std::move(event_)), fields(std::move(fields_)) {}

  std::optional<uint64_t> step;
  std::string peer;
  std::string event;
  std::vector<LogField> fields;
};

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void log(LogLevel level, const LogContext& context, std::string_view message);
inline void log_info(const LogContext& context, std::string_view message) {
  log(LogLevel::kInfo, context, message);
}
inline void log_warn(const LogContext& context, std::string_view message) {
  log(LogLevel::kWarn, context, message);
}
inline void log_error(const LogContext& context, std::string_view message) {
  log(LogLevel::kError, context, message);
}

// The line as it would be written at `unix_seconds` (for tests; log() stamps the current time).
std::string format_log_line(LogFormat format, std::string_view process, LogLevel level,
                            const LogContext& context, std::string_view message,
                            double unix_seconds);

}  // namespace agora::obs
