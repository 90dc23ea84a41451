#include "agora/rl/task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/rl/arithmetic.h"
#include "agora/rl/countdown.h"

namespace agora {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Task::Task(uint64_t seed, double held_out_fraction)
    : seed_(seed), held_out_fraction_(held_out_fraction) {
  if (!(held_out_fraction >= 0.0 && held_out_fraction < 1.0)) {
    fail("rl held-out fraction {} is out of range (allowed: 0 <= F < 1)", held_out_fraction);
  }
}

bool Task::held_out(const Problem& problem) const {
  return static_cast<long double>(stable_hash64(problem.prompt)) <
         static_cast<long double>(held_out_fraction_) * 18446744073709551616.0L;
}

Problem Task::next(uint64_t& id, bool want_held_out) const {
  // With a fraction in [0, 1) both splits are non-empty in expectation; the bound only stops a
  // pathological task whose every prompt hashes into one split.
  for (int tries = 0; tries < 1'000'000; ++tries) {
    Problem problem = make(id++);
    if (held_out(problem) == want_held_out) return problem;
  }
  fail("task {} found no {} problem in a million ids (held-out fraction {})", name(),
       want_held_out ? "held-out" : "training", held_out_fraction_);
}

int64_t Task::uniform(uint64_t id, uint64_t draw, int64_t lo, int64_t hi) const {
  const uint64_t stream = splitmix64(splitmix64(seed_) ^ id);
  const uint64_t bits = splitmix64(stream + draw * 0xD1B54A32D192ED03ull);
  const auto span = static_cast<unsigned __int128>(hi - lo + 1);
  // The high half of bits * span: uniform to within span / 2^64, with no rejection loop.
  return lo + static_cast<int64_t>((static_cast<unsigned __int128>(bits) * span) >> 64);
}

std::vector<std::string> task_names() {
  return {"arithmetic", "arithmetic-worked", "countdown"};
}

std::unique_ptr<Task> make_task(std::string_view name, const TaskOptions& options) {
  if (name == "arithmetic") return std::make_unique<ArithmeticTask>(options, /*worked=*/false);
  if (name == "arithmetic-worked") {
    return std::make_unique<ArithmeticTask>(options, /*worked=*/true);
  }
  if (name == "countdown") return std::make_unique<CountdownTask>(options);
  fail("unknown rl task '{}' (allowed: {})", name, fmt::join(task_names(), ", "));
}

}  // namespace agora
