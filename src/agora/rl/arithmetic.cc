#include "agora/rl/arithmetic.h"

#include <fmt/format.h>

#include <utility>

#include "agora/core/error.h"
#include "agora/rl/answer_parse.h"

namespace agora {

ArithmeticTask::ArithmeticTask(const TaskOptions& options)
    : Task(options.seed, options.held_out_fraction), max_digits_(options.max_digits) {
  if (max_digits_ < 1 || max_digits_ > 9) {
    fail("rl arithmetic max digits {} is out of range (allowed: 1 to 9)", max_digits_);
  }
}

Problem ArithmeticTask::make(uint64_t id) const {
  auto operand = [&](uint64_t draw) {
    const int digits = static_cast<int>(uniform(id, draw, 1, max_digits_));
    int64_t low = 1;
    for (int i = 1; i < digits; ++i) low *= 10;
    return uniform(id, draw + 1, digits == 1 ? 0 : low, low * 10 - 1);
  };
  int64_t a = operand(0);
  int64_t b = operand(2);
  const bool subtract = uniform(id, 4, 0, 1) == 1;
  if (subtract && a < b) std::swap(a, b);
  const int64_t result = subtract ? a - b : a + b;

  Problem problem;
  problem.id = id;
  problem.prompt = fmt::format("{}{}{}=", a, subtract ? '-' : '+', b);
  problem.solution = fmt::format("{}", result);
  problem.numbers = {a, b};
  problem.target = result;
  return problem;
}

double ArithmeticTask::reward(const Problem& problem, std::string_view completion) const {
  std::string_view text = rl_parse::trim_end(completion);
  const auto value = rl_parse::take_integer(text);
  return value && text.empty() && *value == problem.target ? 1.0 : 0.0;
}

}  // namespace agora
