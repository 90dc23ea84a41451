// Fuzzes decode_envelope: any bytes a peer or the coordinator receives must come back as a
// message or a reason, never a crash, and an accepted message must respect its kind's limit and
// survive a re-encode; with a peer server's limits, no reply kind is ever accepted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agora/net/envelope.h"

namespace {

// The kinds that may be as large as max_data (envelope.h); every other kind is control.
bool data_kind(const agora::wire::Envelope& m) {
  return m.has_blob() || m.has_tensor_data() || m.has_stage_data() || m.has_params() ||
         m.has_async_delivery() || m.has_swarm_poll() || m.has_swarm_view() || m.has_swarm_hop();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const agora::net::DecodeLimits limits{.max_control = 512, .max_data = 4096};
  const agora::net::Decoded decoded = agora::net::decode_envelope(bytes, limits);
  if (const auto* message = std::get_if<agora::wire::Envelope>(&decoded)) {
    if (size > (data_kind(*message) ? limits.max_data : limits.max_control)) std::abort();
    if (message->body_case() == agora::wire::Envelope::BODY_NOT_SET) std::abort();
    const std::string again = agora::net::encode_envelope(*message);
    if (!std::holds_alternative<agora::wire::Envelope>(
            agora::net::decode_envelope(again, {1 << 20, 1 << 20}))) {
      std::abort();
    }
    (void)agora::net::kind_name(*message);
  } else if (std::get<agora::net::DecodeFailure>(decoded).reason.empty()) {
    std::abort();  // every refusal says why
  }
  // A peer's server (peer_server.h) decodes requests only: a data message, of any size, never
  // comes through.
  const agora::net::Decoded request = agora::net::decode_envelope(bytes, {2048, 0});
  if (const auto* message = std::get_if<agora::wire::Envelope>(&request)) {
    if (data_kind(*message) || size > 2048) std::abort();
  }
  return 0;
}
