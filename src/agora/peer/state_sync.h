// Model-state sync: getting the run's parameters into this peer, and telling the run what this
// peer holds.
//
// What a joiner trusts: the coordinator's state record (the majority's state hash after a
// step, with every tensor's hash). Tensors fetched from members are each checked against the
// record before use, and the loaded model must hash to the record's state hash, or the peer
// stops with an error rather than train on parameters nobody else holds.
#pragma once

#include <filesystem>
#include <vector>

#include "agora/peer/peer_context.h"

namespace agora::peer {

// Loads the parameters `state` names: the seed's initialisation at step 0; else the majority's
// tensors from `holders` (other than this peer); else, when only this peer is listed (the run
// restarted from a checkpoint after every member left), the checkpoint in its checkpoint root.
// Checks the result against the record's state hash and starts a cold strategy. The caller then
// reports the state (Round::settle), so that this peer can serve what it loaded.
// Returns where the parameters came from.
enum class StateSource { kSeed, kCheckpoint, kMembers };
StateSource sync_state(PeerContext& peer, const wire::StateRecord& state,
                       const std::vector<wire::Member>& holders);

// Sends the coordinator this peer's state record after `peer.applied` steps, and publishes a
// snapshot of the parameters for joiners to fetch.
void report_state(PeerContext& peer);

// Where a checkpointer writes, and where a lone restarter looks: --checkpoint-dir, or
// runs/peer-<short key>.
std::filesystem::path checkpoint_root(const PeerContext& peer);

}  // namespace agora::peer
