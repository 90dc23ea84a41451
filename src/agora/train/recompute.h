// Recompute: a verifier redoes one peer's training step from what that peer committed to, to
// check that the contribution it sent is the work it was assigned (docs/verification.md).
//
// A step's contribution is a function of three things, all of them fixed before the step:
//   - the run's parameters the step trained from (every member holds the same bits);
//   - the author's strategy state before the step (DeMo's momentum), which the author commits to;
//   - the sequences the coordinator assigned to the author, and the step's learning rate.
// recompute() loads the first two into a scratch Learner of the run's config and runs the very
// code the author ran (train/step.h), so on a machine that sums floats in the same order the
// result is bit for bit the author's, and elsewhere it differs only in rounding
// (optim/payload_agreement.h says how that is judged). It also returns the strategy state after
// the step: the author's state before its next step must continue from it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <span>
#include <string>

#include "agora/core/error.h"
#include "agora/data/sequence_range.h"
#include "agora/optim/strategy.h"
#include "agora/train/step.h"

namespace agora {

struct CommittedStep {
  std::span<const torch::Tensor> params;  // the run's parameters, in the model's order
  const std::map<std::string, torch::Tensor>* strategy_state = nullptr;  // the author's, before
  StepContext context;
  std::span<const SequenceRange> ranges;  // the author's assignment
};

struct Recomputed {
  StepResult result;  // result.contribution.bytes: what the author should have sent
  std::map<std::string, torch::Tensor> state_after;  // copies, not the scratch's live tensors
};

// Overwrites `scratch`'s parameters and strategy state with `committed`'s and runs the step.
// Throws Error when the committed tensors do not fit the scratch model (count, shape) or the
// strategy state misses a tensor, and when the step's loss is not finite.
// `stop`, when set, is checked before every micro-batch: a recomputation it stops throws
// Cancelled.
Recomputed recompute(const TrainStep& step, Learner& scratch, const CommittedStep& committed,
                     const std::atomic<bool>* stop = nullptr);

// A recomputation stopped before its end.
class Cancelled : public Error {
 public:
  using Error::Error;
};

// ||a - b|| / ||b|| over every tensor the two states share by name, in float64; the states must
// hold the same names and shapes (Error otherwise). 0 for identical states.
double relative_state_error(const std::map<std::string, torch::Tensor>& a,
                            const std::map<std::string, torch::Tensor>& b);

}  // namespace agora
