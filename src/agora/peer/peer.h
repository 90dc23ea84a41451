// The peer: one member of a decentralized run, from joining to leaving.
//
// run_peer() joins the coordinator, builds the model and strategy from the run config the
// coordinator hands out, obtains the current parameters (the seed's initialisation at step 0;
// otherwise the majority's state fetched tensor by tensor from several members, or, when no
// member holds it because the run restarted from a checkpoint, that checkpoint from its own
// checkpoint_dir; then the finalized steps since), and runs the round loop (DESIGN.md
// section 1):
//
//   RoundStart(s): apply every finalized step below apply_through, in order, each one's payloads
//                  in the canonical order (the strategy sorts them) -> train the assigned sequence
//                  ranges with gradient accumulation -> clip locally -> the strategy's payload ->
//                  store it, sign (run, s, hash), commit.
//   Collect(s):    the I/O thread fetches and verifies step s's payloads while training goes on,
//                  then witnesses what it holds (network.overlap = 1 hides this behind compute).
//   Finalized(s):  remembered; applied when a round asks for it.
//   Resync:        this peer's parameters disagree with the majority: fetch the majority's.
//   Finished:      the run is over; a checkpointer writes the final checkpoint.
//
// Every network.hash_interval applied steps the peer reports its state record and keeps a
// snapshot that joiners may fetch. A checkpointer writes an atomic safetensors checkpoint every
// train.checkpoint_interval applied steps and at the end. Setting *stop (Ctrl-C) makes the peer
// finish the micro-batch it is in, send Leave and return.
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
  std::filesystem::path checkpoint_dir; // where a checkpointer writes; "" = runs/<key>
  std::string listen = "tcp://0.0.0.0:*";
  std::string advertise;                // the endpoint others dial, when not this host's loopback
  int64_t threads = 0;                  // 0 = the run config's train.threads
  // Testing and benchmarks only: compute takes `slowdown` times as long (a sleep after compute),
  // and "garbage-payload" commits a truncated payload (a malicious peer).
  double slowdown = 1.0;
  std::string misbehave;
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
};

PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options,
                     const std::atomic<bool>& stop);

}  // namespace agora::peer
