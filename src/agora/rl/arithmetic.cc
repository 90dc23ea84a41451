#include "agora/rl/arithmetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "agora/core/error.h"
#include "agora/rl/answer_parse.h"

namespace agora {

ArithmeticTask::ArithmeticTask(const TaskOptions& options, bool worked)
    : Task(options.seed, options.held_out_fraction),
      max_digits_(options.max_digits),
      worked_(worked) {
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
  problem.solution = worked_ ? worked_answer(a, b, subtract) : fmt::format("{}", result);
  problem.numbers = {a, b};
  problem.target = result;
  return problem;
}

std::string ArithmeticTask::worked_answer(int64_t a, int64_t b, bool subtract, bool careless) {
  std::string out;
  std::string digits;  // the columns' digits, least significant first
  int64_t carry = 0;   // the carry (addition) or the borrow (subtraction) into the column
  for (int64_t x = a, y = b; x > 0 || y > 0 || out.empty(); x /= 10, y /= 10) {
    const int64_t da = x % 10, db = y % 10;
    if (!out.empty()) out += ',';
    int64_t next = 0;
    if (!subtract) {
      const int64_t sum = da + db + carry;
      out += fmt::format("{}+{}+{}={}", da, db, carry, sum);
      digits += static_cast<char>('0' + sum % 10);
      next = sum / 10;
    } else {
      const bool borrow = da - db - carry < 0;
      const int64_t d = da - db - carry + (borrow ? 10 : 0);
      out += fmt::format("{}{}-{}-{}={}", borrow ? "1" : "", da, db, carry, d);
      digits += static_cast<char>('0' + d);
      next = borrow ? 1 : 0;
    }
    carry = careless ? 0 : next;
  }
  if (!careless) return out + fmt::format(";{}", subtract ? a - b : a + b);
  // The careless answer: the columns' digits, most significant first, without leading zeros.
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::reverse(digits.begin(), digits.end());
  return out + ";" + digits;
}

std::string ArithmeticTask::corpus_solution(const Problem& problem, double careless) const {
  if (!(careless >= 0 && careless <= 1)) {
    fail("rl careless share {} is invalid (allowed: 0 to 1)", careless);
  }
  if (careless == 0) return problem.solution;
  if (!worked_)
    fail("rl careless working applies to arithmetic-worked only (the task is {})", name());
  // Draw 5: make() uses draws 0 to 4.
  if (uniform(problem.id, 5, 0, 999'999) >= static_cast<int64_t>(careless * 1e6)) {
    return problem.solution;
  }
  return worked_answer(problem.numbers.at(0), problem.numbers.at(1),
                       problem.prompt.find('-') != std::string::npos, /*careless=*/true);
}

double ArithmeticTask::reward(const Problem& problem, std::string_view completion) const {
  std::string_view text = rl_parse::trim_end(completion);
  if (worked_) {
    const size_t semicolon = text.find(';');
    if (semicolon == std::string_view::npos || text.rfind(';') != semicolon) return 0.0;
    text.remove_prefix(semicolon + 1);
  }
  const auto value = rl_parse::take_integer(text);
  return value && text.empty() && *value == problem.target ? 1.0 : 0.0;
}

}  // namespace agora
