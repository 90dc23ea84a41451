// SAPO: a swarm of nodes that each keep their own policy and share rollouts as text.
//
// Gensyn's Swarm sAmpling Policy Optimization ("Sharing is Caring", 2025): every round each node
// samples groups of completions for its own problems with its own policy, scores them, and
// publishes them (problem and completion tokens, no weights and no log-probabilities); then it
// trains, with one GRPO update, on `own` of its groups plus `shared` groups drawn from what the
// other nodes published that round. Nothing but text crosses between nodes, so nodes may differ
// in model and hardware; what they gain is each other's exploration.
//
// Here the nodes run in one process, one after another, on one clock: the decisions are the
// real ones (sampling, checkers, GRPO), and the figure is reward, not speed. Shared groups are
// drawn, seeded, among the others' groups whose rewards differ (a group whose completions all
// scored alike has zero advantage: it would be a wasted slot); another node's completion is
// scored under the receiving node's policy (ratio 1), as SAPO treats shared text.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "agora/rl/grpo.h"
#include "agora/rl/task.h"
#include "agora/train/checkpoint.h"

namespace agora {

struct SapoOptions {
  int64_t nodes = 4;
  int64_t rounds = 50;
  int64_t own = 8;     // I: a node's own groups trained on per round (and sampled)
  int64_t shared = 0;  // J: groups taken from the others' per round
  int64_t group_size = 8;
  int64_t max_new_tokens = 24;
  double temperature = 0.7;
  double lr = 2e-5;
  double grad_clip = 1.0;
  GrpoOptions grpo;
  int64_t eval_problems = 200;
  uint64_t seed = 1;
};

struct SapoRound {
  int64_t round = 0;
  std::vector<double> reward;    // per node: the mean reward of the completions it sampled
  double mean_reward = 0;        // over nodes
  double cumulative_reward = 0;  // the sum of mean_reward over the rounds so far
  double seconds = 0;
};

struct SapoSummary {
  double cumulative_reward = 0;
  double base_accuracy = 0;      // held-out, greedy (every node starts from the base)
  std::vector<double> accuracy;  // per node, at the end
  double mean_accuracy = 0;
  double seconds = 0;
};

// Errors name the option, its value and what is allowed.
void validate(const SapoOptions& options);

SapoSummary run_sapo(const LoadedCheckpoint& base, const Task& task, const SapoOptions& options,
                     const std::function<void(const SapoRound&)>& on_round = {});

}  // namespace agora
