// AdamW as a local Strategy: torch::optim::AdamW with two parameter groups, the matrices with
// decoupled weight decay and the norms without. Contributes nothing; applies its own gradients.
//
// The update is torch's AdamW exactly (the same as Python's torch.optim.AdamW):
//   p <- p * (1 - lr * wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v / (1 - b2^t)) + eps)
#pragma once

#include <memory>

#include "agora/optim/strategy.h"

namespace agora {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamWStrategy final : public Strategy {
 public:
  // `named_decay` / `named_no_decay`: parameters by their model names (the names key the state).
  AdamWStrategy(std::vector<std::pair<std::string, torch::Tensor>> named_decay,
                std::vector<std::pair<std::string, torch::Tensor>> named_no_decay,
                const AdamWOptions& options);
  ~AdamWStrategy() override;

  std::string name() const override { return "adamw"; }
  Contribution contribute(const StepContext& context) override;
  void apply(const StepContext& context, std::span<const Contribution> contributions) override;
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state) override;

 private:
  std::vector<std::pair<std::string, torch::Tensor>> named_;  // decay first, then no-decay
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace agora
