#include "agora/rl/countdown.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "agora/core/error.h"
#include "agora/rl/answer_parse.h"

namespace agora {
namespace {

constexpr int64_t kMaxNumber = 25;
constexpr int64_t kMaxRunning = 999;

// The value of a op b when it is a positive integer, else nullopt.
std::optional<int64_t> apply(int64_t a, char op, int64_t b) {
  switch (op) {
    case '+':
      return a + b;
    case '-':
      return a > b ? std::optional<int64_t>(a - b) : std::nullopt;
    case '*': {
      int64_t product;  // a completion's operands may be up to 10 digits each
      return __builtin_mul_overflow(a, b, &product) ? std::nullopt : std::optional(product);
    }
    case '/':
      return b != 0 && a % b == 0 ? std::optional<int64_t>(a / b) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// Takes one entry equal to `value` out of the pool; false when there is none.
bool take_from(std::vector<int64_t>& pool, int64_t value) {
  const auto it = std::find(pool.begin(), pool.end(), value);
  if (it == pool.end()) return false;
  pool.erase(it);
  return true;
}

}  // namespace

CountdownTask::CountdownTask(const TaskOptions& options)
    : Task(options.seed, options.held_out_fraction), numbers_(options.numbers) {
  if (numbers_ < 2 || numbers_ > 6) {
    fail("rl countdown numbers {} is out of range (allowed: 2 to 6)", numbers_);
  }
}

Problem CountdownTask::make(uint64_t id) const {
  Problem problem;
  problem.id = id;
  uint64_t draw = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::vector<int64_t> numbers(numbers_);
    for (auto& n : numbers) n = uniform(id, draw++, 1, kMaxNumber);
    std::vector<int64_t> order = numbers;
    for (size_t i = order.size() - 1; i > 0; --i) {  // Fisher-Yates
      std::swap(order[i], order[uniform(id, draw++, 0, static_cast<int64_t>(i))]);
    }
    std::string solution;
    int64_t running = order[0];
    for (size_t i = 1; i < order.size(); ++i) {
      std::vector<char> allowed;
      for (char op : {'+', '-', '*', '/'}) {
        const auto value = apply(running, op, order[i]);
        // Multiplying or dividing by 1 teaches nothing; keep the chain small.
        if (value && *value <= kMaxRunning && !((op == '*' || op == '/') && order[i] == 1)) {
          allowed.push_back(op);
        }
      }
      // Never empty: when running + n passes 999, running > n, so subtraction is allowed.
      if (allowed.empty()) allowed.push_back('+');
      const char op = allowed[uniform(id, draw++, 0, static_cast<int64_t>(allowed.size()) - 1)];
      const int64_t value = *apply(running, op, order[i]);
      if (!solution.empty()) solution += ',';
      solution += fmt::format("{}{}{}={}", running, op, order[i], value);
      running = value;
    }
    problem.numbers = numbers;
    problem.target = running;
    problem.solution = solution;
    if (std::find(numbers.begin(), numbers.end(), running) == numbers.end()) break;
  }
  problem.prompt = fmt::format("{} -> {}:", fmt::join(problem.numbers, " "), problem.target);
  return problem;
}

double CountdownTask::reward(const Problem& problem, std::string_view completion) const {
  std::string_view text = rl_parse::trim_end(completion);
  std::vector<int64_t> pool = problem.numbers;
  std::optional<int64_t> last;
  while (true) {
    const auto a = rl_parse::take_integer(text);
    if (!a || text.empty()) return 0.0;
    const char op = text.front();
    text.remove_prefix(1);
    const auto b = rl_parse::take_integer(text);
    if (!b || !rl_parse::take_char(text, '=')) return 0.0;
    const auto c = rl_parse::take_integer(text);
    if (!c || apply(*a, op, *b) != c) return 0.0;
    if (!take_from(pool, *a) || !take_from(pool, *b)) return 0.0;
    pool.push_back(*c);
    last = c;
    if (text.empty()) break;
    if (!rl_parse::take_char(text, ',')) return 0.0;
  }
  return last == problem.target ? 1.0 : 0.0;
}

}  // namespace agora
