// coalesce_admits: what the service does to a batch's messages before sending them, so that a
// burst of joins costs one Admit per member rather than one per member per joiner.
//
// At 1000 members joining together, each Join's Admit to every other member (and each retry's)
// kept the coordinator too busy to answer the joins in time: 6530 joins in 76 s for 1000
// members, none of them finished (docs/scaling.md). An Admit only widens who a member's server
// answers, so a later joiner's Admit may go out with an earlier one's.
#pragma once

#include <vector>

#include "agora/coord/state_machine.h"

namespace agora::coord {

// Merges every Admit to the same member into the first one to it (its `joining` lists them
// all, in order); every other message keeps its place.
void coalesce_admits(std::vector<Outgoing>& send);

}  // namespace agora::coord
