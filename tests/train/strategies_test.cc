// Tests of the dense strategies on small hand-made parameters (a [4, 6] matrix with weight decay
// and a [6] vector without): the tensor <-> payload conversions, all-reduce AdamW against torch's
// AdamW on the mean gradient, DiLoCo's rounds, sign and outer Nesterov step, and both strategies'
// state round trips and rejection of contributions that do not fit.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../unit/test_support.h"
#include "agora/core/error.h"
#include "agora/optim/adamw.h"
#include "agora/optim/diloco.h"
#include "agora/optim/payload.h"
#include "agora/optim/payload_tensors.h"

namespace agora {
namespace {

std::vector<NamedParameter> make_params(uint64_t seed = 1) {
  torch::manual_seed(seed);
  return {{"w", torch::randn({4, 6}).requires_grad_(), true},
          {"b", torch::randn({6}).requires_grad_(), false}};
}

std::vector<NamedParameter> clone_params(const std::vector<NamedParameter>& params) {
  std::vector<NamedParameter> out;
  for (const NamedParameter& p : params) {
    out.push_back({p.name, p.tensor.detach().clone().requires_grad_(), p.decay});
  }
  return out;
}

// Deterministic gradients: the same seed gives the same gradients on any replica.
std::vector<torch::Tensor> gradients(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({4, 6}), torch::randn({6})};
}

void set_grads(std::vector<NamedParameter>& params, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i].tensor.mutable_grad() = grads[i].clone();
}

std::string peer_id(size_t k) {
  return fmt::format("peer-{:03}", k);
}

bool params_equal(const std::vector<NamedParameter>& a, const std::vector<NamedParameter>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].tensor, b[i].tensor)) return false;
  }
  return true;
}

void expect_params_near(const std::vector<NamedParameter>& a, const std::vector<NamedParameter>& b,
                        double tolerance) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i].tensor, b[i].tensor, /*rtol=*/0, tolerance))
        << a[i].name << ": max difference "
        << (a[i].tensor - b[i].tensor).abs().max().item<double>();
  }
}

// torch's AdamW with the groups AdamWStrategy builds: the reference for its update.
struct ReferenceAdamW {
  explicit ReferenceAdamW(std::vector<NamedParameter>& params, const AdamWOptions& o = {}) {
    std::vector<torch::Tensor> decay, no_decay;
    for (NamedParameter& p : params) (p.decay ? decay : no_decay).push_back(p.tensor);
    const auto group = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(0.0).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, group(o.weight_decay));
    groups.emplace_back(no_decay, group(0.0));
    optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.0));
  }
  void step(double lr) {
    for (auto& g : optimizer->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    }
    optimizer->step();
  }
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// N replicas of one model, each with its own strategy, stepping as the trainer's simulation does.
struct Replicas {
  std::vector<std::vector<NamedParameter>> params;
  std::vector<std::unique_ptr<Strategy>> strategies;

  // Every peer computes its gradients (seeded by step and peer) and contributes; every peer then
  // applies all contributions, in `order` when given. Returns the contributions.
  std::vector<Contribution> step(int64_t step, double lr, const std::vector<size_t>& order = {}) {
    const int64_t n = static_cast<int64_t>(params.size());
    std::vector<Contribution> contributions;
    for (size_t k = 0; k < params.size(); ++k) {
      set_grads(params[k], gradients(1000 + 10 * step + k));
      Contribution c = strategies[k]->contribute({step, lr, n});
      c.peer = peer_id(k);
      contributions.push_back(std::move(c));
    }
    std::vector<Contribution> arranged = contributions;
    if (!order.empty()) {
      for (size_t k = 0; k < order.size(); ++k) arranged[k] = contributions[order[k]];
    }
    for (auto& s : strategies) s->apply({step, lr, n}, arranged);
    return contributions;
  }
};

