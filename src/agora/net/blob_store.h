// BlobStore: the payloads a peer holds, content-addressed by their BLAKE2b-256 hash.
//
// A peer keeps its own payloads and every one it fetched and verified, and serves any of them to
// whoever asks: a payload spreads through every holder, not only its author, so one slow or
// departed author does not make its update vanish. Entries carry the step they belong to so old
// steps can be pruned once no joiner can need them. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace agora::net {

class BlobStore {
 public:
  void put(const std::string& hash, std::string bytes, uint64_t step);
  std::optional<std::string> get(const std::string& hash) const;
  bool contains(const std::string& hash) const;
  // Held and stored for `step`. A payload's bytes carry their step, so bytes accepted for one
  // step are never valid for another: a commitment of held bytes under a different step must be
  // fetched and validated like any other (and is then refused), not taken as held.
  bool holds(const std::string& hash, uint64_t step) const;
  // Forgets every blob of a step below `step`.
  void prune_below(uint64_t step);
  size_t size() const;

 private:
  struct Entry {
    std::string bytes;
    uint64_t step;
  };
  mutable std::mutex mutex_;
  std::map<std::string, Entry> blobs_;
};

}  // namespace agora::net
