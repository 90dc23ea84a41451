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

// The same in parts, so that a save writes only the parts that changed (store.h, "What a save
// writes"): the core (phase, queue, counters: small, every save), the open round without its
// commits, and a collecting step without its witnesses. A core written this way says so
// (is_split); one without the mark is the whole volatile_json() of an older file.
nlohmann::json core_json(const RunState& state);
bool is_split(const nlohmann::json& core);
void core_from(const nlohmann::json& j, RunState& state);
nlohmann::json round_header_json(const OpenRound& round);
OpenRound round_header_from(const nlohmann::json& j);  // commits empty
nlohmann::json collecting_header_json(const CollectingStep& step);
CollectingStep collecting_header_from(const nlohmann::json& j);  // witnessed, holders empty

}  // namespace agora::coord