Replicas adamw_replicas(size_t n, const AdamWOptions& options = {}) {
  Replicas r;
  const auto initial = make_params();
  for (size_t k = 0; k < n; ++k) {
    r.params.push_back(clone_params(initial));
    r.strategies.push_back(std::make_unique<AdamWStrategy>(r.params.back(), options));
  }
  return r;
}

Replicas diloco_replicas(size_t n, const DiLoCoOptions& options) {
  Replicas r;
  const auto initial = make_params();
  for (size_t k = 0; k < n; ++k) {
    r.params.push_back(clone_params(initial));
    r.strategies.push_back(std::make_unique<DiLoCoStrategy>(r.params.back(), options));
  }
  return r;
}

std::map<std::string, torch::Tensor> cloned(const std::map<std::string, torch::Tensor>& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : state) out[name] = t.clone();
  return out;
}

// --- payload_tensors ---------------------------------------------------------------------------

TEST(PayloadTensors, DenseF32RoundTripIsExact) {
  const torch::Tensor t = torch::randn({4, 6});
  const TensorPayload p = dense_payload(t, ValueType::kF32);
  EXPECT_EQ(p.layout, dense_layout({4, 6}, ValueType::kF32));
  Payload payload{PayloadKind::kGradient, 7, {p}};
  const Payload decoded = decode_payload(
      encode_payload(payload),
      PayloadLayout{PayloadKind::kGradient, {dense_layout({4, 6}, ValueType::kF32)}});
  EXPECT_EQ(decoded, payload);
  EXPECT_TRUE(torch::equal(to_tensor(decoded.tensors[0]), t));
}

