// AdamW, local or all-reduce (docs/algorithms.md section 3, the baseline DeMo is measured
// against): torch::optim::AdamW with two parameter groups, the parameters marked `decay` with
// decoupled weight decay and the others (norms) without.
//
// The update is torch's AdamW exactly (the same as Python's torch.optim.AdamW):
//   p <- p * (1 - lr * wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v / (1 - b2^t)) + eps)
//
// With one peer (StepContext.num_peers == 1) it contributes nothing and steps on its own
// gradients, with no encoding cost. With more, every peer sends its whole gradient (a kGradient
// payload of dense f32 or bf16 entries, in parameter order) and apply() averages the step's
// contributions: decoded, summed in fp32 in the canonical order, divided by their count, written
// into each parameter's .grad(), then one AdamW step. Every peer applying the same contributions,
// in any order, ends with bit-identical parameters and moments. A contribution that does not
// decode to this model's layout, or that carries another step, is an Error naming its peer; a
// step with no contributions at all leaves parameters and moments untouched.
//
// The trainer clips each peer's gradient locally before contribute() (the same rule as DeMo), so
// comparisons between the strategies isolate what compression does.
#pragma once

#include <memory>

#include "agora/optim/payload.h"
#include "agora/optim/strategy.h"

namespace agora {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  ValueType gradient_type = ValueType::kF32;  // on the wire with several peers: kF32 or kBF16
};

class AdamWStrategy final : public Strategy {
 public:
  // Parameters in the model's order (the payload's order); their names key the state.
  AdamWStrategy(std::vector<NamedParameter> params, const AdamWOptions& options);
  ~AdamWStrategy() override;

  std::string name() const override { return "adamw"; }
  // The contribution's `peer` is left empty: the caller knows its own id.
  Contribution contribute(const StepContext& context) override;
  ApplyReport apply(const StepContext& context,
                    std::span<const Contribution> contributions) override;
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state) override;

  // What apply() expects every contribution to decode to.
  const PayloadLayout& layout() const { return layout_; }

 private:
  void step(double lr);

  std::vector<NamedParameter> params_;
  AdamWOptions options_;
  PayloadLayout layout_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace agora
