// What a replica of each stage may send to its stage's round (schedule.h,
// "Deadlines and strikes"): a DeMo payload (optim/payload.h) with its stage's exact layout, for
// the step the round is at. The coordinator decodes every contribution before it keeps or relays
// it, so a round holds nothing but well-formed payloads of a known size: a member cannot make the
// coordinator store, copy and send on more than its stage's payload, nor hand the replicas bytes
// they would refuse. Torch-free: the layouts come from the run config alone
// (pipeline/partition.h's stage_parameter_shapes, optim/chunking.h's demo_tensor_layout), as the
// replicas' DecoupledMomentum builds them from their stage models.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/optim/payload.h"

namespace agora {

// Per stage, the layout of its DeMo contributions under `config` ([demo] chunk, topk, one_bit;
// float32 values).
std::vector<PayloadLayout> swarm_contribution_layouts(const RunConfig& config);

// SwarmScheduleOptions::check_contribution for these layouts: empty when the payload decodes
// against its stage's layout and names the round's step, else why not.
std::function<std::string(int64_t stage, uint64_t step, const std::string& payload)>
contribution_checker(std::vector<PayloadLayout> layouts);

}  // namespace agora
