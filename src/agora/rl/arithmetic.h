// Multi-digit arithmetic: "372+49=" -> "421", "512-87=" -> "425".
//
// Each operand has 1..max_digits digits (the digit count drawn first, so short and long operands
// are equally common); the operation is + or - with equal odds, and a subtraction's operands are
// ordered so the result is never negative.
//
// Two answer formats, one task each, with the same problems (and so the same held-out split):
// - "arithmetic": the answer alone. The checker accepts exactly the canonical decimal result (no
//   sign, no leading zero), optionally followed by spaces or newlines.
// - "arithmetic-worked": the answer worked column by column, least significant column first, as
//   taught in school, then the answer after a ';'. A column is "a+b+c=s" for addition (c the
//   carry in, s the column's sum, whose tens digit is the next carry) and "a-b-c=d" for
//   subtraction (c the borrow in; when a - b - c < 0 the column borrows and a is written with a
//   leading 1: "12-7-0=5"). A missing digit is 0. So "372+49=" ->
//   "2+9+0=11,7+4+1=12,3+0+1=4;421". Each column is a small local step, which is what lets a
//   small model learn the carry that it cannot do in its head. The checker reads only what
//   follows the ';' (the working is the model's own business, as a reasoning trace is), with
//   the same strictness as the plain format; a completion without exactly one ';' scores 0, so
//   a model cannot offer several answers.
#pragma once

#include "agora/rl/task.h"

namespace agora {

class ArithmeticTask final : public Task {
 public:
  // Error when max_digits is outside [1, 9].
  ArithmeticTask(const TaskOptions& options, bool worked);

  std::string name() const override { return worked_ ? "arithmetic-worked" : "arithmetic"; }
  Problem make(uint64_t id) const override;
  double reward(const Problem& problem, std::string_view completion) const override;

  // The column-by-column working of a op b, answer included (the format above). `careless`
  // works it as a careless student does: every column as above, but no carry or borrow is ever
  // passed on (c is always 0), and the answer is read off the columns, so it is wrong whenever
  // a column carries or borrows. The base model's corpus mixes some of these in (agora rl
  // corpus --careless): a base that knows both methods, and prefers the wrong one, is the
  // situation RL post-training is for.
  static std::string worked_answer(int64_t a, int64_t b, bool subtract, bool careless = false);
  // The solution a base model's corpus gives for `problem`: the careless working for a share
  // `careless` of problems (drawn from the task's seed and the problem's id, so the same corpus
  // comes out everywhere), else the problem's solution. Error unless the task is the worked
  // one or the share is 0, or when the share is outside [0, 1].
  std::string corpus_solution(const Problem& problem, double careless) const;

 private:
  int max_digits_;
  bool worked_;
};

}  // namespace agora
