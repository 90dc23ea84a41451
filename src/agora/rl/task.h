// Tasks with verifiable rewards: procedurally generated problems and their exact checkers.
//
// RL post-training (docs/rl.md) needs problems whose answers a program can check, so a reward
// never depends on anyone's word. A Task is a pure function of (seed, id) -> Problem, plus a
// checker that scores a completion against its problem:
// - make(id) is deterministic: the same seed and id give the same problem on every machine
//   (integer arithmetic from SplitMix64, no std:: distributions), so a rollout names its problem
//   by id alone and the learner rebuilds it instead of trusting the worker's copy.
// - The split is by content: a problem is held out when the hash of its prompt, read as a
//   fraction of 2^64, is below the held-out fraction. The same prompt is never in both splits,
//   whatever ids produced it; the base model's corpus takes train problems only.
// - reward() is 1 for a correct completion and 0 otherwise; it reads only the completion's
//   bytes, never crashes on any bytes, and ignores nothing after the answer (a completion must
//   be exactly an answer: trailing text scores 0), so a model cannot hedge.
// Tasks are immutable; their methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

struct Problem {
  uint64_t id = 0;
  std::string prompt;    // what the model is given, e.g. "372+49="
  std::string solution;  // one correct completion, e.g. "421" (the pretraining corpus's answer)
  // The facts the checker needs: the operands (arithmetic) or the numbers given (countdown),
  // and the value to reach.
  std::vector<int64_t> numbers;
  int64_t target = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  virtual std::string name() const = 0;
  virtual Problem make(uint64_t id) const = 0;
  // 1 when `completion` (the decoded text after the prompt, end-of-text excluded) solves the
  // problem, else 0.
  virtual double reward(const Problem& problem, std::string_view completion) const = 0;

  // Whether a problem belongs to the held-out split (see above).
  bool held_out(const Problem& problem) const;
  // The next problem at or after `id` in the asked split; `id` moves past it.
  Problem next(uint64_t& id, bool want_held_out) const;

  uint64_t seed() const { return seed_; }
  double held_out_fraction() const { return held_out_fraction_; }

 protected:
  Task(uint64_t seed, double held_out_fraction);
  // A uniform integer in [lo, hi] from the stream of (seed, id), draw number `draw`.
  int64_t uniform(uint64_t id, uint64_t draw, int64_t lo, int64_t hi) const;

 private:
  uint64_t seed_;
  double held_out_fraction_;
};

struct TaskOptions {
  uint64_t seed = 1;
  double held_out_fraction = 0.1;
  // arithmetic: operands have 1..max_digits digits; countdown: how many numbers are given.
  int max_digits = 3;
  int numbers = 4;
};

// "arithmetic", "arithmetic-worked" or "countdown"; Error naming the value and the allowed ones otherwise, or a
// bad option.
std::unique_ptr<Task> make_task(std::string_view name, const TaskOptions& options);
std::vector<std::string> task_names();

}  // namespace agora
