#include "agora/optim/adamw.h"

#include <string>
#include <type_traits>

#include "agora/core/error.h"
#include "agora/optim/payload_tensors.h"

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

AdamWStrategy::AdamWStrategy(std::vector<NamedParameter> params, const AdamWOptions& options)
    : params_(std::move(params)), options_(options) {
  if (options.gradient_type != ValueType::kF32 && options.gradient_type != ValueType::kBF16) {
    fail("adamw: gradient_type {} is not allowed (f32 or bf16)", to_string(options.gradient_type));
  }
  std::vector<torch::Tensor> decay, no_decay;
  layout_.kind = PayloadKind::kGradient;
  for (const NamedParameter& p : params_) {
    (p.decay ? decay : no_decay).push_back(p.tensor);
    layout_.tensors.push_back(dense_layout(p.tensor.sizes().vec(), options.gradient_type));
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

void AdamWStrategy::step(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  optimizer_->step();
}

Contribution AdamWStrategy::contribute(const StepContext& context) {
  if (context.num_peers <= 1) return {};
  Payload payload;
  payload.kind = PayloadKind::kGradient;
  payload.step = static_cast<uint64_t>(context.step);
  payload.tensors.reserve(params_.size());
  for (const NamedParameter& p : params_) {
    // A parameter the loss did not reach has no .grad(); it sends zeros so that every payload
    // keeps the model's layout.
    const torch::Tensor& g = p.tensor.grad();
    payload.tensors.push_back(
        dense_payload(g.defined() ? g : torch::zeros_like(p.tensor), options_.gradient_type));
  }
  Contribution out;
  out.bytes = encode_payload(payload);
  return out;
}

// All-reduce is a baseline for trusted peers (it cannot run decentralized): a malformed
// contribution throws rather than being left out.
ApplyReport AdamWStrategy::apply(const StepContext& context,
                                 std::span<const Contribution> contributions) {
  if (context.num_peers <= 1) {
    step(context.lr);
    return {};
  }
  std::vector<torch::Tensor> mean =
      mean_of_contributions(contributions, layout_, context.step, "adamw: the gradient");
  if (mean.empty()) return {};
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].tensor;
    p.mutable_grad() = mean[i].to(p.device(), p.scalar_type());
  }
  step(context.lr);
  return {};
}

std::map<std::string, torch::Tensor> AdamWStrategy::state() const {
  std::map<std::string, torch::Tensor> out;
  const auto& states = optimizer_->state();
  for (const NamedParameter& np : params_) {
    const std::string& name = np.name;
    const torch::Tensor& p = np.tensor;
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
  for (const NamedParameter& np : params_) {
    const std::string& name = np.name;
    const torch::Tensor& p = np.tensor;
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
