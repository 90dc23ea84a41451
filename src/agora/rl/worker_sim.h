// Simulated rollout workers, honest or cheating, in the learner's process.
//
// Until rollout workers run as their own processes (docs/rl.md section 5), these stand in for
// them so that the learner's checks meet every attack as bytes: each worker encodes what it
// submits (rollout.h) and the learner decodes, admits (rollout_intake.h) and re-scores
// (rescore.h) it exactly as it would a remote worker's message. The G completions of a problem
// are dealt round-robin: worker w answers samples w, w + W, w + 2W, ...
//
// Behaviours:
//   honest        samples with the policy it was given and says which version it is.
//   other-model   samples with the base model it started from and never updates, but claims
//                 the current version (a worker running another, cheaper model).
//   fabricate     submits the problem's correct answer with invented log-probabilities (-0.01
//                 per token) and the current version: rewards it never earned.
//   replay        submits honest samples, then each of them again, and last step's again.
//   stale         samples with the base model and honestly says version 0: refused once the
//                 run is more than max_off_policy_steps past it.
//   teacher-force submits the problem's correct answer with its true log-probabilities under
//                 the policy (scored by teacher forcing): passes re-scoring, but its tokens were
//                 chosen, not drawn by the slot's seed (seeded_draw.h).
// Every worker samples slot (problem, sample) with the seed slot_seed(kLocalRunId, problem,
// sample), as a network worker does with its run's id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"
#include "agora/rl/task.h"

namespace agora {

enum class WorkerBehaviour { kHonest, kOtherModel, kFabricate, kReplay, kStale, kTeacherForce };

// The run id of a learner and its simulated workers in one process: the seeds' first field.
inline constexpr std::string_view kLocalRunId = "local";

// "honest", "other-model", "fabricate", "replay", "stale", "teacher-force"; Error naming the
// allowed ones.
WorkerBehaviour parse_worker_behaviour(std::string_view name);
std::string_view behaviour_name(WorkerBehaviour behaviour);

struct Submission {
  std::string worker;
  std::string bytes;
};

class SimulatedWorkers {
 public:
  // `base` is copied: the model the cheating workers keep.
  SimulatedWorkers(std::vector<WorkerBehaviour> behaviours, Llama& base);

  size_t size() const { return behaviours_.size(); }
  std::string name(size_t worker) const;
  WorkerBehaviour behaviour(size_t worker) const { return behaviours_[worker]; }

  struct Request {
    const Task* task = nullptr;
    const Tokenizer* tokenizer = nullptr;
    Llama* policy = nullptr;  // what an honest worker samples with
    uint64_t policy_version = 0;
    uint64_t current_version = 0;  // what a lying worker claims
    std::vector<Problem> problems;
    int64_t group_size = 8;
    int64_t max_new_tokens = 24;
    double temperature = 1.0;
    uint64_t seed = 0;  // this step's
  };
  // Every worker's submissions for these problems, in worker order.
  std::vector<Submission> produce(const Request& request);

 private:
  std::vector<WorkerBehaviour> behaviours_;
  Llama frozen_{nullptr};
  std::vector<std::vector<std::string>> last_;  // per worker: last step's submissions (replay)
};

}  // namespace agora
