// What a run config says about each step: the learning-rate schedule, the Token Superposition
// phase and the data tokens read so far (RunConfig::learning_rate and its neighbours in
// run_config.h, where the formulas are written out). Pure arithmetic on validated fields;
// parsing and checking live in run_config.cc.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "agora/config/run_config.h"
#include "agora/core/error.h"

namespace agora {

int64_t RunConfig::decay_steps() const {
  if (schedule.kind != "wsd") return 0;
  const auto rounded = static_cast<int64_t>(
      std::llround(schedule.decay_fraction * static_cast<double>(train.steps)));
  return std::clamp<int64_t>(rounded, 1, train.steps);
}

int64_t RunConfig::tst_switch_step() const {
  return std::clamp<int64_t>(std::llround(tst.fraction * static_cast<double>(train.steps)), 0,
                             train.steps);
}

int64_t RunConfig::bag_at(int64_t step) const {
  return step < tst_switch_step() ? tst.bag : 1;
}

uint64_t RunConfig::data_tokens_through(int64_t steps) const {
  const auto per_step = static_cast<uint64_t>(train.batch_size * data.seq_len);
  const auto bagged =
      static_cast<uint64_t>(std::min(std::max<int64_t>(steps, 0), tst_switch_step()));
  const auto plain = static_cast<uint64_t>(std::max<int64_t>(steps, 0)) - bagged;
  return per_step * (bagged * static_cast<uint64_t>(tst.bag) + plain);
}

double RunConfig::learning_rate(int64_t step) const {
  if (step < 0) fail("learning_rate: step = {} is invalid (allowed: an integer >= 0)", step);
  const double lr = optimizer.lr;
  const double floor = lr * schedule.min_lr_ratio;
  const int64_t warmup = schedule.warmup_steps, steps = train.steps;
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (schedule.kind == "constant") return lr;
  if (schedule.kind == "cosine") {
    const double span = static_cast<double>(steps - warmup);
    const double progress =
        span <= 0 ? 1.0 : std::min(1.0, static_cast<double>(step - warmup) / span);
    return floor + (lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  // wsd
  const int64_t decay = decay_steps(), decay_start = steps - decay;
  if (step < decay_start) return lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - decay_start + 1) / static_cast<double>(decay));
  return lr - (lr - floor) * progress;
}

}  // namespace agora
