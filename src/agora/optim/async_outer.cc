#include "agora/optim/async_outer.h"

#include <algorithm>
#include <cmath>

#include "agora/core/error.h"

namespace agora {
namespace {

// HeLoCo's epsilon: below it a norm counts as zero (D passes through), and it keeps conf's
// division finite (the re-implementation's 1e-8).
constexpr double kTiny = 1e-8;

// Sums over a tensor's elements in one fixed order, in float64: HeLoCo's branch and coefficients
// come from them, and every machine must decide alike (torch's parallel sums follow the threads).
struct Sums {
  double dot = 0, xx = 0, yy = 0;
};
Sums sums_of(const torch::Tensor& x, const torch::Tensor& y) {
  const torch::Tensor a = x.to(torch::kCPU).contiguous(), b = y.to(torch::kCPU).contiguous();
  const float* p = a.data_ptr<float>();
  const float* q = b.data_ptr<float>();
  Sums s;
  for (int64_t j = 0; j < a.numel(); ++j) {
    s.dot += static_cast<double>(p[j]) * q[j];
    s.xx += static_cast<double>(p[j]) * p[j];
    s.yy += static_cast<double>(q[j]) * q[j];
  }
  return s;
}

// HeLoCo's correction of one tensor's pseudo-gradient `d` against the momentum `m` (the header
// has the formulas).
torch::Tensor heloco_correct(const torch::Tensor& d, const torch::Tensor& m,
                             const HelocoOptions& o) {
  const Sums s = sums_of(d, m);
  const double nd = std::sqrt(s.xx), nm = std::sqrt(s.yy);
  if (nd < kTiny || nm < kTiny) return d;
  const double c = s.dot / (nd * nm);
  if (c >= o.c_ok) return d;
  const double conf = nd / (nd + o.kappa * nm + kTiny);
  if (c < 0) {
    const double b = std::min(o.k_s * -c * conf, o.beta_max);
    return b == 0 ? d : d - m * (b * c * nd / nm);
  }
  const double l = std::min(o.k_d * (1 - c) * conf, 1.0);
  if (l == 0) return d;
  const torch::Tensor u = d * ((1 - l) / nd) + m * (l / nm);
  const double nu = std::sqrt(sums_of(u, u).xx);
  return nu < kTiny ? d : u * (nd / nu);
}

}  // namespace

std::string to_string(OuterRule rule) {
  switch (rule) {
    case OuterRule::kNesterov:
      return "nesterov";
    case OuterRule::kLookahead:
      return "lookahead";
    case OuterRule::kLookaheadDiscounted:
      return "lookahead_discounted";
    case OuterRule::kDelayedNesterov:
      return "delayed_nesterov";
    case OuterRule::kHeloco:
      return "heloco";
  }
  return "?";
}

OuterRule parse_outer_rule(const std::string& text) {
  for (OuterRule r : {OuterRule::kNesterov, OuterRule::kLookahead, OuterRule::kLookaheadDiscounted,
                      OuterRule::kDelayedNesterov, OuterRule::kHeloco}) {
    if (text == to_string(r)) return r;
  }
  fail(
      "outer rule \"{}\" is not known (allowed: nesterov, lookahead, lookahead_discounted, "
      "delayed_nesterov, heloco)",
      text);
}

OuterRule outer_rule_of_method(const std::string& method) {
  if (method == "sync") return OuterRule::kNesterov;
  if (method == "async" || method == "dylu") return OuterRule::kDelayedNesterov;
  if (method == "lookahead") return OuterRule::kLookahead;
  if (method == "lookahead_discounted") return OuterRule::kLookaheadDiscounted;
  fail("method \"{}\" is not known (allowed: sync, async, dylu, lookahead, lookahead_discounted)",
       method);
}

AsyncOuter::AsyncOuter(const std::vector<torch::Tensor>& initial, const AsyncOuterOptions& options)
    : options_(options) {
  if (!std::isfinite(options.lr) || options.lr <= 0) {
    fail("async outer lr is {}; it must be a positive number", options.lr);
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    fail("async outer momentum is {}; it must be in [0, 1)", options.momentum);
  }
  const bool delayed = options.rule == OuterRule::kDelayedNesterov;
  if (delayed && options.buffer < 1) {
    fail("delayed Nesterov's buffer is {} arrivals; it must be at least 1", options.buffer);
  }
  if (delayed && !(options.activation >= 0 &&
                   options.activation <= 1.0 / static_cast<double>(options.buffer))) {
    fail("delayed Nesterov's momentum activation is {}; it must be in [0, 1/N] = [0, {}]",
         options.activation, 1.0 / static_cast<double>(options.buffer));
  }
  if (options.rule == OuterRule::kHeloco) {
    const HelocoOptions& h = options.heloco;
    for (const double v : {h.k_s, h.k_d, h.kappa, h.beta_max, h.rho}) {
      if (!(std::isfinite(v) && v >= 0)) {
        fail(
            "HeLoCo's constants must be finite and >= 0 (k_s {}, k_d {}, kappa {}, beta_max {}, "
            "rho {})",
            h.k_s, h.k_d, h.kappa, h.beta_max, h.rho);
      }
    }
    if (!(h.c_ok >= -1 && h.c_ok <= 1)) fail("HeLoCo's c_ok is {}; it must be in [-1, 1]", h.c_ok);
  }
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : initial) {
    theta_.push_back(t.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true));
    momentum_.push_back(torch::zeros_like(theta_.back()));
  }
  if (delayed) {  // the buffer of arrivals, after the momentum (momentum() says so)
    for (const torch::Tensor& t : theta_) momentum_.push_back(torch::zeros_like(t));
  }
}

