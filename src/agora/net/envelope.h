// Envelopes: one protobuf message per ZeroMQ frame, with a size limit per kind of message.
//
// Bytes from the network are untrusted. decode_envelope() parses them and checks the size
// against the limit for the message's kind: control messages (joins, commits, rounds...) are
// small, so a 1 GB "heartbeat" is refused before anyone looks inside; payload blobs and model
// tensors may be as large as the run allows. Anything that does not parse, has no body, or is
// too large comes back as a DecodeFailure (a code to count by, and a reason in plain words) and
// is counted by the caller, never trusted.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "agora/wire/agora.pb.h"

namespace agora::net {

// The largest control message (everything but Blob, TensorData, StageData, Params,
// AsyncDelivery, SwarmPoll, SwarmView and SwarmHop):
// membership lists of a few thousand peers fit with room to spare.
inline constexpr size_t kMaxControlBytes = 1 << 20;
// The largest payload the coordinator relays for a member nobody can dial (coord/relay.h): its
// upload travels on the control connection, so it must fit a control message with its envelope.
inline constexpr size_t kMaxRelayedBlobBytes = kMaxControlBytes - 4096;
// The most bytes of a tensor one relayed chunk carries (GetTensor.holder): half a control
// message, so the name, shape and envelope always fit beside it.
inline constexpr size_t kMaxRelayedChunkBytes = kMaxControlBytes / 2;
// The NotFound.what of a relayed chunk: the fetcher knows which of its requests failed.
inline std::string relayed_chunk_what(std::string_view name, uint64_t offset) {
  return std::string(name) + "@" + std::to_string(offset);
}

// The largest message protobuf parses (its sizes are ints): 2 GiB - 1. A limit above it is
// treated as this, so a frame of 2 GiB or more is refused before it reaches the parser; a role
// whose largest message would not fit refuses to start (fits_one_message).
inline constexpr size_t kMaxEnvelopeBytes = static_cast<size_t>(INT_MAX);

struct DecodeLimits {
  size_t max_control = kMaxControlBytes;
  // Blob, TensorData, StageData, Params, AsyncDelivery and the swarm's SwarmPoll, SwarmView
  // and SwarmHop: one payload, one tensor, one boundary message, one policy, one
  // pseudo-gradient, a stage's DeMo contributions or a micro-batch's activations. 1 GiB holds the
  // largest tensor of the 1b preset (its 393 MiB embedding) with room, and stays far below
  // protobuf's 2 GiB ceiling.
  size_t max_data = size_t{1} << 30;
};

// Why bytes were refused: larger than any message may be, not a protobuf Envelope, an Envelope
// with no body (an unknown kind), or larger than the limit of its kind.
enum class DecodeError { kTooLarge, kUnparsable, kNoBody, kOverLimit };

struct DecodeFailure {
  DecodeError code;
  std::string reason;  // plain words with the sizes involved, for logs
};

// too_large, unparsable, no_body, over_limit: the metrics label of a code.
std::string_view to_token(DecodeError code);

// The message, or why the bytes were refused.
using Decoded = std::variant<wire::Envelope, DecodeFailure>;

Decoded decode_envelope(std::string_view bytes, const DecodeLimits& limits = {});

// Throws Error when `bytes` (the largest message a role must carry, `what`) exceeds
// kMaxEnvelopeBytes, naming both; returns `bytes` otherwise.
size_t fits_one_message(size_t bytes, std::string_view what);
std::string encode_envelope(const wire::Envelope& envelope);

// "commit", "blob", ...: the body's kind, for logs and counters ("empty" when none is set).
std::string kind_name(const wire::Envelope& envelope);

}  // namespace agora::net
