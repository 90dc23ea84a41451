// Fuzzes the RL tasks' checkers: a completion is whatever bytes a model (or a cheating worker)
// produced, and the reward is computed from them alone. Any bytes must score 0 or 1 without
// crashing or reading out of bounds; the first byte picks the task (its low two bits) and the
// problem, so the checkers see real problems (pools, targets) and not only a fixed one; the
// problem's own solution must score 1.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "agora/rl/task.h"

namespace {

const agora::Task& task(int which) {
  static const auto tasks = [] {
    agora::TaskOptions options;
    return std::array<std::unique_ptr<agora::Task>, 4>{
        agora::make_task("arithmetic", options), agora::make_task("countdown", options),
        agora::make_task("arithmetic-worked", options), agora::make_task("countdown", options)};
  }();
  return *tasks[static_cast<size_t>(which)];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const agora::Task& t = task(data[0] & 3);
  const agora::Problem problem = t.make(data[0] >> 2);
  const std::string_view completion(reinterpret_cast<const char*>(data + 1), size - 1);
  const double reward = t.reward(problem, completion);
  if (reward != 0.0 && reward != 1.0) std::abort();
  if (t.reward(problem, problem.solution) != 1.0) std::abort();
  return 0;
}
