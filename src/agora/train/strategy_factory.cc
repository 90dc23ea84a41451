#include "agora/train/strategy_factory.h"

#include "agora/core/error.h"
#include "agora/optim/adamw.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/optim/diloco.h"

namespace agora {
namespace {

AdamWOptions adamw_options(const OptimizerConfig& optimizer) {
  AdamWOptions options;
  options.beta1 = optimizer.beta1;
  options.beta2 = optimizer.beta2;
  options.eps = optimizer.eps;
  options.weight_decay = optimizer.weight_decay;
  return options;
}

ValueType value_type(const std::string& dtype) {
  if (dtype == "float32") return ValueType::kF32;
  if (dtype == "bfloat16") return ValueType::kBF16;
  if (dtype == "int8") return ValueType::kInt8;
  fail("unknown exchange dtype \"{}\" (allowed: float32, bfloat16, int8)", dtype);
}

}  // namespace

std::vector<NamedParameter> named_parameters(Llama& model) {
  std::vector<NamedParameter> out;
  for (auto& item : model->named_parameters()) {
    out.push_back({item.key(), item.value(), item.value().dim() >= 2});
  }
  return out;
}

std::unique_ptr<Strategy> make_strategy(const RunConfig& config, Llama& model) {
  const std::string& name = config.optimizer.name;
  if (name == "demo") {
    DemoOptions options;
    options.beta = config.demo.beta;
    options.topk = config.demo.topk;
    options.chunk = config.demo.chunk;
    options.weight_decay = config.optimizer.weight_decay;
    options.one_bit = config.demo.one_bit;
    options.lookahead = config.demo.lookahead;
    options.max_norm_ratio = config.demo.max_norm_ratio;
    return std::make_unique<DecoupledMomentum>(named_parameters(model), options);
  }
  if (name == "adamw") {
    AdamWOptions options = adamw_options(config.optimizer);
    options.gradient_type = value_type(config.adamw.gradient_dtype);
    return std::make_unique<AdamWStrategy>(named_parameters(model), options);
  }
  if (name == "diloco") {
    DiLoCoOptions options;
    options.inner_steps = config.diloco.inner_steps;
    options.outer_lr = config.diloco.outer_lr;
    options.outer_momentum = config.diloco.outer_momentum;
    options.pseudo_gradient_type = value_type(config.diloco.pseudo_gradient_dtype);
    options.inner = adamw_options(config.optimizer);
    return std::make_unique<DiLoCoStrategy>(named_parameters(model), options);
  }
  fail("optimizer.name = \"{}\" is not available (allowed: demo, adamw, diloco)", name);
}

}  // namespace agora
