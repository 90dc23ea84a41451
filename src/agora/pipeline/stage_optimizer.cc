#include "agora/pipeline/stage_optimizer.h"

#include <limits>

namespace agora {

StageOptimizer::StageOptimizer(const RunConfig& config, std::vector<NamedParameter> params)
    : grad_clip_(config.optimizer.grad_clip) {
  for (const NamedParameter& p : params) tensors_.push_back(p.tensor);
  const OptimizerConfig& opt = config.optimizer;
  if (config.pipeline.optimizer == "nadam") {
    NAdamOptions options;
    options.beta1 = config.pipeline.nadam_beta1;
    options.beta2 = opt.beta2;
    options.eps = opt.eps;
    options.weight_decay = opt.weight_decay;
    options.momentum_decay = config.pipeline.nadam_momentum_decay;
    nadam_ = std::make_unique<NAdam>(std::move(params), options);
    return;
  }
  // The data-parallel AdamW on one peer: torch's AdamW, norms without weight decay.
  AdamWOptions options;
  options.beta1 = opt.beta1;
  options.beta2 = opt.beta2;
  options.eps = opt.eps;
  options.weight_decay = opt.weight_decay;
  adamw_ = std::make_unique<AdamWStrategy>(std::move(params), options);
}

double StageOptimizer::step(double lr) {
  const double clip = grad_clip_ > 0 ? grad_clip_ : std::numeric_limits<double>::infinity();
  const double norm = torch::nn::utils::clip_grad_norm_(tensors_, clip);
  if (nadam_) {
    nadam_->step(lr);
  } else {
    StepContext context;
    context.lr = lr;
    context.num_peers = 1;
    adamw_->apply(context, {});
  }
  return norm;
}

std::map<std::string, torch::Tensor> StageOptimizer::state() const {
  if (nadam_) return nadam_->state();
  std::map<std::string, torch::Tensor> out;
  for (const auto& [key, t] : adamw_->state()) out.emplace(key, t.clone());
  return out;
}

void StageOptimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  if (nadam_) {
    nadam_->load_state(state);
  } else {
    adamw_->load_state(state);
  }
}

}  // namespace agora