TEST(PayloadTensors, DenseBf16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (even: 1); 1 + 3 * 2^-8 halfway between
  // 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6).
  torch::Tensor t = torch::randn({1000});
  t[0] = 1.0f + std::ldexp(1.0f, -8);
  t[1] = 1.0f + 3 * std::ldexp(1.0f, -8);
  t[2] = -(1.0f + std::ldexp(1.0f, -8));
  t[3] = 0.0f;
  t[4] = 1e-40f;  // subnormal
  const TensorPayload p = dense_payload(t, ValueType::kBF16);
  ASSERT_EQ(p.values.size(), 1000u);
  EXPECT_EQ(p.values[0], 1.0f);
  EXPECT_EQ(p.values[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(p.values[2], -1.0f);
  const float* x = t.data_ptr<float>();
  for (size_t i = 0; i < p.values.size(); ++i) {
    ASSERT_EQ(p.values[i], round_to_bf16(x[i])) << "element " << i << " = " << x[i];
  }
  Payload payload{PayloadKind::kGradient, 0, {p}};
  EXPECT_EQ(decode_payload(encode_payload(payload)), payload);
  EXPECT_EQ(to_tensor(p).sizes(), t.sizes());
}

TEST(PayloadTensors, Int8RowsQuantizeWithinHalfAScale) {
  torch::Tensor t = torch::randn({4, 6}) * 3;
  t[2].zero_();
  t[3][1] = -20.0f;  // a row whose largest magnitude is negative
  const TensorPayload p = int8_rows_payload(t);
  EXPECT_EQ(p.layout, int8_rows_layout({4, 6}));
  ASSERT_EQ(p.scales.size(), 4u);
  ASSERT_EQ(p.quantized.size(), 24u);
  Payload payload{PayloadKind::kPseudoGradient, 3, {p}};
  const Payload decoded =
      decode_payload(encode_payload(payload),
                     PayloadLayout{PayloadKind::kPseudoGradient, {int8_rows_layout({4, 6})}});
  EXPECT_EQ(decoded, payload);
  const torch::Tensor back = to_tensor(decoded.tensors[0]);
  EXPECT_EQ(back.sizes(), t.sizes());
  for (int64_t r = 0; r < 4; ++r) {
    const float scale = p.scales[r];
    EXPECT_FLOAT_EQ(scale, t[r].abs().max().item<float>() / 127.0f);
    const double error = (back[r] - t[r]).abs().max().item<double>();
    EXPECT_LE(error, scale / 2 * (1 + 1e-6)) << "row " << r;
  }
  EXPECT_EQ(p.scales[2], 0.0f);
  EXPECT_TRUE(torch::equal(back[2], torch::zeros({6})));
  EXPECT_EQ(p.quantized[3 * 6 + 1], -127);
}

TEST(PayloadTensors, Int8RowsRoundHalfToEven) {
  // Row max 127 gives scale 1, so x / scale is x: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2.
  const torch::Tensor t = torch::tensor({127.0f, 0.5f, 1.5f, 2.5f, -2.5f, -3.5f});
  const TensorPayload p = int8_rows_payload(t);
  EXPECT_EQ(p.scales, std::vector<float>{1.0f});
  EXPECT_EQ(p.quantized, (std::vector<int8_t>{127, 0, 2, 2, -2, -4}));
}

TEST(PayloadTensors, RejectsWhatAPayloadCannotCarry) {
  torch::Tensor t = torch::ones({2, 3});
  t[1][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_ERROR_WITH(dense_payload(t, ValueType::kF32), "non-finite", "[2, 3]");
  EXPECT_ERROR_WITH(int8_rows_payload(t), "non-finite");
  EXPECT_ERROR_WITH(dense_payload(torch::full({2}, 3.4e38), ValueType::kBF16), "non-finite");
  EXPECT_ERROR_WITH(dense_payload(torch::ones({2}), ValueType::kInt8), "int8");
  EXPECT_ERROR_WITH(dense_payload(torch::tensor(1.0f), ValueType::kF32), "dimensions");
  TensorPayload topk;
  topk.layout.encoding = TensorEncoding::kDctTopK;
  topk.layout.shape = {4};
  EXPECT_THROW(to_tensor(topk), Error);
}

// --- AdamW ------------------------------------------------------------------------------------

TEST(AdamW, OnePeerIsTorchAdamW) {
  auto params = make_params();
  auto reference = clone_params(params);
  AdamWStrategy strategy(params, {});
  ReferenceAdamW torch_adamw(reference);
  for (int64_t step = 0; step < 4; ++step) {
    const double lr = 1e-2 * (step + 1);
    const auto g = gradients(step);
    set_grads(params, g);
    set_grads(reference, g);
    const Contribution own = strategy.contribute({step, lr, 1});
    EXPECT_TRUE(own.bytes.empty());
    strategy.apply({step, lr, 1}, std::span<const Contribution>(&own, 1));
    torch_adamw.step(lr);
    EXPECT_TRUE(params_equal(params, reference)) << "step " << step;
  }
}

TEST(AdamW, AllReduceIsOneStepOnTheMeanGradient) {
  Replicas r = adamw_replicas(3);
  auto reference = clone_params(r.params[0]);
  ReferenceAdamW torch_adamw(reference);
  for (int64_t step = 0; step < 3; ++step) {
    const double lr = 1e-2;
    const auto contributions = r.step(step, lr);
    for (const Contribution& c : contributions) EXPECT_FALSE(c.bytes.empty());
    std::vector<torch::Tensor> mean;
    for (size_t i = 0; i < 2; ++i) {
      torch::Tensor sum = gradients(1000 + 10 * step + 0)[i].clone();
      for (size_t k = 1; k < 3; ++k) sum.add_(gradients(1000 + 10 * step + k)[i]);
      mean.push_back(sum / 3.0);
    }
    set_grads(reference, mean);
    torch_adamw.step(lr);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(params_equal(r.params[k], r.params[0])) << "replica " << k;
      expect_params_near(r.params[k], reference, 1e-6);
    }
  }
}

TEST(AdamW, ContributionOrderDoesNotMatter) {
  Replicas ordered = adamw_replicas(3);
  Replicas shuffled = adamw_replicas(3);
  for (int64_t step = 0; step < 3; ++step) {
    ordered.step(step, 1e-2);
    shuffled.step(step, 1e-2,
                  step % 2 == 0 ? std::vector<size_t>{2, 0, 1} : std::vector<size_t>{1, 2, 0});
    for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(params_equal(ordered.params[k], shuffled.params[k]));
  }
}

TEST(AdamW, Bf16GradientsAreTheRoundedGradients) {
  AdamWOptions options;
  options.gradient_type = ValueType::kBF16;
  Replicas bf16 = adamw_replicas(2, options);
  Replicas f32 = adamw_replicas(2);
  auto reference = clone_params(bf16.params[0]);
  ReferenceAdamW torch_adamw(reference);
  for (int64_t step = 0; step < 3; ++step) {
    const auto small = bf16.step(step, 1e-2);
    const auto large = f32.step(step, 1e-2);
    // Two bytes a value instead of four; the headers are the same.
    EXPECT_EQ(large[0].bytes.size() - small[0].bytes.size(), 2u * (24 + 6));
    std::vector<torch::Tensor> mean;
    for (size_t i = 0; i < 2; ++i) {
      const auto rounded = [&](size_t k) {
        return gradients(1000 + 10 * step + k)[i].to(torch::kBFloat16).to(torch::kFloat32);
      };
      mean.push_back((rounded(0) + rounded(1)) / 2.0);
    }
    set_grads(reference, mean);
    torch_adamw.step(1e-2);
    expect_params_near(bf16.params[0], reference, 1e-6);
    EXPECT_TRUE(params_equal(bf16.params[0], bf16.params[1]));
  }
  // AdamW's first step only sees the gradients' signs; the later ones see the rounding.
  EXPECT_FALSE(params_equal(bf16.params[0], f32.params[0]));
}

TEST(AdamW, NoContributionsLeavesTheStepUndone) {
  auto params = make_params();
  const auto before = clone_params(params);
  AdamWStrategy strategy(params, {});
  set_grads(params, gradients(0));
  strategy.apply({0, 1e-2, 2}, {});
  EXPECT_TRUE(params_equal(params, before));
  EXPECT_TRUE(strategy.state().empty());
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  Replicas a = adamw_replicas(2);
  for (int64_t step = 0; step < 2; ++step) a.step(step, 1e-2);
  Replicas b;
  for (size_t k = 0; k < 2; ++k) {
    b.params.push_back(clone_params(a.params[k]));
    b.strategies.push_back(std::make_unique<AdamWStrategy>(b.params.back(), AdamWOptions{}));
    b.strategies.back()->load_state(cloned(a.strategies[k]->state()));
  }
  for (int64_t step = 2; step < 5; ++step) {
    a.step(step, 1e-2);
    b.step(step, 1e-2);
    for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(params_equal(a.params[k], b.params[k]));
  }
}

TEST(AdamW, RejectsContributionsThatDoNotFit) {
  auto params = make_params();
  AdamWStrategy strategy(params, {});
  set_grads(params, gradients(0));
  // A peer with a [4, 5] matrix.
  std::vector<NamedParameter> other = {{"w", torch::zeros({4, 5}).requires_grad_(), true},
                                       {"b", torch::zeros({6}).requires_grad_(), false}};
  other[0].tensor.mutable_grad() = torch::ones({4, 5});
  other[1].tensor.mutable_grad() = torch::ones({6});
  AdamWStrategy other_strategy(other, {});
  Contribution own = strategy.contribute({0, 1e-2, 2});
  own.peer = "peer-000";
  Contribution bad = other_strategy.contribute({0, 1e-2, 2});
  bad.peer = "peer-001";
  const std::vector<Contribution> both = {own, bad};
  const auto before = clone_params(params);
  EXPECT_ERROR_WITH(strategy.apply({0, 1e-2, 2}, both), "peer-001");
  EXPECT_TRUE(params_equal(params, before));
  // A contribution for another step.
  Contribution stale = strategy.contribute({5, 1e-2, 2});
  stale.peer = "peer-002";
  const std::vector<Contribution> with_stale = {own, stale};
  EXPECT_ERROR_WITH(strategy.apply({0, 1e-2, 2}, with_stale), "peer-002", "step 5");
  Contribution garbage{"peer-003", "not a payload"};
  EXPECT_ERROR_WITH(strategy.apply({0, 1e-2, 2}, std::span<const Contribution>(&garbage, 1)),
                    "peer-003");
  AdamWOptions int8_gradients;
  int8_gradients.gradient_type = ValueType::kInt8;
  EXPECT_ERROR_WITH(AdamWStrategy(params, int8_gradients), "gradient_type");
}

// --- DiLoCo -----------------------------------------------------------------------------------

DiLoCoOptions diloco_options(int64_t inner_steps, double outer_lr, double outer_momentum,
                             ValueType type = ValueType::kF32) {
  DiLoCoOptions o;
  o.inner_steps = inner_steps;
  o.outer_lr = outer_lr;
  o.outer_momentum = outer_momentum;
  o.pseudo_gradient_type = type;
  return o;
}

torch::Tensor flat(const std::vector<NamedParameter>& params) {
  std::vector<torch::Tensor> parts;
  for (const NamedParameter& p : params) parts.push_back(p.tensor.detach().reshape({-1}));
  return torch::cat(parts);
}

TEST(DiLoCo, OnePeerWithUnitOuterStepLandsOnTheLocalParameters) {
  const int64_t H = 3;
  Replicas r = diloco_replicas(1, diloco_options(H, /*outer_lr=*/1.0, /*outer_momentum=*/0.0));
  auto local = clone_params(r.params[0]);
  AdamWStrategy inner(local, {});
  for (int64_t step = 0; step < H; ++step) {
    set_grads(local, gradients(1000 + 10 * step));
    inner.apply({step, 1e-2, 1}, {});
  }
  r.step(0, 1e-2);
  r.step(1, 1e-2);
  const auto contributions = r.step(2, 1e-2);
  ASSERT_FALSE(contributions[0].bytes.empty());
  expect_params_near(r.params[0], local, 1e-6);
}

TEST(DiLoCo, OuterStepMovesTowardTheLocalProgress) {
  // With the default outer step (lr 0.7, momentum 0.9) the first sync moves theta by
  // 0.7 * 1.9 = 1.33 times the local progress: the same direction, unless the sign is wrong.
  const int64_t H = 4;
  Replicas r = diloco_replicas(2, diloco_options(H, 0.7, 0.9));
  const torch::Tensor theta_old = flat(r.params[0]);
  for (int64_t step = 0; step < H - 1; ++step) r.step(step, 1e-2);
  // The last inner step, by hand, to see the local parameters before the sync overwrites them.
  std::vector<Contribution> contributions;
  torch::Tensor local_sum = torch::zeros_like(theta_old);
  for (size_t k = 0; k < 2; ++k) {
    set_grads(r.params[k], gradients(1000 + 10 * (H - 1) + k));
    Contribution c = r.strategies[k]->contribute({H - 1, 1e-2, 2});
    c.peer = peer_id(k);
    contributions.push_back(std::move(c));
    local_sum += flat(r.params[k]);
  }
  const torch::Tensor local_mean = local_sum / 2;
  for (auto& s : r.strategies) s->apply({H - 1, 1e-2, 2}, contributions);
  const torch::Tensor theta_new = flat(r.params[0]);
  const double dot = ((theta_new - theta_old) * (local_mean - theta_old)).sum().item<double>();
  EXPECT_GT(dot, 0);
  EXPECT_TRUE(torch::allclose(theta_new - theta_old, 1.33 * (local_mean - theta_old), 0, 1e-5));
}

TEST(DiLoCo, TwoPeersSyncEveryHSteps) {
  const int64_t H = 3;
  Replicas r = diloco_replicas(2, diloco_options(H, 0.7, 0.9));
  for (int64_t step = 0; step < 2 * H; ++step) {
    const auto contributions = r.step(step, 1e-2);
    const bool sync = (step + 1) % H == 0;
    for (const Contribution& c : contributions) EXPECT_EQ(c.bytes.empty(), !sync) << step;
    if (sync) {
      const Payload p = decode_payload(contributions[0].bytes,
                                       static_cast<DiLoCoStrategy&>(*r.strategies[0]).layout());
      EXPECT_EQ(p.kind, PayloadKind::kPseudoGradient);
      EXPECT_EQ(p.step, static_cast<uint64_t>(step));
    }
    // Between syncs each replica follows its own data; at a sync they agree bit for bit.
    EXPECT_EQ(params_equal(r.params[0], r.params[1]), sync) << step;
  }
}

TEST(DiLoCo, NesterovOuterStepByHand) {
  // One-element parameters, two peers, a sync every step; the outer step computed by hand from
  // the local parameters each peer reaches.
  const double lr_out = 0.5, mu = 0.9;
  const DiLoCoOptions options = diloco_options(1, lr_out, mu);
  std::vector<std::vector<NamedParameter>> params;
  std::vector<std::unique_ptr<DiLoCoStrategy>> strategies;
  for (size_t k = 0; k < 2; ++k) {
    params.push_back({{"x", torch::tensor({1.5f}).requires_grad_(), false}});
    strategies.push_back(std::make_unique<DiLoCoStrategy>(params.back(), options));
  }
  double theta = 1.5, buf = 0;
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<Contribution> contributions;
    double d_sum = 0;
    for (size_t k = 0; k < 2; ++k) {
      params[k][0].tensor.mutable_grad() = torch::tensor({k == 0 ? 0.3f : -1.2f});
      Contribution c = strategies[k]->contribute({step, 0.1, 2});
      c.peer = peer_id(k);
      contributions.push_back(std::move(c));
      d_sum += theta - params[k][0].tensor.item<double>();
    }
    const double d = d_sum / 2;
    buf = mu * buf + d;
    theta = theta - lr_out * (d + mu * buf);
    for (auto& s : strategies) s->apply({step, 0.1, 2}, contributions);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(params[k][0].tensor.item<double>(), theta, 1e-6) << "step " << step;
      const auto state = strategies[k]->state();
      EXPECT_NEAR(state.at("outer_momentum.x").item<double>(), buf, 1e-6);
      EXPECT_NEAR(state.at("shared.x").item<double>(), theta, 1e-6);
    }
  }
}

