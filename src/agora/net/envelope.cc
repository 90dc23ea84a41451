#include "agora/net/envelope.h"

#include <fmt/format.h>

#include <algorithm>

#include "agora/core/error.h"

namespace agora::net {

Decoded decode_envelope(std::string_view bytes, const DecodeLimits& limits) {
  // Never above what protobuf can parse: ParseFromArray takes the size as an int, and a frame of
  // 2 GiB or more would reach it as a negative or wrapped size.
  const size_t largest =
      std::min(std::max(limits.max_control, limits.max_data), kMaxEnvelopeBytes);
  if (bytes.size() > largest) {
    return DecodeFailure{DecodeError::kTooLarge,
                         fmt::format("message of {} bytes is larger than any allowed ({} bytes)",
                                     bytes.size(), largest)};
  }
  wire::Envelope envelope;
  if (!envelope.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return DecodeFailure{DecodeError::kUnparsable,
                         fmt::format("{} bytes do not parse as an agora message", bytes.size())};
  }
  if (envelope.body_case() == wire::Envelope::BODY_NOT_SET) {
    return DecodeFailure{DecodeError::kNoBody,
                         "message has no body (an unknown kind, or from a newer agora)"};
  }
  const bool data = envelope.has_blob() || envelope.has_tensor_data() ||
                    envelope.has_stage_data() || envelope.has_params() ||
                    envelope.has_async_delivery() || envelope.has_swarm_poll() ||
                    envelope.has_swarm_view() || envelope.has_swarm_hop();
  const size_t limit = data ? limits.max_data : limits.max_control;
  if (bytes.size() > limit) {
    return DecodeFailure{DecodeError::kOverLimit,
                         fmt::format("{} message of {} bytes exceeds its limit of {} bytes",
                                     kind_name(envelope), bytes.size(), limit)};
  }
  return envelope;
}

size_t fits_one_message(size_t bytes, std::string_view what) {
  if (bytes > kMaxEnvelopeBytes) {
    fail("{} take up to {} bytes, more than one agora message can carry ({} bytes, protobuf's "
         "limit); split the model further (more stages) or send it compressed",
         what, bytes, kMaxEnvelopeBytes);
  }
  return bytes;
}

std::string_view to_token(DecodeError code) {
  // In the order of the enum's values.
  constexpr std::string_view kTokens[] = {"too_large", "unparsable", "no_body", "over_limit"};
  return kTokens[static_cast<size_t>(code)];
}

std::string encode_envelope(const wire::Envelope& envelope) {
  return envelope.SerializeAsString();
}

std::string kind_name(const wire::Envelope& envelope) {
  using E = wire::Envelope;
  switch (envelope.body_case()) {
    case E::kJoin: return "join";
    case E::kHeartbeat: return "heartbeat";
    case E::kLeave: return "leave";
    case E::kCommit: return "commit";
    case E::kWitness: return "witness";
    case E::kStateReport: return "state_report";
    case E::kGetFinalized: return "get_finalized";
    case E::kCheckpointReport: return "checkpoint_report";
    case E::kVerdict: return "verdict";
    case E::kWelcome: return "welcome";
    case E::kRefused: return "refused";
    case E::kRoundStart: return "round_start";
    case E::kCollect: return "collect";
    case E::kFinalized: return "finalized";
    case E::kResync: return "resync";
    case E::kFinished: return "finished";
    case E::kAdmit: return "admit";
    case E::kSpotCheck: return "spot_check";
    case E::kGetBlob: return "get_blob";
    case E::kBlob: return "blob";
    case E::kGetTensor: return "get_tensor";
    case E::kTensorData: return "tensor_data";
    case E::kStageData:
      return "stage_data";
    case E::kNotFound: return "not_found";
    case E::kRlHello: return "rl_hello";
    case E::kRlRun: return "rl_run";
    case E::kGetParams: return "get_params";
    case E::kParams: return "params";
    case E::kRlGetWork: return "rl_get_work";
    case E::kRlWork: return "rl_work";
    case E::kRlRollout: return "rl_rollout";
    case E::kRlReceipt: return "rl_receipt";
    case E::kAsyncHello: return "async_hello";
    case E::kAsyncRun: return "async_run";
    case E::kAsyncGetWork: return "async_get_work";
    case E::kAsyncWork: return "async_work";
    case E::kAsyncDelivery: return "async_delivery";
    case E::kAsyncReceipt: return "async_receipt";
    case E::kSapoGetGroups: return "sapo_get_groups";
    case E::kSapoGroups: return "sapo_groups";
    case E::kSwarmHello: return "swarm_hello";
    case E::kSwarmPoll: return "swarm_poll";
    case E::kSwarmView: return "swarm_view";
    case E::kSwarmHop: return "swarm_hop";
    case E::BODY_NOT_SET: break;
  }
  return "empty";
}

}  // namespace agora::net
