// What the parts of one peer share: who it is, the run it joined, its model and where it stands.
//
// A peer is one thread of control (the training loop; the network has its own I/O thread behind
// PeerLink). The parts that act for it (session.cc joins, state_sync.cc loads parameters,
// round.cc applies and trains, checkpointer.cc validates and saves, peer.cc dispatches) each
// take a PeerContext& and run on that one thread, so nothing here is locked.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/data/data_meta.h"
#include "agora/net/identity.h"
#include "agora/obs/log.h"
#include "agora/optim/decoded_payloads.h"
#include "agora/peer/peer.h"
#include "agora/peer/peer_link.h"
#include "agora/peer/peer_metrics.h"
#include "agora/serve/data_mount.h"
#include "agora/serve/data_service.h"
#include "agora/train/step.h"

namespace agora::peer {

// Where a peer stands. Every peer goes Joining -> Syncing -> CatchingUp -> Waiting, then loops
// Waiting -> Training -> Waiting once per round, and ends in Finished or Leaving.
enum class PeerPhase {
  // Join sent (again every 5 s), waiting for Welcome. No model yet. Refused without may_rejoin,
  // Finished, or no answer within --join-timeout: the peer exits with an error.
  kJoining,
  // Obtaining the parameters the coordinator's state record names: the seed's initialisation at
  // step 0, else the majority's tensors fetched from the holders, else (nobody else holds them:
  // the run restarted from a checkpoint) the checkpoint in --checkpoint-dir. The result must hash
  // to the record. The strategy starts cold. Entered from Joining, and again on Resync or a
  // rejoin that finds the peer behind or ahead of the run.
  kSyncing,
  // Applying finalized steps the run already made, in order, asking the coordinator for each
  // set it lacks (GetFinalized, again every 5 s with a warning). A payload of a set that no
  // member can serve within 120 s, or a set that a coordinator still answering has not sent
  // within 120 s, ends the peer with an error: it cannot reach the majority's parameters. A
  // silent coordinator is waited for. A Refused, or a Finished without linger, ends the phase at
  // once and is handled as in Waiting (the peer joins again, or finishes with the steps it has).
  kCatchingUp,
  // Between rounds: waiting for the coordinator's next message. Finalized and Collect are
  // handled at once; idle time applies steps already final.
  kWaiting,
  // In a round: applying every finalized step below RoundStart.apply_through, training the
  // assigned share (train/step.h), then storing, signing and committing the payload. A stop
  // request ends the round between micro-batches without a commit.
  kTraining,
  // The coordinator said the run is over: the last steps are applied, a checkpointer writes the
  // final checkpoint. While the coordinator says `linger` (a member is still catching up, or
  // the final checkpoint is not on record) the peer stays and serves; released, or after
  // network.finish_grace_seconds (plus a margin) without a release, it exits.
  kFinished,
  // Stopped by the operator (Ctrl-C): Leave is sent and the peer exits.
  kLeaving,
};

const char* to_string(PeerPhase phase);

struct PeerContext {
  PeerContext(const net::Identity& identity_, const PeerOptions& options_,
              const std::atomic<bool>& stop_, PeerLink& link_, PeerMetrics& metrics_)
      : identity(identity_),
        options(options_),
        stop(stop_),
        link(link_),
        metrics(metrics_),
        who(net::short_key(identity_.public_key())) {}

  // A line about this peer, with the steps applied so far as its step; `event` and `fields`
  // make it structured (obs/log.h). Quiet peers (--quiet) log nothing here.
  void log(const std::string& text, std::string event = {},
           std::vector<obs::LogField> fields = {}) const {
    if (options.progress) obs::log_info({applied, who, std::move(event), std::move(fields)}, text);
  }
  bool stopping() const { return stop.load(); }

  const net::Identity& identity;
  const PeerOptions& options;
  const std::atomic<bool>& stop;
  PeerLink& link;
  PeerMetrics& metrics;
  const std::string who;  // the short key, in every line

  PeerPhase phase = PeerPhase::kJoining;
  // Known once joined (session.cc, then build()).
  RunConfig config;
  std::string run_id;
  DataMeta data;
  // The run's data fetched from the coordinator, when this machine has none; declared before
  // what reads it, so it goes last. Shared with the link's server, which serves it to the
  // members that fetch and may outlive this context.
  std::shared_ptr<serve::DataMount> data_mount;
  // This peer's copy on disk, hashed and served to the members that fetch (null: none, or the
  // run names no data hash). Shared the same way.
  std::shared_ptr<serve::DataService> data_service;
  // Payloads the witness check decoded, for apply() to take (optim/decoded_payloads.h): made in
  // build(), shared with the link's validator, handed to every strategy the peer makes.
  std::shared_ptr<DecodedPayloads> decoded;
  bool checkpointer = false;
  torch::Device device{torch::kCPU};
  Learner learner;
  std::unique_ptr<TrainStep> step;

  uint64_t applied = 0;               // finalized steps applied to learner's parameters
  uint64_t next_round = 0;            // the RoundStart awaited (heartbeats say so)
  std::vector<wire::Member> members;  // the newest round's members: whom payloads come from
  std::optional<std::chrono::steady_clock::time_point>
      first_round;  // the first RoundStart acted on
  PeerSummary summary;
};

}  // namespace agora::peer
