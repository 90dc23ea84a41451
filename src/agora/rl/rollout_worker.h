// A rollout worker: the inference-only role of an RL run (docs/rl.md section 6).
//
// It connects to a learner (learner_server.h) over CURVE, says who it is, checks that its base
// checkpoint is the one the run starts from (by state hash), and then loops: ask for work, bring
// its policy up to the version the learner names (int8 deltas, or the whole policy when it is
// too far behind, each checked against the state hash the learner sent), sample a completion for
// every slot it was handed (the KV-cache sampler of sampling.h, at the run's temperature, each
// slot's tokens drawn by the slot's seed of seeded_draw.h, which the learner checks), and
// submit each as a signed rollout. It stops when the learner says the run is over, when it is
// banned, or when the learner has not answered for `idle_timeout_seconds`.
//
// `behaviour` makes it cheat, for tests and benchmarks of the learner's checks (worker_sim.h
// describes each): other-model never updates its policy but claims the newest version;
// fabricate submits the right answer with invented log-probabilities; replay submits every
// rollout twice and the previous batch's again; stale samples with the base policy and says so;
// teacher-force submits the right answer with its true log-probabilities (caught by the seeded
// draws, not by re-scoring).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "agora/net/identity.h"
#include "agora/rl/worker_sim.h"

namespace agora {

struct RolloutWorkerOptions {
  std::string learner;  // "tcp://host:port"
  net::PublicKey learner_key;
  std::filesystem::path base;  // the base checkpoint the run starts from
  WorkerBehaviour behaviour = WorkerBehaviour::kHonest;
  uint32_t slots_per_request = 16;
  double idle_timeout_seconds = 60;
  std::filesystem::path log;  // JSON lines (rl_worker_* events); empty: none
  bool progress = true;       // a status line on stderr every few seconds
};

struct RolloutWorkerSummary {
  int64_t submitted = 0;
  std::map<std::string, int64_t> receipts;  // by verdict
  uint64_t version = 0;                     // the policy version it ended with
  int64_t policy_bytes = 0;
  int64_t hash_mismatches = 0;  // policy updates whose state hash did not match
  bool finished = false;        // the learner said the run is over
  std::string refused;          // why the learner refused it, when it did
  double seconds = 0;
};

// Throws Error when the learner cannot be reached (idle timeout), or the base checkpoint is not
// the run's.
RolloutWorkerSummary run_rollout_worker(const net::Identity& identity,
                                        const RolloutWorkerOptions& options);

}  // namespace agora
