// `agora train` for a run config with [pipeline] stages > 1: the in-process pipeline
// (simulation.h) driven like the local trainer, with the same schedule, validation and
// checkpoints (the whole model the stages make up, one Hugging Face checkpoint, no optimizer
// state: a pipelined run cannot resume yet).
//
// What a user sees: the cut (which layers each stage holds and its share of the parameters),
// then per step loss, tokens/s and the bytes per token that crossed each boundary, with an ETA;
// validation every train.eval_interval steps and at the end. With options.events set (`agora
// train` sets OUT/pipeline.jsonl), one JSON object per line: {"event":"start",...},
// {"event":"step",...}, {"event":"eval",...}, {"event":"finish",...}: what bench/pipeline and
// the tests read.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "agora/config/run_config.h"

namespace agora {

struct PipelineTrainOptions {
  bool progress = true;
  std::filesystem::path events;  // JSON lines, if set
};

struct PipelineTrainSummary {
  std::string cut;                        // partition.h describe()
  std::vector<int64_t> stage_parameters;  // per stage
  int64_t steps = 0;
  double final_loss = 0, val_loss = 0;
  std::vector<std::pair<int64_t, double>> val_history;  // (steps done, val loss)
  double seconds = 0, tokens_per_second = 0;
  // Per token per boundary, forward (activations) and backward (their gradients).
  double forward_bytes_per_token = 0, backward_bytes_per_token = 0;
  std::filesystem::path checkpoint;
};

PipelineTrainSummary train_pipeline(RunConfig config, const PipelineTrainOptions& options);

}  // namespace agora
