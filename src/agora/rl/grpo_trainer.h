// The GRPO learner: turns a base model into a better one on a task with verifiable rewards.
//
// Each step: take the next `prompts_per_step` training problems of the task, sample a group of
// `group_size` completions of each from the rollout policy, score them with the task's checker
// (never trusting anyone's claim of a reward), normalise advantages within each group, and take
// one AdamW step on GRPO's loss (grpo.h) over every completion token. The rollout policy is the
// one being trained when `policy_lag` = 0; with a lag of k it is the policy of k updates ago,
// which is what an asynchronous run (workers generating while the learner trains, as
// INTELLECT-2 does) feeds the learner: the ratio between the two is what the clip and the cap
// bound. Held-out accuracy (held_out.h) is measured before the first step and every
// `eval_interval` steps.
//
// Everything is seeded: the same base checkpoint and options give the same numbers.
// Progress: a live table on stdout and one JSON row per step in out_dir/rl.jsonl.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "agora/rl/grpo.h"
#include "agora/rl/task.h"
#include "agora/rl/worker_sim.h"
#include "agora/train/checkpoint.h"

namespace agora {

struct GrpoTrainOptions {
  // Defaults: the settings docs/results.md measured on the rl-base model (lr 1e-4 and above
  // lowered held-out accuracy there; temperature 0.7 kept more groups informative than 1.0).
  int64_t steps = 150;
  int64_t prompts_per_step = 64;
  int64_t group_size = 8;
  int64_t max_new_tokens = 24;
  double temperature = 0.7;
  double lr = 2e-5;
  double grad_clip = 1.0;  // on the global gradient norm; 0: none
  GrpoOptions grpo;
  int64_t policy_lag = 0;
  int64_t eval_interval = 25;  // 0: only before and after
  int64_t eval_problems = 200;
  uint64_t seed = 1;
  // Rollouts from simulated workers (worker_sim.h) through the intake (rollout_intake.h) and
  // re-scoring (rescore.h), as a remote worker's would be, instead of the learner's own
  // sampling; empty: the learner samples.
  std::vector<WorkerBehaviour> workers;
  int64_t max_off_policy_steps = 2;  // rl.max_off_policy_steps: older rollouts are refused
  double rescore_tolerance = 1e-2;   // largest |claimed - recomputed| log-probability accepted
  // Largest distance of a slot's seeded draw from its token's interval of the policy's
  // cumulative distribution (rl/seeded_draw.h): a worker's tokens must be drawn, not chosen.
  double draw_tolerance = 1e-3;
  int strikes_to_ban = 3;
  std::filesystem::path out_dir = "runs/rl";
  bool table = true;  // print the live table
};

struct GrpoStepStats {
  int64_t step = 0;        // updates done, this one included
  double reward = 0;       // mean over the step's completions
  double informative = 0;  // share of groups whose rewards differ (the others teach nothing)
  double loss = 0;
  bool skipped = false;  // the update was not finite and was not applied
  double clipped_fraction = 0;
  double capped_fraction = 0;
  double mean_ratio = 0;
  double completion_tokens = 0;  // mean per completion
  int64_t rollouts = 0;          // completions offered so far (sampled, or submitted by workers)
  int64_t accepted = 0;          // this step's completions trained on
  int64_t rejected = 0;          // this step's submissions refused or failed re-scoring
  double seconds = 0;            // since the start
  double held_out = -1;          // held-out accuracy when measured at this step, else -1
};

struct GrpoTrainSummary {
  double base_accuracy = 0;
  double final_accuracy = 0;
  int64_t steps = 0;
  int64_t rollouts = 0;
  double seconds = 0;
  std::filesystem::path checkpoint;
  // With workers: submissions per intake verdict ("accepted" counts the intake's; re-scoring
  // failures are "mismatch"), and strikes per worker.
  std::map<std::string, int64_t> verdicts;
  std::map<std::string, int> strikes;
};

// Errors name the option, its value and what is allowed.
void validate(const GrpoTrainOptions& options);

GrpoTrainSummary train_grpo(LoadedCheckpoint base, const Task& task,
                            const GrpoTrainOptions& options,
                            const std::function<void(const GrpoStepStats&)>& on_step = {});

}  // namespace agora
