// The in-flight parts of a RunState as JSON, for the store's `run` table: the phase, the open
// round, the steps collecting witnesses, the data queue and the counters. What is durable and
// queryable (the ledger, members, reports, checkpoints, events) has tables of its own
// (store.h); this is the part that changes every call and is read back whole.
//
// Keys and hashes travel as lower-case hex. volatile_from() throws Error (or nlohmann's
// exceptions, which the store turns into an Error naming the file) for JSON it did not write.
#pragma once

#include <nlohmann/json.hpp>

#include "agora/coord/run_state.h"

namespace agora::coord {

nlohmann::json volatile_json(const RunState& state);
// Fills the in-flight fields of `state` from `j`; the others are left as they are.
void volatile_from(const nlohmann::json& j, RunState& state);

}  // namespace agora::coord
