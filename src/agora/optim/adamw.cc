#include "agora/optim/adamw.h"

#include <string>
#include <type_traits>

#include "agora/core/error.h"

namespace agora {
namespace {

// torch::optim keys its per-parameter state by the TensorImpl: as a string in libtorch 1.13, as
// the pointer itself in 2.x. This picks whichever the headers in use declare.
template <typename StateMap>
typename StateMap::key_type state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    return c10::guts::to_string(p.unsafeGetTensorImpl());
  } else {
    return p.unsafeGetTensorImpl();
  }
}

}  // namespace

AdamWStrategy::AdamWStrategy(std::vector<std::pair<std::string, torch::Tensor>> named_decay,
                             std::vector<std::pair<std::string, torch::Tensor>> named_no_decay,
                             const AdamWOptions& options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [name, p] : named_decay) {
    decay.push_back(p);
    named_.emplace_back(name, p);
  }
  for (auto& [name, p] : named_no_decay) {
    no_decay.push_back(p);
    named_.emplace_back(name, p);
  }
  const auto group_options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(/*lr=*/0.0)
                                                            .betas({options.beta1, options.beta2})
                                                            .eps(options.eps)
                                                            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, group_options(options.weight_decay));
  groups.emplace_back(no_decay, group_options(0.0));
  optimizer_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.0));
}

AdamWStrategy::~AdamWStrategy() = default;

Contribution AdamWStrategy::contribute(const StepContext&) {
  return {};
}

void AdamWStrategy::apply(const StepContext& context, std::span<const Contribution>) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(context.lr);
  }
  optimizer_->step();
}

std::map<std::string, torch::Tensor> AdamWStrategy::state() const {
  std::map<std::string, torch::Tensor> out;
  const auto& states = optimizer_->state();
  for (const auto& [name, p] : named_) {
    const auto it = states.find(state_key<std::decay_t<decltype(states)>>(p));
    if (it == states.end()) continue;  // no step taken yet
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out["exp_avg." + name] = s.exp_avg();
    out["exp_avg_sq." + name] = s.exp_avg_sq();
    out["step." + name] = torch::tensor(static_cast<int64_t>(s.step()), torch::kInt64);
  }
  return out;
}

void AdamWStrategy::load_state(const std::map<std::string, torch::Tensor>& state) {
  auto& states = optimizer_->state();
  for (const auto& [name, p] : named_) {
    const auto m = state.find("exp_avg." + name);
    const auto v = state.find("exp_avg_sq." + name);
    const auto t = state.find("step." + name);
    if (m == state.end() && v == state.end() && t == state.end()) continue;
    if (m == state.end() || v == state.end() || t == state.end()) {
      fail("optimizer state for {} is incomplete (needs exp_avg, exp_avg_sq and step)", name);
    }
    if (!m->second.sizes().equals(p.sizes()) || !v->second.sizes().equals(p.sizes())) {
      fail("optimizer state for {} has shape {} but the parameter has {}", name,
           c10::str(m->second.sizes()), c10::str(p.sizes()));
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->exp_avg(m->second.to(p.device(), p.scalar_type()).clone());
    s->exp_avg_sq(v->second.to(p.device(), p.scalar_type()).clone());
    s->step(t->second.item<int64_t>());
    states[state_key<std::decay_t<decltype(states)>>(p)] = std::move(s);
  }
}

}  // namespace agora
