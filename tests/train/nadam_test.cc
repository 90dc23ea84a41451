// Tests of NAdam with decoupled weight decay (optim/nadam.h) on small hand-made parameters: a [2,
// 3] matrix with weight decay, a [3] vector without, and a [2] vector with weight decay whose
// gradient is missing on some steps. The update against a reference written here in plain double
// loops from the formulas (the swapped-momentum variant of that reference must miss, so the
// comparison can fail), the state round trip continuing bit-identically, and the rejection of bad
// options, learning rates, gradients and states.
#include "agora/optim/nadam.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../unit/test_support.h"
#include "agora/core/error.h"

namespace agora {
namespace {

struct Shape {
  std::string name;
  std::vector<int64_t> sizes;
  bool decay;
};

const std::vector<Shape> kShapes = {{"w", {2, 3}, true}, {"b", {3}, false}, {"c", {2}, true}};
constexpr size_t kMissingSometimes = 2;  // "c": no gradient on steps 0 and 2
constexpr int kSteps = 5;
const std::vector<double> kLrs = {0.05, 0.04, 0.03, 0.02, 0.01};  // a decaying schedule

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s.sizes) n *= d;
  return n;
}

bool has_gradient(size_t param, int step) {
  return param != kMissingSometimes || (step != 0 && step != 2);
}

// Fixed values, different per parameter, element and step; one gradient entry is exactly zero.
double initial_value(size_t param, int64_t e) {
  return std::cos(0.8 * static_cast<double>(e) + static_cast<double>(param)) + 0.1;
}
double gradient_value(size_t param, int64_t e, int step) {
  if (param == 0 && e == 4 && step == 1) return 0.0;
  return std::sin(1.7 * static_cast<double>(e) + 0.9 * step + 0.3 * static_cast<double>(param)) *
         (1.0 + 0.5 * static_cast<double>(param));
}

// Rounded through `dtype`, so that the reference starts from exactly what the tensors hold.
std::vector<double> rounded(std::vector<double> values, torch::ScalarType dtype) {
  torch::Tensor t = torch::tensor(values, torch::kFloat64).to(dtype).to(torch::kFloat64);
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

std::vector<double> initial_values(size_t param, torch::ScalarType dtype) {
  std::vector<double> out;
  for (int64_t e = 0; e < numel(kShapes[param]); ++e) out.push_back(initial_value(param, e));
  return rounded(out, dtype);
}

std::vector<double> gradient_values(size_t param, int step, torch::ScalarType dtype) {
  std::vector<double> out;
  for (int64_t e = 0; e < numel(kShapes[param]); ++e) out.push_back(gradient_value(param, e, step));
  return rounded(out, dtype);
}

torch::Tensor to_tensor(const std::vector<double>& values, const Shape& shape,
                        torch::ScalarType dtype) {
  return torch::tensor(values, torch::kFloat64).reshape(shape.sizes).to(dtype);
}

std::vector<NamedParameter> make_params(torch::ScalarType dtype) {
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    out.push_back({kShapes[i].name,
                   to_tensor(initial_values(i, dtype), kShapes[i], dtype).requires_grad_(),
                   kShapes[i].decay});
  }
  return out;
}

void set_grads(std::vector<NamedParameter>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::ScalarType dtype = params[i].tensor.scalar_type();
    params[i].tensor.mutable_grad() =
        has_gradient(i, step) ? to_tensor(gradient_values(i, step, dtype), kShapes[i], dtype)
                              : torch::Tensor();
  }
}

// The formulas of the header, one element at a time in double.
struct Reference {
  std::vector<double> p, m, v;
  bool decay = true;
  int64_t t = 0;
  double mu_product = 1.0;

