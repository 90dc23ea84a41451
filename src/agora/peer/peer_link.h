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

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "agora/core/error.h"
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

// A strategy state an author committed to (docs/verification.md): its tensors, and its manifest,
// the tensors' BLAKE2b-256 in name order (32 bytes each). The commitment `hash` is the manifest's
// BLAKE2b-256, so a verifier that holds the manifest can check any one tensor on its own.
struct StrategyState {
  std::string hash;
  std::string manifest;
  std::shared_ptr<const Snapshot> tensors;
};

// Checks a fetched payload's content against the run's model and the step its commitment names:
// nothing when it is valid, else the reason it is not (which names what was wrong). The step
// matters because a payload's bytes carry their step: an old payload replayed under a new
// commitment has the right layout and must still be refused. `hash` is the payload's
// BLAKE2b-256, already checked against the commitment (the validator may key what it keeps by it).
using PayloadValidator = std::function<std::optional<std::string>(
    std::string_view hash, std::string_view payload, uint64_t step)>;

// What the link learns once the run is known (from the coordinator's Welcome).
struct LinkSettings {
  std::string run_id;  // commitments are signed under it
  PayloadValidator validator;
  // The run's network.witness_seconds: a Witness goes out within it whatever one payload does.
  double witness_seconds = 10;
  // The largest valid payload (encoded_size of the run's layout) and the largest tensor of the
  // model, in bytes: replies on fetch connections larger than these are refused. 0 = unknown
  // (net::DecodeLimits' defaults apply).
  uint64_t max_payload_bytes = 0;
  uint64_t max_tensor_bytes = 0;
  // Each parameter's bytes as served, by name: a state fetch spreads bytes, not tensors, over
  // the holders. Empty = unknown (every tensor then counts the same).
  std::map<std::string, uint64_t> tensor_bytes;
};

// The author answered that it does not hold a strategy state it committed to (not: it did not
// answer in time, which may be the network's doing).
struct StateNotServed : Error {
  using Error::Error;
};

class PeerLink {
 public:
  virtual ~PeerLink() = default;

  // The endpoint other peers dial to fetch from this one.
  virtual const std::string& endpoint() const = 0;
  // Payloads held: the peer's own and every accepted one, by hash.
  virtual net::BlobStore& blobs() = 0;

  // Set once the run is known: the run id commitments are signed under, the payload check and
  // the run's timing and sizes.
  virtual void configure(LinkSettings settings) = 0;

  virtual void send_to_coordinator(wire::Envelope message) = 0;
  // The next message from the coordinator, waiting up to `timeout_seconds`.
  virtual std::optional<wire::Envelope> next_from_coordinator(double timeout_seconds) = 0;
  // What the heartbeat reports: steps applied, and the RoundStart awaited.
  virtual void set_status(uint64_t applied_steps, uint64_t next_round) = 0;

  // Fetches and verifies the payloads of `commits` in the background; if `witness`, witnesses
  // `step` to the coordinator when every payload is settled or by the witness deadline
  // (a share of LinkSettings::witness_seconds), whichever comes first, with what is held then.
  // Payloads that arrive later are still kept for apply. Returns at once.
  virtual void collect(uint64_t step, std::vector<wire::CommitRecord> commits,
                       std::vector<wire::Member> members, bool witness) = 0;
  // Blocks until every payload of `set` is held for `step` (fetching what is missing from
  // `members`) or `timeout_seconds` pass; returns the hashes still missing.
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

  // Verification (docs/verification.md). Keeps `state` (this peer's strategy state) for
  // verifiers to fetch, its manifest as the blob of its hash, with the newest `keep` published.
  // Thread-safe.
  virtual void publish_strategy_state(std::shared_ptr<const StrategyState> state, size_t keep) {
    (void)state, (void)keep;
  }
  // Fetches the manifest of the strategy state `hash` from `author`: bytes that hash to `hash`
  // (checked here). Throws as fetch_strategy_state does.
  virtual std::string fetch_strategy_manifest(const std::string& hash, const wire::Member& author,
                                              double timeout_seconds,
                                              const std::atomic<bool>* cancel) {
    (void)hash, (void)author, (void)timeout_seconds, (void)cancel;
    throw std::runtime_error("this link cannot fetch strategy states");
  }
  // Fetches the tensors `names` of the strategy state `hash` from `author`, unchecked (the
  // caller checks each against the state's manifest). Throws StateNotServed when the author
  // answered that it does not hold a tensor of it, Error when a tensor cannot be had within the
  // timeout or *cancel became true. Thread-safe: a verifier thread calls it.
  virtual Snapshot fetch_strategy_state(const std::string& hash,
                                        const std::vector<std::string>& names,
                                        const wire::Member& author, double timeout_seconds,
                                        const std::atomic<bool>* cancel) {
    (void)hash, (void)names, (void)author, (void)timeout_seconds, (void)cancel;
    throw std::runtime_error("this link cannot fetch strategy states");
  }

  // Serves chunks of the run's data to the other members from now on: `lookup` gives a chunk's
  // bytes by its hash when this peer holds it (serve/data_mount.h asks members before the
  // coordinator). Thread-safe.
  virtual void serve_data(std::function<std::optional<std::string>(const std::string&)> lookup) {
    (void)lookup;
  }

  // Thread-safe.
  virtual NetworkCounters counters() const = 0;
};

}  // namespace agora::peer
