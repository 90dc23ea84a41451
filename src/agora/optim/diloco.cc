#include "agora/optim/diloco.h"

#include <cmath>
#include <string>

#include "agora/core/error.h"
#include "agora/optim/payload_tensors.h"

namespace agora {
namespace {

constexpr std::string_view kInnerPrefix = "inner.";

// An fp32 copy that shares nothing with `t`, on t's device.
torch::Tensor fp32_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

DiLoCoStrategy::DiLoCoStrategy(std::vector<NamedParameter> params, const DiLoCoOptions& options)
    : params_(std::move(params)), options_(options) {
  if (options.inner_steps < 1) {
    fail("diloco: inner_steps is {}; it must be at least 1", options.inner_steps);
  }
  if (!std::isfinite(options.outer_lr) || options.outer_lr <= 0) {
    fail("diloco: outer_lr is {}; it must be a positive number", options.outer_lr);
  }
  if (!(options.outer_momentum >= 0 && options.outer_momentum < 1)) {
    fail("diloco: outer_momentum is {}; it must be in [0, 1)", options.outer_momentum);
  }
  const ValueType type = options.pseudo_gradient_type;
  if (type != ValueType::kF32 && type != ValueType::kBF16 && type != ValueType::kInt8) {
    fail("diloco: pseudo_gradient_type {} is not allowed (f32, bf16 or int8)", to_string(type));
  }
  layout_.kind = PayloadKind::kPseudoGradient;
  for (const NamedParameter& p : params_) {
    layout_.tensors.push_back(tensor_layout(p.tensor.sizes().vec(), type));
  }
  inner_ = std::make_unique<AdamWStrategy>(params_, options.inner);
  reset_outer_state();
}

DiLoCoStrategy::~DiLoCoStrategy() = default;

void DiLoCoStrategy::reset_outer_state() {
  shared_.clear();
  momentum_.clear();
  for (const NamedParameter& p : params_) {
    shared_.push_back(fp32_copy(p.tensor));
    momentum_.push_back(torch::zeros_like(shared_.back()));
  }
}

Contribution DiLoCoStrategy::contribute(const StepContext& context) {
  StepContext local = context;
  local.num_peers = 1;  // the inner optimizer steps on this peer's gradients alone
  inner_->apply(local, {});
  if (!syncs_at(context.step)) return {};

  torch::NoGradGuard no_grad;
  Payload payload;
  payload.kind = PayloadKind::kPseudoGradient;
  payload.step = static_cast<uint64_t>(context.step);
  payload.tensors.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    // Shared minus local: the outer step subtracts it, moving theta toward the local progress.
    const torch::Tensor d = shared_[i] - params_[i].tensor.detach().to(torch::kFloat32);
    payload.tensors.push_back(tensor_payload(d, options_.pseudo_gradient_type));
  }
  Contribution out;
  out.bytes = encode_payload(payload);
  return out;
}

// Like all-reduce, a baseline for trusted peers: a malformed contribution throws.
ApplyReport DiLoCoStrategy::apply(const StepContext& context,
                                  std::span<const Contribution> contributions) {
  const std::vector<const Contribution*> ordered = canonical_order(contributions);
  if (ordered.empty()) return {};  // an inner step: contribute() has already taken it
  if (!syncs_at(context.step)) {
    fail("diloco: step {}: peer {} sent a pseudo-gradient, but rounds end every {} steps",
         context.step, ordered.front()->peer, options_.inner_steps);
  }
  const std::vector<torch::Tensor> mean =
      mean_of_contributions(contributions, layout_, context.step, "diloco: the pseudo-gradient");
  torch::NoGradGuard no_grad;
  const double mu = options_.outer_momentum;
  const double lr = options_.outer_lr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor d = mean[i].to(shared_[i].device());
    // One operation at a time (no fused multiply-add forms), so the rounding is fixed.
    momentum_[i].mul_(mu).add_(d);
    torch::Tensor update = momentum_[i] * mu;
    update.add_(d).mul_(lr);
    shared_[i].sub_(update);
    params_[i].tensor.copy_(shared_[i]);
  }
  return {};
}

std::map<std::string, torch::Tensor> DiLoCoStrategy::state() const {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, tensor] : inner_->state()) out[std::string(kInnerPrefix) + name] = tensor;
  for (size_t i = 0; i < params_.size(); ++i) {
    out["shared." + params_[i].name] = shared_[i];
    out["outer_momentum." + params_[i].name] = momentum_[i];
  }
  return out;
}

void DiLoCoStrategy::load_state(const std::map<std::string, torch::Tensor>& state) {
  // Validate the outer state in full before anything changes.
  std::vector<torch::Tensor> shared(params_.size()), momentum(params_.size());
  size_t found = 0;
  std::string missing;
  const auto take = [&](const std::string& prefix, const NamedParameter& p, torch::Tensor& into) {
    const auto it = state.find(prefix + p.name);
    if (it == state.end()) {
      if (missing.empty()) missing = prefix + p.name;
      return;
    }
    if (!it->second.sizes().equals(p.tensor.sizes())) {
      fail("diloco state {}{} has shape {} but the parameter has {}", prefix, p.name,
           c10::str(it->second.sizes()), c10::str(p.tensor.sizes()));
    }
    into = it->second.detach().to(p.tensor.device(), torch::kFloat32, /*non_blocking=*/false,
                                  /*copy=*/true);
    ++found;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    take("shared.", params_[i], shared[i]);
    take("outer_momentum.", params_[i], momentum[i]);
  }
  if (found != 0 && found != 2 * params_.size()) {
    fail("diloco state is incomplete: {} of the {} shared/outer_momentum tensors, {} missing",
         found, 2 * params_.size(), missing);
  }

  std::map<std::string, torch::Tensor> inner;
  for (const auto& [name, tensor] : state) {
    if (name.starts_with(kInnerPrefix)) inner[name.substr(kInnerPrefix.size())] = tensor;
  }
  inner_->load_state(inner);

  if (found == 0) {
    reset_outer_state();  // a state without DiLoCo's: the live parameters start the round
  } else {
    shared_ = std::move(shared);
    momentum_ = std::move(momentum);
  }
}

}  // namespace agora