  // `swap_momenta` exchanges mu_t and mu_{t+1}: the slip the comparison must be able to see.
  void step(const std::vector<double>& g, double lr, const NAdamOptions& o,
            bool swap_momenta = false) {
    if (m.empty()) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    ++t;
    const auto momentum = [&](int64_t s) {
      return o.beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(s) * o.momentum_decay));
    };
    double mu = momentum(t), mu_next = momentum(t + 1);
    if (swap_momenta) std::swap(mu, mu_next);
    mu_product *= mu;
    for (size_t e = 0; e < p.size(); ++e) {
      if (decay) p[e] *= 1.0 - lr * o.weight_decay;
      m[e] = o.beta1 * m[e] + (1.0 - o.beta1) * g[e];
      v[e] = o.beta2 * v[e] + (1.0 - o.beta2) * g[e] * g[e];
      const double denom =
          std::sqrt(v[e] / (1.0 - std::pow(o.beta2, static_cast<double>(t)))) + o.eps;
      p[e] -= lr * (1.0 - mu) / (1.0 - mu_product) * g[e] / denom;
      p[e] -= lr * mu_next / (1.0 - mu_product * mu_next) * m[e] / denom;
    }
  }
};

std::vector<Reference> reference_run(const NAdamOptions& o, torch::ScalarType dtype,
                                     bool swap_momenta = false) {
  std::vector<Reference> refs(kShapes.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    refs[i].p = initial_values(i, dtype);
    refs[i].decay = kShapes[i].decay;
  }
  for (int k = 0; k < kSteps; ++k) {
    for (size_t i = 0; i < refs.size(); ++i) {
      if (has_gradient(i, k)) refs[i].step(gradient_values(i, k, dtype), kLrs[k], o, swap_momenta);
    }
  }
  return refs;
}

// The largest difference relative to the largest expected magnitude: an element that passes
// near zero is held to the tensor's scale, not to its own.
double max_relative_error(const torch::Tensor& actual, const std::vector<double>& expected) {
  const torch::Tensor a = actual.to(torch::kFloat64).contiguous();
  double worst = 0, scale = 0;
  for (size_t e = 0; e < expected.size(); ++e) {
    worst = std::max(worst, std::abs(a.data_ptr<double>()[e] - expected[e]));
    scale = std::max(scale, std::abs(expected[e]));
  }
  return worst / scale;
}

struct Case {
  const char* what;
  NAdamOptions options;
};

std::vector<Case> cases() {
  NAdamOptions method;  // the asynchronous method's defaults, with visible weight decay
  method.weight_decay = 0.1;
  NAdamOptions fast;  // torch's ordinary beta1, and a momentum schedule that moves quickly
  fast.beta1 = 0.9;
  fast.beta2 = 0.99;
  fast.eps = 1e-6;
  fast.weight_decay = 0.05;
  fast.momentum_decay = 0.3;
  return {{"method defaults", method}, {"fast schedule", fast}};
}

void expect_matches_reference(torch::ScalarType dtype, double tolerance) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    std::vector<NamedParameter> params = make_params(dtype);
    NAdam nadam(params, c.options);
    for (int k = 0; k < kSteps; ++k) {
      set_grads(params, k);
      nadam.step(kLrs[k]);
    }
    EXPECT_EQ(nadam.steps(), kSteps);

    const std::vector<Reference> refs = reference_run(c.options, dtype);
    const std::vector<Reference> swapped = reference_run(c.options, dtype, /*swap_momenta=*/true);
    const std::map<std::string, torch::Tensor> state = nadam.state();
    double swapped_error = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      EXPECT_LT(max_relative_error(params[i].tensor, refs[i].p), tolerance) << name;
      EXPECT_LT(max_relative_error(state.at(name + ".exp_avg"), refs[i].m), tolerance) << name;
      EXPECT_LT(max_relative_error(state.at(name + ".exp_avg_sq"), refs[i].v), tolerance) << name;
      EXPECT_EQ(state.at(name + ".step").item<double>(), static_cast<double>(refs[i].t)) << name;
      EXPECT_NEAR(state.at(name + ".mu_product").item<double>(), refs[i].mu_product, 1e-15) << name;
      swapped_error = std::max(swapped_error, max_relative_error(params[i].tensor, swapped[i].p));
    }
    EXPECT_EQ(state.at("c.step").item<double>(), 3.0);  // its gradient was missing twice
    // Swapping mu_t and mu_{t+1} moves the parameters far beyond the tolerance: by a few 1e-6 at
    // the method's defaults (a 1e-4 change of a step of a few percent), which float32's rounding
    // would blur, so the check is made in float64.
    if (dtype == torch::kFloat64) {
      EXPECT_GT(swapped_error, 1000 * tolerance);
    }
  }
}

