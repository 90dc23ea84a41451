// One round of a peer, and the finalized steps it applies before training.
//
//   RoundStart(s):  catch_up(apply_through): every finalized step below it, in order, each
//                   set's payloads fetched if missing (PeerLink::ensure) and applied in the
//                   canonical order (the strategy sorts them) -> train(s): the assigned share
//                   through the one step function (train/step.h) -> the payload stored, signed
//                   over (run, s, hash) and committed with the round's numbers.
//                   A finalized contribution that is malformed, for another step or extreme
//                   is left out or bounded by the strategy, from its bytes alone, so every
//                   honest peer does the same (logged as contribution_refused and
//                   influence_bound).
//   Finalized(s):   the set is remembered until it is applied.
//   Collect(s):     the link fetches and verifies step s's payloads in the background and
//                   witnesses what it holds.
//   SpotCheck:      queued for this peer's verifier (verification.h), which answers later.
//
// Every network.hash_interval applied steps the peer reports its state (state_sync.h), and a
// checkpointer checkpoints every train.checkpoint_interval steps (checkpointer.h).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "agora/peer/checkpointer.h"
#include "agora/peer/peer_context.h"
#include "agora/peer/verification.h"

namespace agora::peer {

class Round {
 public:
  Round(PeerContext& peer, Checkpointer& checkpointer, Verification& verification)
      : peer_(peer), checkpointer_(checkpointer), verification_(verification) {}

  // Handles a message that never waits (Finalized, Collect, SpotCheck); false for any other.
  bool handle_passive(const wire::Envelope& m);

  // Applies finalized steps until `target` steps are applied, asking the coordinator for sets it
  // lacks (again every 5 s, each time with a warning). Other messages that arrive meanwhile are
  // appended to `deferred` (at most 1024, the oldest dropped). True once `target` steps are
  // applied; false when a stop was requested, or at once when a message arrives after which no
  // set will come (a Refused, or a Finished without linger): it is left at the back of
  // `deferred` for the caller to act on. Throws when a coordinator that keeps answering has not
  // sent a set within 120 s, or a payload cannot be fetched (apply()).
  bool catch_up(uint64_t target, std::deque<wire::Envelope>& deferred);
  // The newest finalized step remembered and not yet applied, if any.
  std::optional<uint64_t> pending_final() const;

  // Runs round `round`: trains the assigned share and commits. A round with no share, or one
  // stopped between micro-batches, commits nothing.
  void train(const wire::RoundStart& round);
  // The round was announced again (the coordinator restarted, or a heartbeat crossed our
  // commit): the work is done; make sure the coordinator has the commitment.
  void recommit(uint64_t round);

  // Forgets every remembered set: after a sync the run may have gone back, so sets are asked
  // for again.
  void forget_finalized() {
    finalized_.clear();
    collected_.clear();
  }

  // After the parameters changed (a step applied, or a sync when `force_report`): reports the
  // state every network.hash_interval steps, prunes payloads no joiner will ask for, lets a
  // checkpointer checkpoint, and updates what the heartbeat says.
  void settle(bool force_report = false);

 private:
  void apply(uint64_t step);
  // A member nobody can dial (the round's member list says it is relayed) uploads its payload
  // to the coordinator's relay after committing (docs/protocol.md, "Peers behind NAT").
  void upload_if_relayed(const std::string& hash, const std::string& bytes);
  // Logs and counts what applying `step` decided about its contributions (left out, bounded).
  void report(uint64_t step, const ApplyReport& report);
  // The set a Finalized with of_collect names, from that step's Collect; nothing when this peer
  // has no Collect for the step or the bits do not fit its commits.
  std::optional<std::vector<wire::CommitRecord>> final_of_collect(const wire::Finalized& f) const;

  static constexpr size_t kKeptCollects = 16;

  PeerContext& peer_;
  Checkpointer& checkpointer_;
  Verification& verification_;
  std::map<uint64_t, std::vector<wire::CommitRecord>> finalized_;  // by step, not yet applied
  // The commits of each step's Collect, for a Finalized that names its set by bits over them
  // (proto Finalized.of_collect); the newest kKeptCollects steps not yet applied.
  std::map<uint64_t, std::vector<wire::CommitRecord>> collected_;
  std::optional<wire::Envelope> last_commit_;
  bool relayed_ = false;
  bool warned_relay_size_ = false;  // the payload is too large for the relay: said once
};

}  // namespace agora::peer
