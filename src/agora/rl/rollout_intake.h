// RolloutIntake: the learner's gate for rollouts that workers submit (docs/rl.md section 5).
//
// Every worker is a potential attacker. The intake decides from the bytes, the learner's state
// (the open problems, the current policy version) and the worker's record alone, so every learner
// replaying the same submissions decides the same. A rollout is refused, in this order, when:
//   banned        its worker reached `strikes_to_ban` strikes;
//   malformed     it does not decode (rollout.h), or its sample index is not below group_size;
//   wrong_task    it names another task or task seed than the run's;
//   stale         its policy version is more than max_off_policy_steps behind the current one;
//   future        its policy version is ahead of the current one (no such policy exists);
//   unknown       its problem is not open (never asked for, or already trained on: a replay of
//                 an old rollout lands here);
//   duplicate     its worker already submitted this (problem, sample): a resubmission.
// Otherwise it is accepted, pending the learner's re-scoring of its log-probabilities; a
// rollout that fails that is reported back with strike(). Malformed, duplicate and re-scoring
// failures strike the worker; stale, future and unknown rollouts are refused without a strike,
// since an honest but slow worker sends them too.
//
// Memory is bounded by what the learner controls: the open problems (it opens and closes them)
// times the identities per problem (workers x group_size, each (worker, sample) at most once).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "agora/rl/rollout.h"

namespace agora {

enum class IntakeVerdict {
  kAccepted,
  kBanned,
  kMalformed,
  kWrongTask,
  kStale,
  kFuture,
  kUnknown,
  kDuplicate,
  kMismatch,  // reported by the learner's re-scoring (strike())
};
std::string_view verdict_name(IntakeVerdict verdict);
inline constexpr int kIntakeVerdicts = 9;

struct IntakeOptions {
  std::string task;
  uint64_t task_seed = 0;
  uint64_t max_off_policy_steps = 2;
  uint32_t group_size = 8;
  RolloutLimits limits;
  int strikes_to_ban = 3;
};

class RolloutIntake {
 public:
  explicit RolloutIntake(IntakeOptions options);

  // The problems workers may answer; close() forgets a problem's identities.
  void open(uint64_t problem_id);
  void close(uint64_t problem_id);
  void set_version(uint64_t current) { version_ = current; }

  struct Result {
    IntakeVerdict verdict = IntakeVerdict::kMalformed;
    std::optional<Rollout> rollout;  // when accepted
    std::string reason;              // for a refusal: what was wrong
  };
  Result submit(const std::string& worker, std::string_view bytes);

  // A strike for a rollout this intake accepted that the learner's re-scoring rejected.
  void strike(const std::string& worker, IntakeVerdict why);
  bool banned(const std::string& worker) const;
  int strikes(const std::string& worker) const;
  // Every worker's strikes, and putting them back (a learner's restart).
  const std::map<std::string, int>& strikes_by_worker() const { return strikes_; }
  void restore_strikes(std::map<std::string, int> strikes) { strikes_ = std::move(strikes); }

  // How many submissions got each verdict (kMismatch: strikes reported by the learner).
  int64_t count(IntakeVerdict verdict) const { return counts_[static_cast<int>(verdict)]; }

 private:
  Result refuse(const std::string& worker, IntakeVerdict verdict, std::string reason);

  IntakeOptions options_;
  uint64_t version_ = 0;
  std::map<uint64_t, std::set<std::pair<std::string, uint32_t>>> open_;  // problem -> identities
  std::map<std::string, int> strikes_;
  int64_t counts_[kIntakeVerdicts] = {};
};

}  // namespace agora