TEST(NAdam, MatchesTheScalarReferenceInFloat64) {
  expect_matches_reference(torch::kFloat64, 1e-12);
}

TEST(NAdam, MatchesTheScalarReferenceInFloat32) {
  expect_matches_reference(torch::kFloat32, 1e-6);
}

TEST(NAdam, WeightDecayOnlyWhereMarkedAndScaledByLr) {
  // With zero gradients the moments stay zero and only the decay moves a parameter.
  std::vector<NamedParameter> params = make_params(torch::kFloat64);
  const std::vector<torch::Tensor> before = {params[0].tensor.clone(), params[1].tensor.clone()};
  NAdamOptions o;
  o.weight_decay = 0.5;
  NAdam nadam(params, o);
  for (NamedParameter& p : params) p.tensor.mutable_grad() = torch::zeros_like(p.tensor);
  nadam.step(0.1);
  EXPECT_TRUE(torch::allclose(params[0].tensor, before[0] * 0.95, 0, 1e-15));
  EXPECT_TRUE(torch::equal(params[1].tensor, before[1]));
}

bool states_equal(const std::map<std::string, torch::Tensor>& a,
                  const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end() || !torch::equal(value, it->second)) return false;
  }
  return true;
}

TEST(NAdam, StateRoundTripContinuesBitIdentically) {
  std::vector<NamedParameter> a = make_params(torch::kFloat32);
  NAdam first(a, NAdamOptions{});
  // One step: "c" has had no gradient yet, so the saved state has no entries for it.
  set_grads(a, 0);
  first.step(kLrs[0]);
  std::map<std::string, torch::Tensor> saved = first.state();
  EXPECT_EQ(saved.count("c.exp_avg"), 0u);
  EXPECT_EQ(saved.at("steps").scalar_type(), torch::kFloat64);
  EXPECT_EQ(saved.at("w.mu_product").dim(), 0);

  std::vector<NamedParameter> b;
  for (const NamedParameter& p : a)
    b.push_back({p.name, p.tensor.detach().clone().requires_grad_(), p.decay});
  NAdam second(b, NAdamOptions{});
  second.load_state(saved);
  EXPECT_EQ(second.steps(), 1);
  EXPECT_TRUE(states_equal(second.state(), first.state()));
  // state() hands out copies: writing into them touches neither optimizer.
  for (auto& [key, value] : saved) value.fill_(7);
  EXPECT_TRUE(states_equal(second.state(), first.state()));

  for (int k = 1; k < kSteps; ++k) {
    set_grads(a, k);
    set_grads(b, k);
    first.step(kLrs[k]);
    second.step(kLrs[k]);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].tensor, b[i].tensor)) << i;
  EXPECT_TRUE(states_equal(second.state(), first.state()));
  EXPECT_EQ(second.steps(), kSteps);
}

TEST(NAdam, RejectsOptionsOutOfRange) {
  const auto with = [](auto change) {
    NAdamOptions o;
    change(o);
    return o;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<NamedParameter> params = make_params(torch::kFloat32);
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.beta1 = 1.0; })), "beta1", "1",
                    "[0, 1)");
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.beta1 = -0.1; })), "beta1", "-0.1");
  EXPECT_ERROR_WITH((void)NAdam(params, with([&](auto& o) { o.beta1 = nan; })), "beta1", "nan");
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.beta2 = 1.5; })), "beta2", "1.5",
                    "[0, 1)");
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.eps = 0; })), "eps", "> 0");
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.weight_decay = -0.01; })),
                    "weight_decay", "-0.01", ">= 0");
  EXPECT_ERROR_WITH((void)NAdam(params, with([](auto& o) { o.momentum_decay = -1; })),
                    "momentum_decay", "-1", ">= 0");
  // The edges are allowed.
  EXPECT_NO_THROW((void)NAdam(params, with([](auto& o) {
                                o.beta1 = 0;
                                o.beta2 = 0;
                                o.weight_decay = 0;
                                o.momentum_decay = 0;
                              })));
}

