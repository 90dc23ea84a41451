// What a peer's network side counts: bytes by kind, payloads fetched and rejected by reason,
// malformed messages dropped. Read by the peer's metrics and its closing summary.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace agora::peer {

// What travels: payloads (GetBlob, Blob), model state (GetTensor, TensorData) and control (the
// coordinator's connection, NotFound answers).
enum class Traffic { kPayload = 0, kState = 1, kControl = 2 };
inline constexpr const char* kTrafficNames[] = {"payload", "state", "control"};

// Why a fetched payload was refused: its bytes did not hash to the commitment (that source is
// skipped, the next is asked), the author's signature did not verify, the strategy's layout
// check failed, or no source served it.
enum class Rejection { kHash = 0, kSignature = 1, kLayout = 2, kUnavailable = 3 };
inline constexpr const char* kRejectionNames[] = {"hash", "signature", "layout", "unavailable"};

struct NetworkCounters {
  uint64_t bytes_sent = 0, bytes_received = 0;                 // every kind
  std::array<uint64_t, 3> sent_by_kind{}, received_by_kind{};  // indexed by Traffic
  uint64_t payloads_fetched = 0, payloads_rejected = 0, dropped_messages = 0;
  std::array<uint64_t, 4> rejected_by_reason{};       // indexed by Rejection
  std::map<std::string, uint64_t> dropped_by_reason;  // net::Server::drops_by_reason() tokens
};

}  // namespace agora::peer