TEST(DiLoCo, Int8PseudoGradients) {
  const int64_t H = 2;
  Replicas int8 = diloco_replicas(3, diloco_options(H, 0.7, 0.9, ValueType::kInt8));
  Replicas f32 = diloco_replicas(3, diloco_options(H, 0.7, 0.9));
  std::vector<Contribution> small, large;
  for (int64_t step = 0; step < H; ++step) {
    small = int8.step(step, 1e-2);
    large = f32.step(step, 1e-2);
  }
  ASSERT_FALSE(small[0].bytes.empty());
  EXPECT_LT(small[0].bytes.size(), large[0].bytes.size() * 6 / 10);
  const Payload p =
      decode_payload(small[0].bytes, static_cast<DiLoCoStrategy&>(*int8.strategies[0]).layout());
  EXPECT_EQ(p.tensors[0].layout.encoding, TensorEncoding::kInt8Rows);
  for (size_t k = 1; k < 3; ++k) EXPECT_TRUE(params_equal(int8.params[k], int8.params[0]));
  // Each pseudo-gradient element is off by at most half its row's scale; the outer step scales
  // that by lr_out * (1 + mu). Two AdamW steps of lr 1e-2 move a parameter by about 2e-2, so the
  // scales are about 2e-2 / 127.
  expect_params_near(int8.params[0], f32.params[0], 0.7 * 1.9 * 0.5 * 2.5e-2 / 127);
  EXPECT_FALSE(params_equal(int8.params[0], f32.params[0]));
}

