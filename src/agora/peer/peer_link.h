// PeerLink: what a peer's training side needs from the network, and nothing else.
//
// The round logic (peer.cc, round.cc, state_sync.cc) talks to the run only through this
// interface. PeerNetwork (peer_network.h) implements it over ZeroMQ with an I/O thread; unit
// tests implement it in memory and drive a whole peer with scripted coordinator messages.
//
// Promises every implementation keeps: messages from the coordinator come out in the order they
// arrived; send_to_coordinator() never blocks on the network; a payload is in blobs() only once
// its hash, its author's signature and the validator have accepted it (or it is the peer's own).
// Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agora/net/blob_store.h"
#include "agora/peer/network_counters.h"
#include "agora/wire/agora.pb.h"

namespace agora::peer {

// One tensor of a snapshot, as served: dtype, shape and little-endian bytes.
struct TensorBytes {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};
using Snapshot = std::map<std::string, TensorBytes>;

// Checks a fetched payload's content against the run's model: nothing when it is valid, else the
// reason it is not (which names what was wrong).
using PayloadValidator = std::function<std::optional<std::string>(std::string_view payload)>;

class PeerLink {
 public:
  virtual ~PeerLink() = default;

  // The endpoint other peers dial to fetch from this one.
  virtual const std::string& endpoint() const = 0;
  // Payloads held: the peer's own and every accepted one, by hash.
  virtual net::BlobStore& blobs() = 0;

  // Set once the run is known: the run id commitments are signed under, and the payload check.
  virtual void configure(std::string run_id, PayloadValidator validator) = 0;

  virtual void send_to_coordinator(wire::Envelope message) = 0;
  // The next message from the coordinator, waiting up to `timeout_seconds`.
  virtual std::optional<wire::Envelope> next_from_coordinator(double timeout_seconds) = 0;
  // What the heartbeat reports: steps applied, and the RoundStart awaited.
  virtual void set_status(uint64_t applied_steps, uint64_t next_round) = 0;

  // Fetches and verifies the payloads of `commits` in the background; witnesses `step` to the
  // coordinator when done if `witness`. Returns at once.
  virtual void collect(uint64_t step, std::vector<wire::CommitRecord> commits,
                       std::vector<wire::Member> members, bool witness) = 0;
  // Blocks until every payload of `set` is held (fetching what is missing from `members`) or
  // `timeout_seconds` pass; returns the hashes still missing.
  virtual std::vector<std::string> ensure(uint64_t step, const std::vector<wire::CommitRecord>& set,
                                          std::vector<wire::Member> members,
                                          double timeout_seconds) = 0;

  // Keeps `snapshot` (the parameters after `applied_steps` steps) for joiners to fetch.
  virtual void publish_snapshot(uint64_t applied_steps,
                                std::shared_ptr<const Snapshot> snapshot) = 0;
  // Fetches the tensors of `state` from `holders`, each verified against its hash. Throws Error
  // when a tensor cannot be had from any holder within the timeout.
  virtual Snapshot fetch_state(const wire::StateRecord& state,
                               const std::vector<wire::Member>& holders,
                               double timeout_seconds) = 0;

  // Thread-safe.
  virtual NetworkCounters counters() const = 0;
};

}  // namespace agora::peer
