// LearnerServer: the GRPO learner as a network service, and the coordinator of an RL run
// (docs/rl.md section 6).
//
// Rollout workers (rollout_worker.h) connect over CURVE (net/curve_socket.h), say who they are
// (RlHello: their ed25519 key, which must be the key the handshake authenticated), fetch the
// policy, ask for work and submit signed rollouts. The learner:
//   - chooses the work: each step opens `prompts_per_step` training problems, a group of
//     `group_size` slots each (slot_pool.h), and hands slots to whoever asks;
//   - trusts nothing a worker claims: a rollout's signature is checked, then the intake
//     (rollout_intake.h) refuses what is malformed, for another task, too old, from the future,
//     for a problem not open, or a resubmission; a rollout for a slot the worker was not handed
//     is refused as unassigned; a `rescore_rate` share of the rest (all, by default) is re-scored
//     (rescore.h) under the very policy version it claims, and a disagreement strikes the worker.
//     Rewards are computed here, by the task's checker, from the tokens alone.
//   - trains: once every slot of the step is filled (or `step_timeout_seconds` passed and at
//     least one group has two completions), one GRPO update (group_batch.h) on the filled slots,
//     in (problem, sample) order;
//   - publishes: the update's int8 delta (published_policy.h), hash-checked by workers.
//
// Every map keyed by what a worker sends is bounded: workers by `max_workers` (a key beyond it
// is refused; banned workers do not count, and a worker silent for two minutes is forgotten),
// slots and identities by what the learner opened, messages by a token bucket per worker and
// one for all strangers' hellos (excess dropped and counted), policy replies by
// `max_policy_bytes_in_flight` and `max_policy_bytes_per_worker`. Cheap checks come first: a
// banned worker's rollouts cost no signature check, and a rollout that would not fit the
// model's context is refused before re-scoring. Re-scoring runs in batches of at most 64.
//
// States of the run, in order: training (steps 1..steps), finishing (the last update is done:
// workers asking for work are told the run is over, for `linger_seconds`), done.
//
// Restarts: every `checkpoint_every` updates, and when it stops, the learner saves what it needs
// to go on into out_dir/resume (learner_durable.cc). Started again with the same options and
// out_dir after a kill, it resumes from the newest save: the policy and AdamW's moments, the
// published copy (workers' deltas go on from it), the step, the problems' cursor and every
// worker's strikes. Updates after that save are done again; a worker that holds a newer policy
// than the learner's fetches the whole policy. A run that finished leaves out_dir to a new run.
//
// Progress: the live table and rl.jsonl of grpo_trainer.h (event rl_step, then rl_intake with
// the verdicts and each worker's strikes), rl_worker events when a worker joins or is banned;
// with `http`, /metrics (obs/metrics_catalogue.h, agora_rl_*), /api/rl (JSON) and a page at /.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/obs/http_server.h"
#include "agora/rl/grpo_trainer.h"
#include "agora/rl/task.h"
#include "agora/train/checkpoint.h"

namespace agora {

struct LearnerOptions {
  GrpoTrainOptions train;  // workers and policy_lag are not used: workers are remote
  TaskOptions task;
  std::string task_name = "arithmetic";
  std::string run_id = "rl";
  std::string listen = "tcp://0.0.0.0:7600";
  net::Admission admission;  // who may connect (default: anyone with a key)
  std::optional<obs::HttpAddress> http;
  double rescore_rate = 1.0;     // share of accepted rollouts re-scored, in (0, 1]
  double reassign_seconds = 20;  // a slot not answered this long is handed to another worker
  // Train on the complete groups this long after a step opened, even if slots are missing (a
  // slot handed to max_handouts workers that all went silent is never filled); 0: wait forever.
  double step_timeout_seconds = 300;
  uint32_t max_slots_per_worker = 64;
  int max_workers = 256;
  // A message per rollout: a fast worker sends thousands a second. The bucket stops a flood from
  // taking the learner's thread, not an honest worker.
  double worker_messages_per_second = 5000, worker_burst = 20000;
  // Policy bytes queued to workers and not yet written: in all, and per worker (one reply may
  // always wait per worker, whatever its size).
  int64_t max_policy_bytes_in_flight = int64_t{1} << 30;
  int64_t max_policy_bytes_per_worker = int64_t{64} << 20;
  double linger_seconds = 3;
  // Updates between saves of what a restart resumes from (out_dir/resume: the policy, AdamW's
  // state, the published copy, the step, the problem cursor and the strikes); 0: at the end only.
  int64_t checkpoint_every = 10;
  // Set (from another thread or a signal handler) to stop serving: the learner saves what it
  // has trained so far and returns.
  const std::atomic<bool>* stop = nullptr;
};

// Errors name the option, its value and what is allowed.
void validate(const LearnerOptions& options);

// Serves until the run is done; returns what train_grpo returns. Throws Error when the listen
// address cannot be bound or the base checkpoint does not fit the task.
GrpoTrainSummary serve_learner(LoadedCheckpoint base, const net::Identity& identity,
                               const LearnerOptions& options);

}  // namespace agora
