// Countdown: reach a target from a handful of numbers, "3 7 12 5 -> 40:" -> "12-5=7,7*3=21,...".
//
// A problem gives `numbers` integers in [1, 25] and a target. A completion is a chain of steps
// separated by commas, each "a op b=c" with op one of + - * /. The checker keeps a pool that
// starts as the given numbers: each step takes a and b out of the pool (two distinct entries),
// must compute c exactly (division only when it leaves no remainder; every c a positive
// integer), and puts c into the pool. The completion is correct when every step is valid, there
// is at least one, and the last step's c is the target. Not every number must be used.
//
// Generation: the numbers are drawn, shuffled, and folded left to right with a drawn operation
// among those that keep the running value a positive integer below 1000; the target is the
// result, redrawn (up to 16 times) while it equals one of the numbers. That fold is the
// problem's solution, so every problem is solvable.
#pragma once

#include "agora/rl/task.h"

namespace agora {

class CountdownTask final : public Task {
 public:
  // Error when options.numbers is outside [2, 6].
  explicit CountdownTask(const TaskOptions& options);

  std::string name() const override { return "countdown"; }
  Problem make(uint64_t id) const override;
  double reward(const Problem& problem, std::string_view completion) const override;

 private:
  int numbers_;
};

}  // namespace agora