void AsyncOuter::restore(const std::vector<torch::Tensor>& theta,
                         const std::vector<torch::Tensor>& momentum, int64_t updates) {
  if (theta.size() != theta_.size() || momentum.size() != momentum_.size()) {
    fail("async outer state holds {} and {} tensors; the model has {} and the rule {} keeps {}",
         theta.size(), momentum.size(), theta_.size(), to_string(options_.rule), momentum_.size());
  }
  // Every shape first, then the copies: a refused state changes nothing.
  for (size_t i = 0; i < momentum_.size(); ++i) {
    const torch::Tensor& like = theta_[i % theta_.size()];
    if ((i < theta_.size() && !theta[i].sizes().equals(like.sizes())) ||
        !momentum[i].sizes().equals(like.sizes())) {
      fail("async outer state: tensor {} has another shape than the model's", i);
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (i < theta_.size()) theta_[i].copy_(theta[i]);
    momentum_[i].copy_(momentum[i]);
  }
  updates_ = updates;
}

void AsyncOuter::apply(const std::vector<torch::Tensor>& pseudo_gradient) {
  if (pseudo_gradient.size() != theta_.size()) {
    fail("a pseudo-gradient of {} tensors for a model of {}", pseudo_gradient.size(),
         theta_.size());
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> d(theta_.size());
  for (size_t i = 0; i < theta_.size(); ++i) {
    if (!pseudo_gradient[i].sizes().equals(theta_[i].sizes())) {
      fail("pseudo-gradient tensor {} has shape {}, the parameter {}", i,
           c10::str(pseudo_gradient[i].sizes()), c10::str(theta_[i].sizes()));
    }
    d[i] = pseudo_gradient[i].detach().to(theta_[i].device(), torch::kFloat32);
    if (!torch::isfinite(d[i]).all().item<bool>()) {
      fail("pseudo-gradient tensor {} holds a value that is not finite", i);
    }
  }
  const double g = options_.momentum, eta = options_.lr;
  for (size_t i = 0; i < theta_.size(); ++i) {
    torch::Tensor update;
    switch (options_.rule) {
      case OuterRule::kNesterov:
        momentum_[i].mul_(g).add_(d[i]);
        update = momentum_[i] * g;
        update.add_(d[i]);
        break;
      case OuterRule::kLookahead:
      case OuterRule::kLookaheadDiscounted:
        momentum_[i].mul_(g).add_(d[i] * (1 - g));
        update = momentum_[i] * g;
        update.add_(options_.rule == OuterRule::kLookahead ? d[i] : d[i] * (1 - g));
        break;
      case OuterRule::kHeloco: {
        const torch::Tensor corrected =
            heloco_correct(d[i], momentum_[i], options_.heloco) * options_.heloco.rho;
        momentum_[i].mul_(g).add_(corrected * (1 - g));
        update = momentum_[i] * g;
        update.add_(corrected);
        break;
      }
      case OuterRule::kDelayedNesterov: {
        const auto n = static_cast<double>(options_.buffer);
        const double c = options_.activation;
        torch::Tensor& buffer = momentum_[theta_.size() + i];
        buffer.add_(d[i]);
        if ((updates_ + 1) % options_.buffer == 0) {
          momentum_[i].mul_(g).add_(buffer / n);
          buffer.zero_();
          update = momentum_[i] * ((1 - c * n + c) * g);
        } else {
          update = momentum_[i] * (c * g);
        }
        update.add_(d[i] / n);
        break;
      }
    }
    theta_[i].sub_(update.mul_(eta));
  }
  ++updates_;
}

}  // namespace agora
