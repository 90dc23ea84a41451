// What a GRPO learner shows while it trains: one JSON row per update (rl.jsonl, event "rl_step")
// and a live table on stdout, the same for the one-process learner (grpo_trainer.h) and the
// networked one (learner_server.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "agora/rl/group_batch.h"
#include "agora/rl/grpo_trainer.h"

namespace agora {

nlohmann::json rl_step_json(const GrpoStepStats& stats);

// The statistics of update `step` (reward, informative share, the loss's figures, the batch's
// rows), the same for every GRPO learner; held_out and seconds are the caller's to set.
GrpoStepStats step_stats(int64_t step, const GroupBatch& batch, const GrpoLoss& loss,
                         int64_t prompts_per_step, int64_t rollouts);

// The table's header, and its row for `stats` (`held_out`: the newest measured accuracy;
// `steps`: the run's total, for the ETA).
void print_rl_table_header();
void print_rl_table_row(const GrpoStepStats& stats, double held_out, int64_t steps);

}  // namespace agora
