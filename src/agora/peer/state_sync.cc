#include "agora/peer/state_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "agora/core/error.h"
#include "agora/peer/model_state.h"
#include "agora/peer/session.h"
#include "agora/train/checkpoint.h"

namespace agora::peer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Step 0's state is the seed's initialisation, which every member computes for itself.
void load_initialisation(PeerContext& peer) {
  torch::manual_seed(peer.config.seed);
  Llama fresh(peer.config.model);  // on the CPU, as Learner::create makes it: the same bits
  torch::NoGradGuard no_grad;
  auto target = peer.learner.model->named_parameters();
  for (const auto& item : fresh->named_parameters()) target[item.key()].copy_(item.value());
}

// Nobody else holds these parameters: the run restarted from a checkpoint after every member
// left, and this peer must bring it.
void load_local_checkpoint(PeerContext& peer, uint64_t applied_steps) {
  recover_checkpoints(checkpoint_root(peer));  // a kill between the two renames of a replace
  const fs::path dir = checkpoint_root(peer) / fmt::format("checkpoint_{:06}", applied_steps);
  if (!fs::exists(dir)) {
    fail(
        "no member holds the parameters after step {}, and {} does not exist; the run restarts "
        "from that checkpoint: copy it there from the machine that wrote it (the coordinator's "
        "log names it) and start this peer again",
        applied_steps, dir.string());
  }
  const LoadedCheckpoint checkpoint = load_checkpoint(dir, peer.device);
  std::map<std::string, torch::Tensor> source;
  for (const auto& item : checkpoint.model->named_parameters()) source[item.key()] = item.value();
  copy_parameters(peer.learner.model, source, dir.string());
}

}  // namespace

fs::path checkpoint_root(const PeerContext& peer) {
  return peer.options.checkpoint_dir.empty() ? fs::path("runs") / ("peer-" + peer.who)
                                             : peer.options.checkpoint_dir;
}

StateSource sync_state(PeerContext& peer, const wire::StateRecord& state,
                       const std::vector<wire::Member>& holders) {
  peer.phase = PeerPhase::kSyncing;
  PeerMetrics::Timer timer(peer.metrics, PeerMetrics::Activity::kFetchingState);
  const auto started = Clock::now();
  // Until a round names the members, the holders are whom a joiner can fetch payloads from.
  if (peer.members.empty()) peer.members = holders;
  const bool others_hold = std::any_of(holders.begin(), holders.end(), [&](const wire::Member& h) {
    return h.key() != peer.identity.public_key();
  });
  std::string source;
  if (state.applied_steps() == 0) {
    load_initialisation(peer);
    source = "seed";
  } else if (!others_hold) {
    load_local_checkpoint(peer, state.applied_steps());
    source = "checkpoint";
  } else {
    peer.log(fmt::format("fetching the parameters after step {} from {} member(s)",
                         state.applied_steps(), holders.size()));
    const Snapshot snapshot = peer.link.fetch_state(state, holders, 600);
    load_snapshot(peer.learner.model, snapshot);
    source = "members";
  }
  peer.applied = state.applied_steps();
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  peer.log(fmt::format("parameters after step {} loaded from {} in {:.2f} s", peer.applied,
                       source == "checkpoint" ? checkpoint_root(peer).string() : source, seconds),
           "state_loaded",
           {{"applied_steps", peer.applied}, {"source", source}, {"seconds", seconds}});
  const wire::StateRecord mine = state_record(peer.learner.model, peer.applied);
  if (!state.state_hash().empty() && mine.state_hash() != state.state_hash()) {
    fail("the parameters after step {} hash to {}, the majority's to {}", peer.applied,
         state_hash_hex(mine), state_hash_hex(state));
  }
  peer.learner.reset_strategy(peer.config);  // a cold momentum, as a joiner's must be
  share_decoded_payloads(peer);              // and the payloads the network decodes go to it
  return source == "seed"         ? StateSource::kSeed
         : source == "checkpoint" ? StateSource::kCheckpoint
                                  : StateSource::kMembers;
}

void report_state(PeerContext& peer) {
  wire::Envelope report;
  *report.mutable_state_report()->mutable_state() = state_record(peer.learner.model, peer.applied);
  peer.link.publish_snapshot(peer.applied, snapshot_of(peer.learner.model));
  peer.link.send_to_coordinator(report);
  peer.summary.state_hash = state_hash_hex(report.state_report().state());
  peer.log(fmt::format("state after {} steps {}", peer.applied, peer.summary.state_hash), "state",
           {{"applied_steps", peer.applied}, {"hash", peer.summary.state_hash}});
}

}  // namespace agora::peer
