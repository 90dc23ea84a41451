#include "agora/rl/rl_progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "agora/obs/progress.h"

namespace agora {

GrpoStepStats step_stats(int64_t step, const GroupBatch& batch, const GrpoLoss& loss,
                         int64_t prompts_per_step, int64_t rollouts) {
  GrpoStepStats s;
  s.step = step;
  const auto rows = std::max<double>(1.0, static_cast<double>(batch.completions.size()));
  s.reward = batch.reward_sum / rows;
  s.informative = static_cast<double>(batch.informative) / static_cast<double>(prompts_per_step);
  s.loss = loss.loss.defined() ? loss.loss.item<double>() : 0.0;
  s.skipped = loss.skipped;
  s.clipped_fraction = loss.clipped_fraction;
  s.capped_fraction = loss.capped_fraction;
  s.mean_ratio = loss.mean_ratio;
  s.completion_tokens = batch.tokens / rows;
  s.rollouts = rollouts;
  s.accepted = static_cast<int64_t>(batch.completions.size());
  s.rejected = batch.refused;
  return s;
}

nlohmann::json rl_step_json(const GrpoStepStats& s) {
  nlohmann::json row = {{"event", "rl_step"},
                        {"step", s.step},
                        {"reward", s.reward},
                        {"informative_groups", s.informative},
                        {"loss", s.loss},
                        {"clipped_fraction", s.clipped_fraction},
                        {"capped_fraction", s.capped_fraction},
                        {"mean_ratio", s.mean_ratio},
                        {"completion_tokens", s.completion_tokens},
                        {"rollouts", s.rollouts},
                        {"accepted", s.accepted},
                        {"rejected", s.rejected},
                        {"elapsed_s", s.seconds}};
  if (s.held_out >= 0) row["held_out_accuracy"] = s.held_out;
  if (s.skipped) row["skipped"] = true;
  return row;
}

void print_rl_table_header() {
  fmt::print("{:>6}  {:>6}  {:>11}  {:>8}  {:>10}  {:>8}  {:>7}  {:>8}  {:>8}\n", "step", "reward",
             "informative", "held-out", "rollouts/s", "rejected", "clipped", "elapsed", "ETA");
  std::fflush(stdout);
}

void print_rl_table_row(const GrpoStepStats& s, double held_out, int64_t steps) {
  if (s.step == 0) {
    fmt::print("{:>6}  {:>6}  {:>11}  {:>8.3f}  {:>10}  {:>8}  {:>7}  {:>8}  {:>8}\n", 0, "-", "-",
               held_out, "-", "-", "-", format_duration(s.seconds), "-");
  } else {
    const double eta =
        s.seconds / static_cast<double>(s.step) * static_cast<double>(steps - s.step);
    fmt::print("{:>6}  {:>6.3f}  {:>11.2f}  {:>8.3f}  {:>10.1f}  {:>8}  {:>7.3f}  {:>8}  {:>8}\n",
               s.step, s.reward, s.informative, held_out,
               static_cast<double>(s.rollouts) / std::max(1e-9, s.seconds), s.rejected,
               s.clipped_fraction, format_duration(s.seconds), format_duration(eta));
  }
  std::fflush(stdout);
}

}  // namespace agora
