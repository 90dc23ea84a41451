// Helpers shared by the state machine's translation units (state_machine.cc,
// state_machine_rounds.cc): conversions to wire messages and log formatting. Internal to coord/;
// not an API.
#pragma once

#include <fmt/format.h>

#include <map>
#include <string>
#include <string_view>

#include "agora/coord/run_state.h"
#include "agora/core/hex.h"
#include "agora/wire/agora.pb.h"

namespace agora::coord::detail {

inline constexpr size_t kHashBytes = 32;
inline constexpr size_t kMaxReasonChars = 200;  // a witness's rejection reason, as logged
// The most a joiner's own throughput estimate counts for (sequences per second) when no active
// member has a throughput yet: far above any machine, and far below where sums of weights
// overflow.
inline constexpr double kMaxJoinEstimate = 1e6;
// A member's heartbeat saying it still waits for the open round has the RoundStart sent again
// at most this often, and not in the round's first seconds, while the first copy is on its way.
inline constexpr double kRoundStartHealSeconds = 5.0;

// "tcp://host:port" with a non-empty host and a port in 1..65535.
inline bool valid_endpoint(std::string_view endpoint) {
  constexpr std::string_view kScheme = "tcp://";
  if (endpoint.size() > 255 || endpoint.substr(0, kScheme.size()) != kScheme) return false;
  const std::string_view rest = endpoint.substr(kScheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view host = rest.substr(0, colon);
  const std::string_view port = rest.substr(colon + 1);
  for (char c : host) {
    if (c <= ' ' || c == '/' || c == 127) return false;
  }
  if (port.empty() || port.size() > 5) return false;
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  return value >= 1 && value <= 65535;
}

// Whether two valid endpoints name the same place: the scheme and host compare without case
// (DNS names are case-insensitive), the port exactly. Different spellings of one address
// (a name and its IP) are not caught; see docs/protocol.md, Known limits.
inline bool same_endpoint(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Untrusted text for a log line: printable ASCII, bounded.
inline std::string printable(std::string_view text, size_t limit = kMaxReasonChars) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= ' ' && c < 127) ? c : '?';
  if (text.size() > limit) out += "...";
  return out;
}

inline bool current(const MemberRecord& m) {
  return m.state == MemberState::kActive || m.state == MemberState::kSyncing;
}

inline void to_wire(const CommitRecord& c, wire::CommitRecord* out) {
  out->set_author(c.author);
  out->set_step(c.step);
  out->set_payload_hash(c.payload_hash);
  out->set_signature(c.signature);
}

inline void to_wire(const StateRecord& s, wire::StateRecord* out) {
  out->set_applied_steps(s.applied_steps);
  out->set_state_hash(s.state_hash);
  for (const std::string& name : s.tensor_names) out->add_tensor_names(name);
  for (const std::string& hash : s.tensor_hashes) out->add_tensor_hashes(hash);
}

inline std::string drop_text(DropReason reason) {
  switch (reason) {
    case DropReason::kStrikes:
      return "too many strikes (missed deadlines or undelivered payloads)";
    case DropReason::kHeartbeatTimeout:
      return "silent past the heartbeat timeout";
    case DropReason::kFailedVerification:
      return "failed spot checks (verify.max_failures)";
    case DropReason::kNone:
      break;
  }
  return "dropped";
}

// The majority hash of one step's reports: the most reporters, ties to the smallest hash (map
// order with a strict >). `count` receives its number of reporters. Empty for no reports.
inline std::string majority_hash(const HashReports& r, std::map<std::string, size_t>* counts,
                                 size_t* count) {
  counts->clear();
  for (const auto& [key, hash] : r.reported) ++(*counts)[hash];
  std::string majority;
  size_t best = 0;
  for (const auto& [hash, n] : *counts) {
    if (n > best) {
      best = n;
      majority = hash;
    }
  }
  *count = best;
  return majority;
}

}  // namespace agora::coord::detail
