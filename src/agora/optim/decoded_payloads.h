// DecodedPayloads: payloads a network peer has already decoded, kept so that DeMo's apply() does
// not decode them a second time.
//
// A peer decodes every payload it fetches to check it (its witness check: the layout and the
// step, peer/session.cc), and apply() then needs the same decoded values. The check decodes here
// and the result is kept; apply() takes it back. Nothing a step decides changes: decoding is a
// function of the bytes and the layout alone, an entry is handed out only for the bytes it was
// decoded from, and apply() still makes each admit decision itself (duplicates, step) exactly as
// for bytes it decodes. Bytes that do not decode are not kept, so apply() decodes them again and
// refuses them with the decoder's own reason.
//
// Entries are found by the payload's BLAKE2b-256, which the network computed anyway to check the
// bytes against their commitment, so neither side hashes or copies the bytes again (at 1000
// members of the small preset that is 700 MB a step). The callers' promise: `hash` is the
// BLAKE2b-256 of `bytes` (the network checked it; a peer's blob store holds nothing else). The
// size is compared too, and the hash's collision resistance does the rest.
//
// The store belongs to the peer, not to one strategy: a joiner replaces its strategy after
// loading the state (state_sync.cc), and the new one is handed the same store
// (DecoupledMomentum::share_decoded_payloads), so the validator never fills a store nobody takes
// from.
//
// Bounded: at most `max_bytes` of decoded values; past it the oldest entries go
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

// What a peer's store may keep (about 1.5 times the bytes at top-k 32 with f32 values): a step
// of 1000 members of the small preset's 0.7 MB payloads; beyond it the oldest go and apply()
// decodes those itself.
inline constexpr size_t kDecodedPayloadBytes = size_t{1} << 30;

class DecodedPayloads {
 public:
  DecodedPayloads(PayloadLayout layout, size_t max_bytes);

  const PayloadLayout& layout() const { return layout_; }

  // Decodes `bytes`, whose BLAKE2b-256 is `hash`, against the layout (throws Error as
  // decode_payload() does) and keeps the payload when it is for `step`. Returns its step.
  uint64_t decode(std::string_view hash, std::string_view bytes, uint64_t step);
  // The payload decoded from exactly these bytes (found by their hash), removed from the store;
  // nullopt when none is kept (never decoded here, refused, dropped, or other bytes).
  std::optional<Payload> take(std::string_view hash, std::string_view bytes);
  // Drops the payloads of steps <= step.
  void forget_through(uint64_t step);

  size_t size() const;

 private:
  struct Entry {
    std::string hash;  // BLAKE2b-256 of the bytes
    size_t size = 0;   // of the bytes
    Payload payload;
    size_t cost = 0;
  };
  using Entries = std::list<Entry>;  // oldest first

  void erase(Entries::iterator it);  // mutex_ held

  const PayloadLayout layout_;
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  Entries entries_;
  std::unordered_map<std::string, Entries::iterator> by_hash_;
  size_t bytes_ = 0;
};

}  // namespace agora
