#include "agora/core/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "agora/core/error.h"

namespace agora {
namespace {

// Kept in the order of the header's list, which documents each.
constexpr std::array<std::string_view, 30> kCrashPoints = {
    "service.before_save",      "service.final_unsaved",
    "store.save.begin",         "store.save.after_begin",
    "store.save.after_state",   "store.save.after_ledger",
    "store.save.after_members", "store.save.after_reports",
    "store.save.before_commit", "store.save.after_commit",
    "service.after_save",       "service.final_saved",
    "service.mid_send",         "store.bind.before_commit",
    "checkpoint.begin",         "checkpoint.after_weights",
    "checkpoint.after_tmp",     "checkpoint.after_aside",
    "checkpoint.after_rename",  "checkpoint.after_sync",
    "file.before_rename",       "file.after_rename",
    "symlink.before_rename",    "symlink.after_rename",
    "stage.after_step",         "stage.checkpoint.after_state",
    "async_server.before_save", "async_store.tensors_written",
    "async_server.after_save",  "swarm_server.after_save",
};

bool known(std::string_view point) {
  return std::find(kCrashPoints.begin(), kCrashPoints.end(), point) != kCrashPoints.end();
}

[[noreturn]] void bad_value(std::string_view text, std::string_view why) {
  fail(
      "AGORA_CRASH_AT=\"{}\": {}; the allowed form is NAME or NAME:N (N >= 1, the N-th pass "
      "kills), NAME one of the crash points in src/agora/core/crash_point.h (e.g. "
      "store.save.after_begin:3); unset it to run normally",
      text, why);
}

// The parsed variable, read once; nullopt when unset. A malformed value throws on every call, so
// that whichever of check_crash_at() and crash_point() comes first reports it.
const std::optional<CrashAt>& armed() {
  static const std::optional<CrashAt> value = []() -> std::optional<CrashAt> {
    const char* text = std::getenv("AGORA_CRASH_AT");
    if (text == nullptr) return std::nullopt;
    return parse_crash_at(text);
  }();
  return value;
}

}  // namespace

CrashAt parse_crash_at(std::string_view text) {
  if (text.empty()) bad_value(text, "it is empty");
  CrashAt out;
  const size_t colon = text.rfind(':');
  out.point = std::string(text.substr(0, colon));
  if (colon != std::string_view::npos) {
    const std::string_view count = text.substr(colon + 1);
    const char* end = count.data() + count.size();
    const auto [ptr, ec] = std::from_chars(count.data(), end, out.hit);
    if (count.empty() || ec != std::errc() || ptr != end || out.hit == 0) {
      bad_value(text, fmt::format("the count '{}' is not a whole number >= 1", count));
    }
  }
  if (!known(out.point)) bad_value(text, fmt::format("'{}' is not a crash point", out.point));
  return out;
}

std::span<const std::string_view> crash_points() {
  return kCrashPoints;
}

void check_crash_at() {
  (void)armed();
}

void crash_point(std::string_view point) {
  const std::optional<CrashAt>& at = armed();
  if (!at) return;
  if (!known(point)) fail("crash_point(\"{}\") is not listed in kCrashPoints", point);
  if (point != at->point) return;
  static std::atomic<uint64_t> passes{0};
  const uint64_t n = passes.fetch_add(1) + 1;
  if (n != at->hit) return;
  // write(2), not stdio: nothing buffered may be flushed on the way out, as in a real kill.
  const std::string line = fmt::format("crash point {} hit {}: SIGKILL\n", point, n);
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
  ::pause();  // SIGKILL cannot be caught; this is never reached
}

}  // namespace agora
