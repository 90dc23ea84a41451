// DecodedPayloads: payloads a network peer has already decoded, kept so that DeMo's apply() does
// not decode them a second time.
//
// Not wired into the network peer yet: its witness check would decode into the store of the
// strategy it was built with, and a joiner replaces that strategy after loading the state
// (state_sync.cc, reset_strategy), which would leave the validator filling a store nobody takes
// from or clears (up to its bound). The store must live in the peer's context and pass to every
// new strategy first. Measured gain when used: 0.05 to 0.2 ms per payload (docs/results.md).
//
// A peer decodes every payload it fetches to check it (its witness check: the layout and the
// step, peer/session.cc), and apply() then needs the same decoded values. The check decodes here
// and the result is kept; apply() takes it back by the bytes. Nothing a step decides changes:
// decoding is a function of the bytes and the layout alone, an entry is handed out only for bytes
// equal to the ones it was decoded from (a hash to find it, then every byte compared), and apply()
// still makes each admit decision itself (duplicates, step) exactly as for bytes it decodes.
// Bytes that do not decode are not kept, so apply() decodes them again and refuses them with the
// decoder's own reason.
//
// Bounded: at most `max_bytes` of kept bytes and values together; past it the oldest entries go
// (apply() then decodes those itself). Entries of steps already applied are dropped by
// forget_through(). Thread-safe: the network's threads decode, the training thread takes.
// Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "agora/optim/payload.h"

namespace agora {

class DecodedPayloads {
 public:
  DecodedPayloads(PayloadLayout layout, size_t max_bytes);

  // Decodes `bytes` against the layout (throws Error as decode_payload() does) and keeps the
  // payload when it is for `step`. Returns the payload's step.
  uint64_t decode(std::string_view bytes, uint64_t step);
  // The payload decoded from exactly these bytes, removed from the store; nullopt when none is
  // kept (never decoded here, refused, or dropped).
  std::optional<Payload> take(std::string_view bytes);
  // Drops the payloads of steps <= step.
  void forget_through(uint64_t step);

  size_t size() const;

 private:
  struct Entry {
    std::string bytes;
    Payload payload;
    size_t hash = 0;  // of bytes
    size_t cost = 0;
  };
  using Entries = std::list<Entry>;  // oldest first

  void erase(Entries::iterator it);  // mutex_ held

  const PayloadLayout layout_;
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  Entries entries_;
  std::unordered_multimap<size_t, Entries::iterator> by_hash_;
  size_t bytes_ = 0;
};

}  // namespace agora
