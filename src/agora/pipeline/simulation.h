// S pipeline stages in one process (docs/pipeline.md), as --simulate-peers is for data
// parallelism: the mathematics of a pipelined run, testable without a network. Every stage holds
// only its StageModel and its StageOptimizer; what crosses a boundary goes through the wire codec
// (boundary.h) as bytes, so compression costs here exactly what it costs between processes.
//
// Step s trains sequences s*B .. s*B + B - 1 (B = train.batch_size), as every other trainer does.
//
// gpipe (synchronous): the batch in pipeline.micro_batches equal micro-batches, each forward
//   through every stage and backward again, gradients accumulated (each micro-batch's loss
//   weighted by its share), then every stage clips its own gradient and steps once: a flush per
//   step. With the float32 codec the gradients are the whole model's (tests/train/
//   pipeline_test.cc compares them with a single Llama to float rounding).
//
// async (PipeDream's 1F1B without flush): the step's batch is one pipeline micro-batch and every
//   stage steps after its backward. In a real pipeline stage i runs the forward of micro-batch s
//   while its backward of s - tau_i - 1 has not come back yet, tau_i = S - 1 - i, so its forward
//   sees its weights after s - tau_i updates and its gradient is applied to the newest (after s).
//   The simulation computes exactly that: each stage keeps the last tau_i + 1 versions of its
//   weights (weight stashing), runs step s's forward and backward on version s - tau_i, and applies
//   the gradient to the newest version. The last stage is never stale. With stale = false (tests)
//   every stage uses its newest weights, which is gpipe with one micro-batch.
//
// Loss: the mean next-token loss of the step's sequences as the last stage computed it (in async,
// through the stale upstream stages). Determinism: the same config and seed give the same bits.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/data/sampler.h"
#include "agora/model/llama.h"
#include "agora/pipeline/boundary.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/stage_optimizer.h"
#include "agora/pipeline/subspace.h"

namespace agora {

struct PipelineStepReport {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  std::vector<double> grad_norms;  // per stage, before its clipping
  // Bytes one boundary carried this step (every boundary carries the same amount).
  int64_t forward_bytes = 0, backward_bytes = 0;
};

class PipelineSimulation {
 public:
  struct Options {
    bool stale = true;  // async only: false runs every stage on its newest weights
  };

  PipelineSimulation(const RunConfig& config, torch::Device device, Options options);
  PipelineSimulation(const RunConfig& config, torch::Device device)
      : PipelineSimulation(config, device, Options{}) {}
  ~PipelineSimulation();

  // Trains step `step` (steps must come in order, from 0) and returns what it measured.
  PipelineStepReport step(int64_t step);

  // gpipe's forward and backward of step `step` without the update: the stages' .grad() hold the
  // gradients of the step's mean loss, unclipped. Returns the loss. For tests.
  double gradients(int64_t step);

  // The whole model the stages make up now (their newest weights), e.g. for evaluation and
  // checkpoints.
  Llama assemble() const;

  const std::vector<StageSpan>& spans() const { return spans_; }
  const std::vector<StageModel>& stages() const { return live_; }
  std::vector<StageModel>& stages() { return live_; }
  const SubspaceBasis* subspace() const { return subspace_.get(); }

 private:
  struct Traffic {
    int64_t forward = 0, backward = 0;
  };
  // One micro-batch forward through `modules` and backward again; returns its weighted loss.
  double run_micro_batch(std::vector<StageModel>& modules, const torch::Tensor& windows,
                         double weight_divisor, int64_t step, int64_t micro, Traffic& traffic);
  void clear_gradients(const std::vector<StageModel>& modules);
  int64_t delay(int64_t stage) const;

  RunConfig config_;
  torch::Device device_;
  Options options_;
  std::vector<StageSpan> spans_;
  std::unique_ptr<SubspaceBasis> subspace_;
  std::optional<BoundaryCoder> coder_;
  Sampler data_;
  std::vector<StageModel> live_;   // the newest weights
  std::vector<StageModel> stash_;  // async: the module a stale stage runs its version in
  std::vector<std::deque<std::vector<torch::Tensor>>> versions_;  // async: oldest first
  std::vector<std::unique_ptr<StageOptimizer>> optimizers_;
};

}  // namespace agora
