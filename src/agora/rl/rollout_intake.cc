#include "agora/rl/rollout_intake.h"

#include <fmt/format.h>

#include "agora/core/error.h"

namespace agora {

std::string_view verdict_name(IntakeVerdict verdict) {
  switch (verdict) {
    case IntakeVerdict::kAccepted:
      return "accepted";
    case IntakeVerdict::kBanned:
      return "banned";
    case IntakeVerdict::kMalformed:
      return "malformed";
    case IntakeVerdict::kWrongTask:
      return "wrong_task";
    case IntakeVerdict::kStale:
      return "stale";
    case IntakeVerdict::kFuture:
      return "future";
    case IntakeVerdict::kUnknown:
      return "unknown";
    case IntakeVerdict::kDuplicate:
      return "duplicate";
    case IntakeVerdict::kMismatch:
      return "mismatch";
  }
  return "?";
}

RolloutIntake::RolloutIntake(IntakeOptions options) : options_(std::move(options)) {
  if (options_.group_size < 1)
    fail("rl group size {} is invalid (allowed: >= 1)", options_.group_size);
  if (options_.strikes_to_ban < 1) {
    fail("rl strikes to ban {} is invalid (allowed: >= 1)", options_.strikes_to_ban);
  }
}

void RolloutIntake::open(uint64_t problem_id) {
  open_.try_emplace(problem_id);
}

void RolloutIntake::close(uint64_t problem_id) {
  open_.erase(problem_id);
}

RolloutIntake::Result RolloutIntake::refuse(const std::string& worker, IntakeVerdict verdict,
                                            std::string reason) {
  ++counts_[static_cast<int>(verdict)];
  if (verdict == IntakeVerdict::kMalformed || verdict == IntakeVerdict::kDuplicate) {
    ++strikes_[worker];
  }
  Result r;
  r.verdict = verdict;
  r.reason = std::move(reason);
  return r;
}

RolloutIntake::Result RolloutIntake::submit(const std::string& worker, std::string_view bytes) {
  if (banned(worker)) {
    return refuse(worker, IntakeVerdict::kBanned,
                  fmt::format("worker {} is banned ({} strikes)", worker, strikes(worker)));
  }
  Rollout rollout;
  try {
    rollout = decode_rollout(bytes, options_.limits);
  } catch (const Error& e) {
    return refuse(worker, IntakeVerdict::kMalformed, e.what());
  }
  if (rollout.sample >= options_.group_size) {
    return refuse(worker, IntakeVerdict::kMalformed,
                  fmt::format("sample {} (allowed: below the group size {})", rollout.sample,
                              options_.group_size));
  }
  if (rollout.task != options_.task || rollout.task_seed != options_.task_seed) {
    return refuse(worker, IntakeVerdict::kWrongTask,
                  fmt::format("task {} seed {} (the run's: {} seed {})", rollout.task,
                              rollout.task_seed, options_.task, options_.task_seed));
  }
  if (rollout.policy_version > version_) {
    return refuse(worker, IntakeVerdict::kFuture,
                  fmt::format("policy version {} is ahead of the current {}",
                              rollout.policy_version, version_));
  }
  if (version_ - rollout.policy_version > options_.max_off_policy_steps) {
    return refuse(worker, IntakeVerdict::kStale,
                  fmt::format("policy version {} is {} behind the current {} (allowed: {})",
                              rollout.policy_version, version_ - rollout.policy_version, version_,
                              options_.max_off_policy_steps));
  }
  const auto problem = open_.find(rollout.problem_id);
  if (problem == open_.end()) {
    return refuse(worker, IntakeVerdict::kUnknown,
                  fmt::format("problem {} is not open", rollout.problem_id));
  }
  if (!problem->second.emplace(worker, rollout.sample).second) {
    return refuse(worker, IntakeVerdict::kDuplicate,
                  fmt::format("problem {} sample {} was already submitted", rollout.problem_id,
                              rollout.sample));
  }
  ++counts_[static_cast<int>(IntakeVerdict::kAccepted)];
  Result r;
  r.verdict = IntakeVerdict::kAccepted;
  r.rollout = std::move(rollout);
  return r;
}

void RolloutIntake::strike(const std::string& worker, IntakeVerdict why) {
  ++counts_[static_cast<int>(why)];
  ++strikes_[worker];
}

int RolloutIntake::strikes(const std::string& worker) const {
  const auto it = strikes_.find(worker);
  return it == strikes_.end() ? 0 : it->second;
}

bool RolloutIntake::banned(const std::string& worker) const {
  return strikes(worker) >= options_.strikes_to_ban;
}

}  // namespace agora
