// DiLoCo (docs/algorithms.md section 2): rounds of H local AdamW steps, then one outer step on the
// averaged pseudo-gradients. The comparison strategy: it saves bandwidth by syncing rarely, where
// DeMo compresses every step.
//
// Each round starts from the shared parameters theta (a copy kept here). Every step contribute()
// takes one inner AdamW step on the live parameters with the local gradients at the schedule's
// lr (decoupled weight decay on `decay` parameters only; the inner moments persist across
// rounds). On the round's last step ((step + 1) % inner_steps == 0) it sends the pseudo-gradient
// D = theta - theta_local (shared minus local: a step in the direction of the local progress is
// -D) for every parameter, as a kPseudoGradient payload of dense f32 / bf16 or int8_rows entries;
// on the other steps it sends nothing. apply() with no contributions does nothing (an inner
// step); with some, it averages them in fp32 in the canonical order and takes the outer SGD step
// with Nesterov momentum mu per parameter:
//   buf <- mu * buf + D;   theta <- theta - lr_out * (D + mu * buf)
// then copies theta into the live parameters, which start the next round from it. Every peer
// applying the same contributions, in any order, ends with bit-identical parameters.
//
// Contributions that do not decode to this model's layout, carry another step, or arrive on a
// step that does not end a round are an Error naming the peer.
//
// State: "inner." + the inner AdamW's names, "shared.<name>" (theta) and "outer_momentum.<name>".
// The parameters' values at construction are the first round's theta; load_state() replaces it
// from "shared.*" or, when the state has none (a run that was not DiLoCo before), takes the live
// parameters as they are then.
#pragma once

#include <memory>

#include "agora/optim/adamw.h"
#include "agora/optim/payload.h"
#include "agora/optim/strategy.h"

namespace agora {

struct DiLoCoOptions {
  int64_t inner_steps = 500;  // H: local steps per round
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  ValueType pseudo_gradient_type = ValueType::kF32;  // kF32, kBF16 or kInt8 (int8_rows)
  AdamWOptions inner;
};

class DiLoCoStrategy final : public Strategy {
 public:
  // Parameters in the model's order (the payload's order); their names key the state.
  DiLoCoStrategy(std::vector<NamedParameter> params, const DiLoCoOptions& options);
  ~DiLoCoStrategy() override;

  std::string name() const override { return "diloco"; }
  // The contribution's `peer` is left empty: the caller knows its own id.
  Contribution contribute(const StepContext& context) override;
  ApplyReport apply(const StepContext& context,
                    std::span<const Contribution> contributions) override;
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state) override;

  // What apply() expects every contribution to decode to.
  const PayloadLayout& layout() const { return layout_; }
  // Whether `step` ends a round (the steps whose contributions are pseudo-gradients).
  bool syncs_at(int64_t step) const { return (step + 1) % options_.inner_steps == 0; }

 private:
  void reset_outer_state();

  std::vector<NamedParameter> params_;
  DiLoCoOptions options_;
  PayloadLayout layout_;
  std::unique_ptr<AdamWStrategy> inner_;
  std::vector<torch::Tensor> shared_;    // theta: fp32, on each parameter's device
  std::vector<torch::Tensor> momentum_;  // the outer buffer: fp32, on each parameter's device
};

}  // namespace agora