TEST(DiLoCo, StateRoundTripContinuesIdentically) {
  // Stop mid-round (H = 3, after 4 steps): the restored strategy must know the round's theta,
  // which the live parameters no longer equal.
  const DiLoCoOptions options = diloco_options(3, 0.7, 0.9, ValueType::kBF16);
  Replicas a = diloco_replicas(2, options);
  for (int64_t step = 0; step < 4; ++step) a.step(step, 1e-2);
  Replicas b;
  for (size_t k = 0; k < 2; ++k) {
    b.params.push_back(clone_params(a.params[k]));
    b.strategies.push_back(std::make_unique<DiLoCoStrategy>(b.params.back(), options));
    const auto state = cloned(a.strategies[k]->state());
    EXPECT_TRUE(state.count("inner.exp_avg.w"));
    EXPECT_TRUE(state.count("shared.b"));
    EXPECT_TRUE(state.count("outer_momentum.w"));
    b.strategies.back()->load_state(state);
  }
  for (int64_t step = 4; step < 9; ++step) {
    a.step(step, 1e-2);
    b.step(step, 1e-2);
    for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(params_equal(a.params[k], b.params[k])) << step;
  }
}

TEST(DiLoCo, LoadStateRejectsBadState) {
  auto params = make_params();
  DiLoCoStrategy strategy(params, diloco_options(2, 0.7, 0.9));
  auto state = cloned(strategy.state());
  state["shared.w"] = torch::zeros({6, 4});
  EXPECT_ERROR_WITH(strategy.load_state(state), "shared.w", "[6, 4]");
  state = cloned(strategy.state());
  state.erase("outer_momentum.b");
  EXPECT_ERROR_WITH(strategy.load_state(state), "incomplete", "outer_momentum.b");
  EXPECT_ERROR_WITH(DiLoCoStrategy(params, diloco_options(0, 0.7, 0.9)), "inner_steps");
  EXPECT_ERROR_WITH(DiLoCoStrategy(params, diloco_options(2, 0.7, 0.9, ValueType::kOneBit)),
                    "pseudo_gradient_type");
}

