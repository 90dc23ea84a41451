// Joining a run: the Join handshake, and building the model and data from the run config the
// coordinator hands out.
#pragma once

#include <vector>

#include "agora/peer/peer_context.h"

namespace agora::peer {

// Sends Join every 5 s until the coordinator answers Welcome, and returns it. Throws Error when
// the coordinator refuses the peer for good, the run has finished, no answer comes within
// options.join_timeout_seconds, or the peer is stopped.
wire::Welcome join(PeerContext& peer);

// From the Welcome's run config: the model (the seed's initialisation), the strategy, the
// training data, and the payload check the link applies to fetched payloads.
void build(PeerContext& peer, const wire::Welcome& welcome);

// Hands the peer's store of payloads decoded at fetch to its strategy (a DeMo one): after build()
// and after every new strategy (state_sync.cc), so that apply() takes what the check decoded.
void share_decoded_payloads(PeerContext& peer);

// A peer fetching the run's data asks `members` (the newest the coordinator named, this peer and
// relayed members left out) before the coordinator. Nothing for a peer with a copy on disk.
void offer_data_peers(PeerContext& peer, const std::vector<wire::Member>& members);

}  // namespace agora::peer
