// Helpers shared by the I/O thread's files (peer_network.cc, peer_fetch.cc). Internal.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "agora/peer/network_counters.h"
#include "agora/wire/agora.pb.h"

namespace agora::peer::detail {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

inline Traffic traffic_of(const wire::Envelope& m) {
  if (m.has_get_blob() || m.has_blob()) return Traffic::kPayload;
  if (m.has_get_tensor() || m.has_tensor_data()) return Traffic::kState;
  return Traffic::kControl;
}

// A connection is one member at one endpoint: two members claiming the same endpoint get two.
// The endpoint comes first and ends at a NUL (the coordinator admits no control characters in
// an endpoint; a raw key may hold any byte).
inline std::string connection_id(const wire::Member& m) {
  return m.endpoint() + '\0' + m.key();
}
inline std::string endpoint_of(const std::string& connection) {
  return connection.substr(0, connection.find('\0'));
}

// Text another member chose (an endpoint, a tensor name) as it may appear in a log line or an
// error: printable ASCII, bounded, so it cannot forge lines or drive the terminal.
inline std::string printable(std::string_view text, size_t limit = 160) {
  std::string out;
  for (char c : text.substr(0, limit)) out += (c >= ' ' && c < 127) ? c : '?';
  if (text.size() > limit) out += "...";
  return out;
}

}  // namespace agora::peer::detail