TEST(DiLoCo, RejectsContributionsThatDoNotFit) {
  auto params = make_params();
  DiLoCoStrategy strategy(params, diloco_options(1, 0.7, 0.9));
  std::vector<NamedParameter> other = {{"w", torch::zeros({4, 6}).requires_grad_(), true},
                                       {"b", torch::zeros({5}).requires_grad_(), false}};
  DiLoCoStrategy other_strategy(other, diloco_options(1, 0.7, 0.9));
  set_grads(params, gradients(0));
  other[0].tensor.mutable_grad() = torch::ones({4, 6});
  other[1].tensor.mutable_grad() = torch::ones({5});
  Contribution own = strategy.contribute({0, 1e-2, 2});
  own.peer = "peer-000";
  Contribution bad = other_strategy.contribute({0, 1e-2, 2});
  bad.peer = "peer-001";
  const std::vector<Contribution> both = {own, bad};
  EXPECT_ERROR_WITH(strategy.apply({0, 1e-2, 2}, both), "peer-001");

  // A pseudo-gradient on a step that does not end a round.
  auto params3 = make_params();
  DiLoCoStrategy every3(params3, diloco_options(3, 0.7, 0.9));
  EXPECT_ERROR_WITH(every3.apply({0, 1e-2, 2}, std::span<const Contribution>(&own, 1)), "peer-000",
                    "every 3");
}

}  // namespace
}  // namespace agora
