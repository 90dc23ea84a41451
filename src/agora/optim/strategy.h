// Strategy: how a step's gradients become a parameter update, possibly across peers.
//
// The trainer's loop is the same whatever runs behind this interface:
//
//   forward/backward (gradients accumulate in each parameter's .grad())
//   contribution = strategy.contribute(step)        // this peer's share, as bytes
//   strategy.apply(step, {contributions in a fixed order})
//
// A purely local optimizer (AdamW here) contributes nothing and applies its own gradients. DeMo,
// DiLoCo and all-reduce (the next issue) contribute compressed momentum, pseudo-gradients or
// gradients, and apply the ordered set every peer agreed on, so that every honest peer ends the
// step with bit-identical parameters.
//
// A strategy also owns the state a resumed run needs (moments, momentum buffers) and exposes it
// as named tensors for checkpoints.
#pragma once

#include <torch/torch.h>

#include <map>
#include <span>
#include <string>
#include <vector>

namespace agora {

// One peer's contribution to one step, serialized (empty for local strategies).
struct Contribution {
  std::string bytes;
};

struct StepContext {
  int64_t step = 0;  // 0-based optimizer step
  double lr = 0.0;   // the schedule's learning rate for this step
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // Reads the accumulated gradients; returns what this peer sends for the step.
  virtual Contribution contribute(const StepContext& context) = 0;
  // Updates the parameters from the contributions of the step's peers, in the agreed order.
  virtual void apply(const StepContext& context, std::span<const Contribution> contributions) = 0;

  // Everything a resumed run needs, by stable names; load_state() takes what state() gave.
  virtual std::map<std::string, torch::Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;
};

}  // namespace agora
