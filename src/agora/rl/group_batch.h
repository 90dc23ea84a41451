// GroupBatch: one GRPO update's rows, built group by group, and the update itself.
//
// Every group is scored by the task's checker (the only source of rewards) and its advantages
// normalised within the group (grpo.h); a group of fewer than two completions is dropped, since
// it has nothing to be compared with. grpo_update() then scores every row under the model being
// trained and takes one AdamW step on GRPO's loss. Shared by the learner (grpo_trainer.h) and the
// SAPO swarm (sapo.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"
#include "agora/rl/grpo.h"
#include "agora/rl/task.h"

namespace agora {

// One completion of a group: its tokens and the log-probabilities it was sampled with (empty
// when unknown, e.g. a completion another node sampled: see grpo_update).
struct Sample {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
};

struct GroupBatch {
  std::vector<std::vector<TokenId>> prompts, completions;
  std::vector<std::vector<float>> old_logprobs;
  std::vector<float> advantages;
  std::vector<double> rewards;  // per group, the mean
  double reward_sum = 0, tokens = 0;
  int64_t informative = 0;  // groups whose rewards differ
  int64_t submitted = 0;    // completions offered, trained on or not (the caller counts them)
  int64_t refused = 0;      // by an intake or by re-scoring
};

// Scores `group` for `problem` and adds its rows. Returns the group's rewards.
std::vector<double> add_group(GroupBatch& batch, const Task& task, const Tokenizer& tokenizer,
                              const Problem& problem, const std::vector<TokenId>& prompt,
                              std::vector<Sample> group, const GrpoOptions& grpo);

// One AdamW step on GRPO's loss over the batch's rows (none: no step, an undefined loss). A row
// without recorded log-probabilities takes the model's own, detached: its ratio is 1, which is
// exact for a policy that did sample it and SAPO's treatment of another node's text. A loss or
// gradient that is not finite takes no step (GrpoLoss::skipped).
GrpoLoss grpo_update(Llama& model, torch::optim::Optimizer& optimizer, TokenId eot_id,
                     const GroupBatch& batch, double temperature, double grad_clip,
                     const GrpoOptions& grpo);

}  // namespace agora
