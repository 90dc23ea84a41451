// Multi-digit arithmetic: "372+49=" -> "421", "512-87=" -> "425".
//
// Each operand has 1..max_digits digits (the digit count drawn first, so short and long operands
// are equally common); the operation is + or - with equal odds, and a subtraction's operands are
// ordered so the result is never negative. The checker accepts exactly the canonical decimal
// result (no sign, no leading zero), optionally followed by spaces or newlines.
#pragma once

#include "agora/rl/task.h"

namespace agora {

class ArithmeticTask final : public Task {
 public:
  // Error when max_digits is outside [1, 9].
  explicit ArithmeticTask(const TaskOptions& options);

  std::string name() const override { return "arithmetic"; }
  Problem make(uint64_t id) const override;
  double reward(const Problem& problem, std::string_view completion) const override;

 private:
  int max_digits_;
};

}  // namespace agora
