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

// Why this peer's server answered a request with no data: the sender is not a current member of
// the run, it or its connection asked faster than allowed, its connection's reply queue or the
// server's bytes in flight were full, or the request was malformed (a hash that is not 32 bytes,
// a name that is too long, a kind peers never ask for).
enum class Refusal {
  kNotMember = 0,
  kMemberRate = 1,
  kConnectionRate = 2,
  kReplyQueue = 3,
  kBytesInFlight = 4,
  kBadRequest = 5
};
inline constexpr const char* kRefusalNames[] = {"not_member",  "member_rate",     "connection_rate",
                                                "reply_queue", "bytes_in_flight", "bad_request"};
inline constexpr size_t kRefusals = 6;

struct NetworkCounters {
  uint64_t bytes_sent = 0, bytes_received = 0;                 // every kind
  std::array<uint64_t, 3> sent_by_kind{}, received_by_kind{};  // indexed by Traffic
  uint64_t payloads_fetched = 0, payloads_rejected = 0, dropped_messages = 0;
  std::array<uint64_t, 4> rejected_by_reason{};         // indexed by Rejection
  std::map<std::string, uint64_t> dropped_by_reason;    // net::Server::drops_by_reason() tokens
  std::array<uint64_t, kRefusals> refused_by_reason{};  // requests to our server, by Refusal
  // Witnesses sent by their deadline with payloads still being fetched; payloads accepted after
  // their step's Witness went out (kept for apply); replies nobody asked for (dropped).
  uint64_t witnesses_early = 0, payloads_late = 0, unsolicited_replies = 0;
  // Chunks of model state through the coordinator's relay (coord/tensor_relay.h): fetched by
  // this peer as a joiner, and served by it as a holder nobody can dial.
  uint64_t relay_chunks_fetched = 0, relay_chunks_served = 0;
  // zmq errors the I/O thread caught and survived.
  uint64_t io_errors = 0;
  // Fetch connections open now (to other members; closed when idle or their member left).
  uint64_t connections_open = 0;
};

}  // namespace agora::peer
