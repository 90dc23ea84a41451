#include "agora/optim/nadam.h"

#include <cmath>
#include <iterator>
#include <set>
#include <utility>

#include "agora/core/error.h"

namespace agora {
namespace {

constexpr const char* kSteps = "steps";
constexpr const char* kFields[] = {"exp_avg", "exp_avg_sq", "step", "mu_product"};

// Callers state `ok` as the allowed range holding (x >= 0, not !(x < 0)), so that NaN fails.
void require_in_range(const char* field, double value, bool ok, const char* allowed) {
  if (!ok) fail("nadam: {} is {}, allowed {}", field, value, allowed);
}

// The momentum schedule: mu_t rises from b1 / 2 towards b1 as t grows, at a pace set by psi.
double momentum_at(const NAdamOptions& o, int64_t t) {
  return o.beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(t) * o.momentum_decay));
}

torch::Tensor scalar_tensor(double value) {
  return torch::scalar_tensor(value, torch::dtype(torch::kFloat64));
}

double read_scalar(const std::string& key, const torch::Tensor& t) {
  if (!t.defined() || t.numel() != 1) {
    fail("nadam state {}: has {} elements, expected one scalar", key, t.defined() ? t.numel() : 0);
  }
  return t.to(torch::kCPU, torch::kFloat64).item<double>();
}

// A step count stored as float64: a whole number from `least` up to 2^53 (exact in a double).
int64_t read_count(const std::string& key, const torch::Tensor& t, int64_t least) {
  const double value = read_scalar(key, t);
  if (!(value >= static_cast<double>(least) && value <= 9007199254740992.0) ||
      value != std::floor(value)) {
    fail("nadam state {}: is {}, expected a whole number >= {}", key, value, least);
  }
  return static_cast<int64_t>(value);
}

}  // namespace

NAdam::NAdam(std::vector<NamedParameter> params, const NAdamOptions& options)
    : params_(std::move(params)), options_(options), states_(params_.size()) {
  const NAdamOptions& o = options;
  require_in_range("beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1, "[0, 1)");
  require_in_range("beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1, "[0, 1)");
  require_in_range("eps", o.eps, o.eps > 0 && std::isfinite(o.eps), "> 0 and finite");
  require_in_range("weight_decay", o.weight_decay,
                   o.weight_decay >= 0 && std::isfinite(o.weight_decay), ">= 0 and finite");
  require_in_range("momentum_decay", o.momentum_decay,
                   o.momentum_decay >= 0 && std::isfinite(o.momentum_decay), ">= 0 and finite");
  std::set<std::string> names;
  for (const NamedParameter& p : params_) {
    if (p.name.empty()) fail("nadam: a parameter has an empty name (names key the state)");
    if (!names.insert(p.name).second) fail("nadam: parameter name {} appears twice", p.name);
    if (!p.tensor.defined() || !p.tensor.is_floating_point()) {
      fail("nadam: parameter {} is not a floating-point tensor", p.name);
    }
  }
}

void NAdam::step(double lr) {
  if (!(lr >= 0 && std::isfinite(lr))) fail("nadam: lr is {}, allowed >= 0 and finite", lr);
  // Checked before anything moves, so that a refused step leaves every parameter as it was.
  for (const NamedParameter& p : params_) {
    const torch::Tensor& g = p.tensor.grad();
    if (g.defined() && g.is_sparse()) fail("nadam: parameter {} has a sparse gradient", p.name);
  }
  torch::NoGradGuard no_grad;
  const NAdamOptions& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].tensor;
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    ParamState& s = states_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      s.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    }
    const int64_t t = ++s.step;
    const double mu = momentum_at(o, t);
    const double mu_next = momentum_at(o, t + 1);
    s.mu_product *= mu;
    const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));

    if (params_[i].decay && o.weight_decay != 0) p.mul_(1.0 - lr * o.weight_decay);
    s.exp_avg.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    s.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    const torch::Tensor denom = s.exp_avg_sq.div(bias_correction2).sqrt_().add_(o.eps);
    // The Nesterov look-ahead: the current gradient weighted by this step's momentum share, plus
    // the moment already advanced by the next step's momentum.
    p.addcdiv_(g, denom, -lr * (1.0 - mu) / (1.0 - s.mu_product));
    p.addcdiv_(s.exp_avg, denom, -lr * mu_next / (1.0 - s.mu_product * mu_next));
  }
  ++steps_;
}

std::map<std::string, torch::Tensor> NAdam::state() const {
  std::map<std::string, torch::Tensor> out;
  out[kSteps] = scalar_tensor(static_cast<double>(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& s = states_[i];
    if (!s.exp_avg.defined()) continue;  // no gradient yet
    const std::string& name = params_[i].name;
    out[name + ".exp_avg"] = s.exp_avg.clone();
    out[name + ".exp_avg_sq"] = s.exp_avg_sq.clone();
    out[name + ".step"] = scalar_tensor(static_cast<double>(s.step));
    out[name + ".mu_product"] = scalar_tensor(s.mu_product);
  }
  return out;
}

void NAdam::load_state(const std::map<std::string, torch::Tensor>& state) {
  std::set<std::string> known = {kSteps};
  for (const NamedParameter& p : params_) {
    for (const char* field : kFields) known.insert(p.name + "." + field);
  }
  for (const auto& [key, value] : state) {
    if (!known.contains(key))
      fail("nadam state: unknown entry {} (no such parameter or field)", key);
  }
  const auto steps = state.find(kSteps);
  if (steps == state.end()) fail("nadam state: has no {} entry", kSteps);

  // Everything is read and checked into `loaded` first: a refused state changes nothing.
  const int64_t loaded_steps = read_count(kSteps, steps->second, 0);
  std::vector<ParamState> loaded(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    const torch::Tensor& p = params_[i].tensor;
    std::map<std::string, torch::Tensor> entries;
    for (const char* field : kFields) {
      const auto it = state.find(name + "." + field);
      if (it != state.end()) entries[field] = it->second;
    }
    if (entries.empty()) continue;  // this parameter has not stepped yet
    if (entries.size() != std::size(kFields)) {
      fail("nadam state for {} is incomplete (needs exp_avg, exp_avg_sq, step and mu_product)",
           name);
    }
    for (const char* field : {"exp_avg", "exp_avg_sq"}) {
      const torch::Tensor& t = entries[field];
      if (!t.defined() || !t.is_floating_point()) {
        fail("nadam state {}.{}: is not a floating-point tensor", name, field);
      }
      if (!t.sizes().equals(p.sizes())) {
        fail("nadam state {}.{}: has shape {} but the parameter has {}", name, field,
             c10::str(t.sizes()), c10::str(p.sizes()));
      }
    }
    ParamState& s = loaded[i];
    s.step = read_count(name + ".step", entries["step"], 1);
    s.mu_product = read_scalar(name + ".mu_product", entries["mu_product"]);
    // A product of momenta, each in [0, beta1] with beta1 < 1.
    if (!(s.mu_product >= 0 && s.mu_product < 1)) {
      fail("nadam state {}.mu_product: is {}, allowed [0, 1)", name, s.mu_product);
    }
    const auto copy = [&](const torch::Tensor& t) {
      return t.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    };
    s.exp_avg = copy(entries["exp_avg"]);
    s.exp_avg_sq = copy(entries["exp_avg_sq"]);
  }
  states_ = std::move(loaded);
  steps_ = loaded_steps;
}

}  // namespace agora
