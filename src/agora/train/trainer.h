// The local trainer: one process training a Llama on token shards with a Strategy.
//
// Per optimizer step s (0-based), with global batch B, micro-batch b and sequence length T:
//   1. the learning rate comes from the run's schedule;
//   2. B/b micro-batches: sequence ids s*B + k*b .. s*B + k*b + b - 1 from the sampler (so the
//      data position is a function of the step alone), forward, loss / (B/b), backward;
//   3. gradients clipped to the run's global norm (local to this process);
//   4. strategy.contribute() then strategy.apply() with that one contribution.
// Validation every eval_interval steps and at the end; checkpoints every checkpoint_interval
// steps and at the end, as OUT/checkpoint_<step>/ with OUT/latest pointing at the newest.
//
// Determinism: the same config and seed give the same losses and parameters, number for number,
// for the same thread count; a run resumed from a checkpoint continues bit-identically to one
// that never stopped (the step fixes the data, the checkpoint holds weights, moments and RNG).
#pragma once

#include <filesystem>
#include <functional>
#include <utility>
#include <vector>

#include "agora/train/run_config.h"

namespace agora {

struct StepStats {
  int64_t step = 0;  // the step just completed (0-based)
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
};

struct TrainOptions {
  std::filesystem::path resume;                   // a checkpoint folder to continue from
  bool progress = true;                           // the live progress line on stderr
  std::function<void(const StepStats&)> on_step;  // e.g. tests recording the loss curve
};

struct TrainSummary {
  int64_t parameters = 0;
  int64_t first_step = 0, last_step = 0;                // steps run: [first_step, last_step)
  double final_loss = 0;                                // training loss of the last step
  double val_loss = 0;                                  // at the end
  std::vector<std::pair<int64_t, double>> val_history;  // (step, val loss)
  double seconds = 0;
  double tokens_per_second = 0;
  std::filesystem::path checkpoint;  // the last one written
};

TrainSummary train(RunConfig config, const TrainOptions& options = {});

}  // namespace agora
