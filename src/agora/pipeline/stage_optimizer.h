// The optimizer of one pipeline stage: AdamW (torch's, decoupled weight decay) or NAdam with
// decoupled weight decay (optim/nadam.h, the asynchronous method's), over the stage's parameters
// only, with the stage's own gradient clipping. Norm gains get no weight decay, as in the trainer.
//
// Clipping is local: each stage scales its gradient by min(1, grad_clip / (||g_stage|| + 1e-6)),
// as the public asynchronous pipeline code does; the whole model's norm would need every stage's
// gradient before any stage may step, which is the synchronisation the asynchronous schedule
// exists to avoid. (The synchronous schedule clips per stage too, so the two differ only in
// staleness.)
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/optim/adamw.h"
#include "agora/optim/nadam.h"
#include "agora/optim/strategy.h"

namespace agora {

class StageOptimizer {
 public:
  StageOptimizer(const RunConfig& config, std::vector<NamedParameter> params);

  // Clips the gradients in place (the norm before clipping is returned), then steps with `lr`.
  double step(double lr);

  // The moments and step counts, by stable names, for a stage checkpoint (copies);
  // load_state() continues bit-identically from what state() gave.
  std::map<std::string, torch::Tensor> state() const;
  void load_state(const std::map<std::string, torch::Tensor>& state);

 private:
  std::vector<torch::Tensor> tensors_;
  double grad_clip_;
  std::unique_ptr<AdamWStrategy> adamw_;
  std::unique_ptr<NAdam> nadam_;
};

}  // namespace agora
