// DeMo's apply() against hostile contributions (docs/security.md): values near FLT_MAX that
// would overflow the inverse transform, and a scaled, sign-flipped contribution that would steer
// the update. The bound (optim/influence.h) keeps the update finite and close to the honest
// majority's; without it, the step is skipped (not finite) or steered.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cfloat>

#include "agora/optim/decoupled_momentum.h"

namespace agora {
namespace {

struct Peers {
  std::vector<std::vector<NamedParameter>> params;
  std::vector<Contribution> honest;
};

// Four peers' contributions to step 0 of one [64, 64] tensor, each from its own gradient.
Peers four_peers(const DemoOptions& options) {
  Peers out;
  torch::manual_seed(1);
  const torch::Tensor start = torch::randn({64, 64});
  for (int i = 0; i < 4; ++i) {
    std::vector<NamedParameter> params{{"w", start.clone(), true}};
    torch::manual_seed(100 + i);
    params[0].tensor.mutable_grad() = torch::randn({64, 64}) + 0.5;  // a shared direction
    DecoupledMomentum demo(params, options);
    Contribution c = demo.contribute({0, 0.01, 4});
    c.peer = fmt::format("peer-{}", i);
    out.honest.push_back(std::move(c));
    out.params.push_back(std::move(params));
  }
  return out;
}

// `c`'s payload with every value multiplied by `factor` (and the step kept).
Contribution scaled(const Contribution& c, float factor, std::string peer) {
  Payload p = decode_payload(c.bytes);
  for (TensorPayload& t : p.tensors) {
    for (float& v : t.values) v *= factor;
  }
  return {std::move(peer), encode_payload(p)};
}

// `c`'s payload rewritten so that every chunk (16 x 16, top 8) selects the first eight rows of
// its first column, each with +FLT_MAX: finite, well-formed, and the inverse transform's column
// sums exceed FLT_MAX.
Contribution overflowing(const Contribution& c, std::string peer) {
  Payload p = decode_payload(c.bytes);
  for (TensorPayload& t : p.tensors) {
    for (size_t i = 0; i < t.positions.size(); ++i) {
      t.positions[i] = static_cast<uint32_t>(16 * (i % 8));
      t.values[i] = FLT_MAX;
    }
  }
  return {std::move(peer), encode_payload(p)};
}

// The update a set of contributions makes to the start parameters: sign pattern, in {-1, 0, 1}.
torch::Tensor update(const std::vector<Contribution>& set, double ratio, ApplyReport* report) {
  torch::manual_seed(1);
  std::vector<NamedParameter> params{{"w", torch::randn({64, 64}), true}};
  const torch::Tensor before = params[0].tensor.clone();
  DecoupledMomentum demo(params, {.topk = 8, .chunk = 16, .max_norm_ratio = ratio});
  *report = demo.apply({0, 0.01, static_cast<int64_t>(set.size())}, set);
  return (before - params[0].tensor).sign();
}

double disagreement(const torch::Tensor& a, const torch::Tensor& b) {
  return a.ne(b).to(torch::kFloat64).mean().item<double>();
}

TEST(HostileContributions, ValuesNearFltMaxAreBoundedInsteadOfOverflowing) {
  const Peers peers = four_peers({.topk = 8, .chunk = 16});
  std::vector<Contribution> set(peers.honest.begin(), peers.honest.begin() + 3);
  set.push_back(overflowing(peers.honest[3], "mallory"));

  ApplyReport unbounded;
  const torch::Tensor moved = update(set, 0.0, &unbounded);
  // Without the bound the inverse transform overflows: the step is refused as a whole.
  EXPECT_TRUE(unbounded.skipped);
  EXPECT_EQ(moved.abs().sum().item<double>(), 0.0) << "a skipped step changes nothing";

  ApplyReport bounded;
  const torch::Tensor step = update(set, 2.0, &bounded);
  EXPECT_FALSE(bounded.skipped);
  EXPECT_GE(bounded.clipped, 1);
  EXPECT_TRUE(torch::isfinite(step).all().item<bool>());
  EXPECT_GT(step.abs().sum().item<double>(), 0.0);
}

TEST(HostileContributions, AScaledSignFlipCannotSteerTheUpdate) {
  const Peers peers = four_peers({.topk = 8, .chunk = 16});
  const std::vector<Contribution> honest(peers.honest.begin(), peers.honest.begin() + 3);
  ApplyReport report;
  const torch::Tensor reference = update(honest, 2.0, &report);
  EXPECT_EQ(report.clipped, 0) << "honest contributions of one distribution are not clipped";

  std::vector<Contribution> attacked = honest;
  attacked.push_back(scaled(peers.honest[0], -1e6f, "mallory"));
  const double steered = disagreement(update(attacked, 0.0, &report), reference);
  const double bounded = disagreement(update(attacked, 2.0, &report), reference);
  EXPECT_GE(report.clipped, 1);
  // An honest-sized sign flip (one of four) is what the bound reduces the attack to.
  std::vector<Contribution> flipped = honest;
  flipped.push_back(scaled(peers.honest[0], -1.0f, "mallory"));
  const double honest_sized = disagreement(update(flipped, 2.0, &report), reference);
  EXPECT_GT(steered, 0.3) << "unbounded, the attacker decides most signs it selects";
  EXPECT_LE(bounded, 2 * honest_sized + 0.02)
      << "bounded, it counts at most as much as ratio x an honest contribution";
  EXPECT_LT(bounded, steered / 2);
}

}  // namespace
}  // namespace agora
