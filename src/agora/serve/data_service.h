// DataService: a token folder served to a run's members, piece by checked piece.
//
// Everything is addressed by content, through the GetBlob / Blob messages peers already fetch
// payloads with: the folder's data hash names its manifest (data/data_manifest.h), and a chunk's
// hash names that 1 MiB of a shard. A member checks each Blob against the hash it asked for, so
// whoever answers (the coordinator, an `agora data serve`, another member) cannot change a byte.
//
// The caller decides who is a member (the coordinator: keys that joined; DataServer: keys that
// said hello); the service bounds what each may take: a byte rate (a token bucket of bytes) and
// the bytes queued to it and not yet written. A request beyond either is answered NotFound with
// the reason, so the member pauses and asks again (or asks another holder) instead of waiting out
// a timeout, and a member that asks without reading cannot make the server buffer more.
// Nothing grows with what members send: the per-member table is bounded and forgets the idle.
// One thread owns a DataService (the server's loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agora/core/mapped_file.h"
#include "agora/data/data_manifest.h"
#include "agora/net/curve_socket.h"

namespace agora::serve {

struct DataLimits {
  double bytes_per_second = 64.0 * (1 << 20);  // each member, on average
  double burst_bytes = 16.0 * (1 << 20);
  int64_t queued_bytes = 8 << 20;  // each member's, written by ZeroMQ yet
  // Every member's together (summed at most every 50 ms): a thousand members asking at once
  // must not queue a thousand times a member's share.
  int64_t total_queued_bytes = int64_t{256} << 20;
  size_t max_members = 4096;  // remembered at once (the idle are forgotten first)
};

class DataService {
 public:
  // Hashes and maps every shard of `dir` (data/data_identity.h); Error when it holds none.
  DataService(const std::filesystem::path& dir, DataLimits limits = {});

  const DataIdentity& identity() const { return manifest_.identity; }
  std::string hex() const { return manifest_.identity.hex(); }

  // The bytes of the chunk with hash `hash`, if the folder has it. Thread-safe (what a peer's
  // server calls to serve its copy to other members).
  std::optional<std::string> chunk(const std::string& hash) const;

  // Whether this service holds what `request` names (the manifest or a chunk).
  bool holds(const wire::GetBlob& request) const;
  // Answers `request` from member `member` on `server` at `route`; false when the service does
  // not hold what it names (the caller answers it otherwise).
  bool answer(net::Server& server, const std::string& member, const std::string& route,
              const wire::GetBlob& request, double now);

  struct Counters {
    uint64_t manifests = 0, chunks = 0, bytes = 0;
    uint64_t busy = 0;  // answered NotFound for the rate or the queue
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Place {
    uint32_t shard;
    uint64_t chunk;
  };
  struct Taker {
    double tokens = 0, last = 0;  // a bucket of bytes (TokenBucket counts messages)
    bool started = false;
    std::shared_ptr<std::atomic<int64_t>> queued = std::make_shared<std::atomic<int64_t>>(0);
    double last_seen = 0;
  };
  Taker& taker(const std::string& member, double now);
  std::string chunk_bytes(const Place& place) const;

  DataLimits limits_;
  DataManifest manifest_;
  std::shared_ptr<const std::string> manifest_reply_;  // encoded once, shared by every reply
  std::vector<MappedFile> files_;
  std::map<std::string, Place> chunks_;  // chunk hash -> its first place
  std::map<std::string, Taker> takers_;
  int64_t total_queued_ = 0;  // over takers_, as summed at total_summed_at_
  double total_summed_at_ = -1;
  Counters counters_;
};

}  // namespace agora::serve
