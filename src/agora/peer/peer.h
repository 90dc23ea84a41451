// The peer: one member of a decentralized run, from joining to leaving.
//
// run_peer() joins the coordinator, builds the model and strategy from the run config the
// coordinator hands out, obtains the current parameters, and runs rounds until the run finishes
// or the operator stops it. Its parts, in the order a round meets them (docs/architecture.md
// traces one round through them):
//   peer.cc         the phases (peer_context.h: PeerPhase) and the dispatch of coordinator
//                   messages: RoundStart, Finalized, Collect, Resync, Refused, Finished;
//   session.cc      the Join handshake and building the model from the Welcome;
//   state_sync.cc   the parameters: the seed's, the majority's fetched, or a local checkpoint;
//   round.cc        applying finalized steps and training a round (train/step.h), then commit;
//   checkpointer.cc validation for the run's page and checkpoints;
//   peer_link.h     the network behind all of it (PeerNetwork, or a fake in tests).
// Setting *stop (Ctrl-C) makes the peer finish the micro-batch it is in, send Leave and return.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "agora/net/identity.h"
#include "agora/obs/http_server.h"

namespace agora::peer {

struct PeerOptions {
  std::string coordinator;              // tcp://host:port
  net::PublicKey coordinator_key;
  std::filesystem::path data;           // this machine's copy of the run's token folder
  // Where the run's data fetched from the coordinator goes (serve/data_mount.h): the default
  // when neither --data nor the run config's data.dir is on this machine, then
  // agora-data/<the data hash's first 16 digits>. Set, it fetches even where data.dir exists.
  std::filesystem::path data_cache;
  size_t data_peers = 8;  // members a fetching peer asks before the coordinator (0: none)
  std::filesystem::path checkpoint_dir; // where a checkpointer writes; "" = runs/<key>
  std::string listen = "tcp://0.0.0.0:*";
  std::string advertise;                // the endpoint others dial, when not this host's loopback
  int64_t threads = 0;                  // 0 = the run config's train.threads
  // Testing and benchmarks only: compute takes `slowdown` times as long (a sleep after compute).
  // (Attacks are not a peer's option: tests/adversary/ is a member that attacks.)
  double slowdown = 1.0;
  bool progress = true;  // one line per round on stderr
  double join_timeout_seconds = 60;  // no Welcome by then: a clear error (wrong key, allowlist)
  // Where to serve /metrics (peer_metrics.h); none = off.
  std::optional<obs::HttpAddress> metrics;
};

struct PeerSummary {
  uint64_t rounds_trained = 0;
  // Time training rounds (forward, backward, the strategy's step) and applying finalized steps,
  // and the wall time from the first round to the last commit: their ratio is the peer's
  // compute utilisation (bench/network).
  double compute_seconds = 0;
  double wall_seconds = 0;
  uint64_t applied_steps = 0;
  std::string state_hash;  // hex, after the last applied step
  std::filesystem::path checkpoint;
  uint64_t relayed_bytes = 0;  // payload bytes uploaded to the coordinator's relay
  uint64_t data_bytes_fetched = 0;  // of the run's token folder, from the run (data_cache)
  uint64_t data_bytes_from_peers = 0;  // of those, served by other members
  // Finalized payloads apply() took decoded from the witness check instead of decoding them
  // again, and what the store still kept at the end (optim/decoded_payloads.h).
  uint64_t payloads_predecoded = 0;
  uint64_t decoded_payloads_kept = 0;
};

PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options,
                     const std::atomic<bool>& stop);

class PeerLink;
class PeerMetrics;
// The same over a link the caller owns (tests drive a peer with a fake one); `metrics` records
// into the registry the caller serves, if any.
PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options, PeerLink& link,
                     PeerMetrics& metrics, const std::atomic<bool>& stop);

}  // namespace agora::peer
