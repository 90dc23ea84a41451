// Envelopes: one protobuf message per ZeroMQ frame, with a size limit per kind of message.
//
// Bytes from the network are untrusted. decode_envelope() parses them and checks the size
// against the limit for the message's kind: control messages (joins, commits, rounds...) are
// small, so a 1 GB "heartbeat" is refused before anyone looks inside; payload blobs and model
// tensors may be as large as the run allows. Anything that does not parse, has no body, or is
// too large comes back as an error string and is counted by the caller, never trusted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "agora/wire/agora.pb.h"

namespace agora::net {

// The largest control message (everything but Blob and TensorData): membership lists of a few
// thousand peers fit with room to spare.
inline constexpr size_t kMaxControlBytes = 1 << 20;

struct DecodeLimits {
  size_t max_control = kMaxControlBytes;
  // Blob and TensorData: one payload or one tensor. 1 GiB holds the largest tensor of the 1b
  // preset (its 393 MiB embedding) with room, and stays far below protobuf's 2 GiB ceiling.
  size_t max_data = size_t{1} << 30;
};

// The message, or a plain-words reason why the bytes were refused.
using Decoded = std::variant<wire::Envelope, std::string>;

Decoded decode_envelope(std::string_view bytes, const DecodeLimits& limits = {});
// A short fixed token for a reason decode_envelope() gave, for metrics labels: too_large,
// unparsable, no_body or over_limit.
std::string_view decode_failure_token(std::string_view reason);
std::string encode_envelope(const wire::Envelope& envelope);

// "commit", "blob", ...: the body's kind, for logs and counters ("empty" when none is set).
std::string kind_name(const wire::Envelope& envelope);

}  // namespace agora::net
