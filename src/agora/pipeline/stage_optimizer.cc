#include "agora/pipeline/stage_optimizer.h"

#include <limits>

namespace agora {

StageOptimizer::StageOptimizer(const RunConfig& config, std::vector<NamedParameter> params)
    : params_(std::move(params)), grad_clip_(config.optimizer.grad_clip) {
  for (const NamedParameter& p : params_) tensors_.push_back(p.tensor);
  const OptimizerConfig& opt = config.optimizer;
  if (config.pipeline.optimizer == "nadam") {
    NAdamOptions options;
    options.beta1 = config.pipeline.nadam_beta1;
    options.beta2 = opt.beta2;
    options.eps = opt.eps;
    options.weight_decay = opt.weight_decay;
    options.momentum_decay = config.pipeline.nadam_momentum_decay;
    nadam_ = std::make_unique<NAdam>(params_, options);
    return;
  }
  std::vector<torch::Tensor> decay, no_decay;
  for (const NamedParameter& p : params_) (p.decay ? decay : no_decay).push_back(p.tensor);
  const auto group_options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.0)
                                                            .betas({opt.beta1, opt.beta2})
                                                            .eps(opt.eps)
                                                            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, group_options(opt.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, group_options(0.0));
  adamw_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.0));
}

double StageOptimizer::step(double lr) {
  const double clip = grad_clip_ > 0 ? grad_clip_ : std::numeric_limits<double>::infinity();
  const double norm = torch::nn::utils::clip_grad_norm_(tensors_, clip);
  if (nadam_) {
    nadam_->step(lr);
    return norm;
  }
  for (auto& group : adamw_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  adamw_->step();
  return norm;
}

}  // namespace agora