TEST(NAdam, RejectsBadParametersLrAndGradients) {
  std::vector<NamedParameter> params = make_params(torch::kFloat32);
  std::vector<NamedParameter> twice = params;
  twice.push_back(params[0]);
  EXPECT_ERROR_WITH((void)NAdam(twice, NAdamOptions{}), "w", "twice");

  NAdam nadam(params, NAdamOptions{});
  set_grads(params, 0);
  EXPECT_ERROR_WITH(nadam.step(-0.1), "lr", "-0.1");
  EXPECT_ERROR_WITH(nadam.step(std::numeric_limits<double>::infinity()), "lr", "inf");

  // A sparse gradient is refused before any parameter moves.
  const torch::Tensor w = params[0].tensor.clone();
  params[1].tensor.mutable_grad() = torch::zeros({3}).to_sparse();
  EXPECT_ERROR_WITH(nadam.step(0.1), "b", "sparse");
  EXPECT_TRUE(torch::equal(params[0].tensor, w));
  EXPECT_EQ(nadam.steps(), 0);
}

TEST(NAdam, RejectsBadStatesAndKeepsItsOwn) {
  std::vector<NamedParameter> params = make_params(torch::kFloat32);
  NAdam nadam(params, NAdamOptions{});
  set_grads(params, 0);
  nadam.step(0.01);
  const std::map<std::string, torch::Tensor> good = nadam.state();

  const auto changed = [&](const std::string& key, const torch::Tensor& value) {
    std::map<std::string, torch::Tensor> s = good;
    if (value.defined()) {
      s[key] = value;
    } else {
      s.erase(key);
    }
    return s;
  };
  const auto scalar = [](double v) { return torch::scalar_tensor(v, torch::kFloat64); };
  EXPECT_ERROR_WITH(nadam.load_state(changed("x.exp_avg", torch::zeros({2}))), "x.exp_avg",
                    "unknown");
  EXPECT_ERROR_WITH(nadam.load_state(changed("w.mu_product", {})), "w", "incomplete");
  EXPECT_ERROR_WITH(nadam.load_state(changed("steps", {})), "steps");
  EXPECT_ERROR_WITH(nadam.load_state(changed("w.exp_avg", torch::zeros({3, 2}))), "w.exp_avg",
                    "[3, 2]", "[2, 3]");
  EXPECT_ERROR_WITH(nadam.load_state(changed("b.exp_avg_sq", torch::zeros({3}, torch::kInt64))),
                    "b.exp_avg_sq", "floating-point");
  EXPECT_ERROR_WITH(nadam.load_state(changed("w.step", scalar(0))), "w.step", ">= 1");
  EXPECT_ERROR_WITH(nadam.load_state(changed("w.step", scalar(1.5))), "w.step", "1.5");
  EXPECT_ERROR_WITH(nadam.load_state(changed("w.step", torch::ones({2}))), "w.step", "2 elements");
  EXPECT_ERROR_WITH(nadam.load_state(changed("b.mu_product", scalar(1.0))), "b.mu_product",
                    "[0, 1)");
  EXPECT_ERROR_WITH(nadam.load_state(changed("steps", scalar(-1))), "steps", ">= 0");
  EXPECT_TRUE(states_equal(nadam.state(), good));

  // A state from before any step loads into a stepped optimizer and resets it.
  nadam.load_state({{"steps", scalar(0)}});
  EXPECT_EQ(nadam.steps(), 0);
  EXPECT_EQ(nadam.state().size(), 1u);
}

}  // namespace
}  // namespace agora
