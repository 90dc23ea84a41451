// NAdam with decoupled weight decay: the per-stage optimizer of the asynchronous pipeline method
// ("Nesterov Method for Asynchronous Pipeline Parallel Optimization", Ajanthan et al., ICML 2025),
// whose look-ahead momentum is what compensates for the stale weights an asynchronous pipeline
// computes its gradients with. The paper's code runs torch.optim.NAdam(...,
// decoupled_weight_decay=True); this is that update exactly (torch 2.x; torch 1.13's NAdam has no
// decoupled weight decay and multiplies mu_t into its second factor's product twice, a bug torch
// 2.0 fixed). Per parameter, at its step t = 1, 2, ... and with mu_product starting at 1:
//   p <- p * (1 - lr * wd)                          (parameters marked `decay` only)
//   mu_t = b1 * (1 - 0.5 * 0.96^(t * psi));  mu_{t+1} the same at t + 1;  mu_product *= mu_t
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  denom = sqrt(v / (1 - b2^t)) + eps
//   p <- p - lr * (1 - mu_t) / (1 - mu_product) * g / denom
//   p <- p - lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom
//
// It is an optimizer, not a Strategy: it steps on each parameter's .grad() and exchanges nothing.
// The arithmetic runs in place on each parameter's device and dtype, the scalar factors in double;
// the same parameters, gradients and lr give bit-identical results. As in torch, the state is per
// parameter and starts at its first gradient: a parameter whose .grad() is undefined on a step is
// left as it is, moments and step count included.
//
// State, for checkpoints: per parameter that has stepped, "<name>.exp_avg" and "<name>.exp_avg_sq"
// (the parameter's shape and dtype) and "<name>.step" and "<name>.mu_product" (0-dim float64);
// and "steps", the number of step() calls. state() returns copies; load_state() then continues
// bit-identically. A state that names an unknown key, lacks part of a parameter's entries, or has
// a wrong shape or an impossible value is an Error naming the key, and leaves this state as it was.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "agora/optim/strategy.h"

namespace agora {

struct NAdamOptions {
  double beta1 = 0.99;  // the method's momentum; 0.9 is torch's ordinary default
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;     // decoupled; applied to parameters marked `decay` only
  double momentum_decay = 0.004;  // psi, in the momentum schedule mu_t
};

class NAdam {
 public:
  // Parameters in the model's order; their names (unique, non-empty) key the state. Options out of
  // range (betas in [0, 1), eps > 0, weight_decay >= 0, momentum_decay >= 0) are an Error.
  NAdam(std::vector<NamedParameter> params, const NAdamOptions& options);

  // One update of every parameter that has a gradient, at learning rate lr (>= 0; the schedule's).
  // A sparse gradient is an Error, raised before any parameter changes.
  void step(double lr);
  // How many times step() has run (restored by load_state()).
  int64_t steps() const { return steps_; }

  std::map<std::string, torch::Tensor> state() const;
  void load_state(const std::map<std::string, torch::Tensor>& state);

  const NAdamOptions& options() const { return options_; }

 private:
  struct ParamState {
    torch::Tensor exp_avg, exp_avg_sq;  // undefined until the parameter's first gradient
    int64_t step = 0;
    double mu_product = 1.0;
  };

  std::vector<NamedParameter> params_;
  NAdamOptions options_;
  std::vector<ParamState> states_;  // parallel to params_
  int64_t steps_ = 0;
};

}  // namespace agora
