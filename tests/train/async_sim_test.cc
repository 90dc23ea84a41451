// Asynchronous data parallelism: the outer rules, delayed Nesterov's included, against
// hand-computed values (optim/async_outer.h), and the event-clock simulation's bookkeeping
// (train/async_sim.h): who delivers when, DyLU's inner steps, the sync round, determinism,
// refused options.
#include "agora/train/async_sim.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "agora/core/error.h"
#include "agora/optim/async_outer.h"

namespace agora {
namespace {

std::vector<torch::Tensor> theta0() {
  return {torch::tensor({1.0f, 2.0f})};
}
std::vector<torch::Tensor> vec(float a, float b) {
  return {torch::tensor({a, b})};
}

// `tolerance` covers float32's rounding against the float64 hand computation.
void expect_theta(const AsyncOuter& outer, double a, double b, double tolerance = 1e-6) {
  const auto t = outer.theta()[0];
  EXPECT_NEAR(t[0].item<double>(), a, tolerance);
  EXPECT_NEAR(t[1].item<double>(), b, tolerance);
}

TEST(AsyncOuterTest, NesterovPerArrivalIsDiLoCosOuterStep) {
  AsyncOuter outer(theta0(), {OuterRule::kNesterov, 0.5, 0.9});
  outer.apply(vec(0.1f, -0.2f));
  // buf = D; theta -= 0.5 (D + 0.9 buf)
  expect_theta(outer, 1.0 - 0.5 * 0.19, 2.0 + 0.5 * 0.38);
  outer.apply(vec(0.0f, 0.1f));
  // buf = 0.9 (0.1, -0.2) + (0, 0.1) = (0.09, -0.08); update = 0.9 buf + D = (0.081, 0.028)
  expect_theta(outer, 0.905 - 0.5 * 0.081, 2.19 - 0.5 * 0.028);
  EXPECT_EQ(outer.updates(), 2);
}

TEST(AsyncOuterTest, LookaheadAndItsDiscountedVariant) {
  AsyncOuter lookahead(theta0(), {OuterRule::kLookahead, 0.5, 0.9});
  lookahead.apply(vec(0.1f, -0.2f));
  // m = 0.1 D = (0.01, -0.02); update = 0.9 m + D = (0.109, -0.218)
  expect_theta(lookahead, 1.0 - 0.5 * 0.109, 2.0 + 0.5 * 0.218);
  EXPECT_NEAR(lookahead.momentum()[0][0].item<double>(), 0.01, 1e-7);

  AsyncOuter discounted(theta0(), {OuterRule::kLookaheadDiscounted, 0.5, 0.9});
  discounted.apply(vec(0.1f, -0.2f));
  // update = 0.9 m + 0.1 D = (0.019, -0.038)
  expect_theta(discounted, 1.0 - 0.5 * 0.019, 2.0 + 0.5 * 0.038);
  discounted.apply(vec(0.1f, -0.2f));
  // m = 0.9 (0.01, -0.02) + (0.01, -0.02) = (0.019, -0.038); update = 0.9 m + 0.1 D
  expect_theta(discounted, 0.9905 - 0.5 * (0.0171 + 0.01), 2.019 + 0.5 * (0.0342 + 0.02));
}

// Delayed Nesterov (Liu et al. 2024), N = 2, lr 0.5, momentum 0.9, by hand:
//   D1 = (0.1, -0.2): B = D1; not the N-th: theta -= 0.5 (c g m + D1 / 2), m = 0
//   D2 = (0, 0.1):    B = (0.1, -0.1); m = B / 2 = (0.05, -0.05); B = 0;
//                     theta -= 0.5 ((1 - 2c + c) 0.9 m + D2 / 2)
//   D3 = (0.2, 0):    theta -= 0.5 (c 0.9 m + D3 / 2)
TEST(AsyncOuterTest, DelayedNesterovMovesTheMomentumOnceEveryNArrivals) {
  AsyncOuter dn(theta0(), {OuterRule::kDelayedNesterov, 0.5, 0.9, /*buffer=*/2});
  dn.apply(vec(0.1f, -0.2f));
  expect_theta(dn, 0.975, 2.05);
  EXPECT_NEAR(dn.momentum()[0][0].item<double>(), 0.0, 1e-9);  // not moved yet
  dn.apply(vec(0.0f, 0.1f));
  expect_theta(dn, 0.975 - 0.5 * 0.045, 2.05 - 0.5 * (-0.045 + 0.05));
  EXPECT_NEAR(dn.momentum()[0][1].item<double>(), -0.05, 1e-7);
  EXPECT_NEAR(dn.momentum()[1][0].item<double>(), 0.0, 1e-9);  // the buffer, emptied
  dn.apply(vec(0.2f, 0.0f));
  expect_theta(dn, 0.9525 - 0.05, 2.0475);

  // With activation c = 0.25 part of the momentum goes in between; over a whole period the
  // momentum's share is the same (g m per N arrivals), so theta meets c = 0's after D3.
  AsyncOuter active(theta0(), {OuterRule::kDelayedNesterov, 0.5, 0.9, 2, /*activation=*/0.25});
  active.apply(vec(0.1f, -0.2f));
  active.apply(vec(0.0f, 0.1f));
  expect_theta(active, 0.975 - 0.5 * 0.03375, 2.05 - 0.5 * 0.01625);
  active.apply(vec(0.2f, 0.0f));
  expect_theta(active, 0.9025, 2.0475);

  // N = 1, c = 0 is the per-arrival Nesterov step.
  AsyncOuter one(theta0(), {OuterRule::kDelayedNesterov, 0.5, 0.9, 1});
  AsyncOuter nesterov(theta0(), {OuterRule::kNesterov, 0.5, 0.9});
  for (auto* o : {&one, &nesterov}) {
    o->apply(vec(0.1f, -0.2f));
    o->apply(vec(0.0f, 0.1f));
  }
  EXPECT_TRUE(torch::equal(one.theta()[0], nesterov.theta()[0]));

  EXPECT_THROW(AsyncOuter(theta0(), {OuterRule::kDelayedNesterov, 0.5, 0.9, 0}), Error);
  EXPECT_THROW(AsyncOuter(theta0(), {OuterRule::kDelayedNesterov, 0.5, 0.9, 2, 0.6}), Error);
  EXPECT_EQ(outer_rule_of_method("dylu"), OuterRule::kDelayedNesterov);
  EXPECT_EQ(outer_rule_of_method("async"), OuterRule::kDelayedNesterov);
  EXPECT_EQ(outer_rule_of_method("sync"), OuterRule::kNesterov);
  EXPECT_THROW(outer_rule_of_method("adam"), Error);
}

// HeLoCo (arXiv 2606.00271), lr 0.5, momentum 0.9, its default constants, one arrival through
// each branch; the values are computed by hand in float64, eps 1e-8 (G is the corrected D; then
// m <- 0.9 m + 0.1 G, theta <- theta - 0.5 (G + 0.9 m)):
//   D1 = (0.1, -0.2), m = 0:  passes (no momentum yet), as the look-ahead rule
//   D2 = (-0.1, 0.1):         opposes m: c = -0.948683, conf = 0.678269, b = 0.321731,
//                             G = D2 - b c |D2| m/|m| = (-0.080696131, 0.061392263)
//   D3 = (0.3, 0.05):         opposes slightly: c = -0.086757, b = 0.038823,
//                             G = (0.300080109, 0.048978751)
//   D4 = (0.1, 0.4):          agrees too little: c = 0.059804, l = 0.765423, turned toward m with
//                             its norm kept, G = (0.409965866, 0.043908867)
//   D5 = (0.5, -0.1):         agrees (c = 0.982818 >= 0.2): passes
TEST(AsyncOuterTest, HelocoCorrectsAStaleArrivalByItsAngleToTheMomentum) {
  AsyncOuter heloco(theta0(), {OuterRule::kHeloco, 0.5, 0.9});
  heloco.apply(vec(0.1f, -0.2f));
  expect_theta(heloco, 0.9455, 2.109, 3e-6);
  heloco.apply(vec(-0.1f, 0.1f));
  expect_theta(heloco, 0.985429392, 2.083641217, 3e-6);
  EXPECT_NEAR(heloco.momentum()[0][1].item<double>(), -0.011860774, 1e-6);
  heloco.apply(vec(0.3f, 0.05f));
  expect_theta(heloco, 0.821508925, 2.061751411, 3e-6);
  heloco.apply(vec(0.1f, 0.4f));
  expect_theta(heloco, 0.585585158, 2.040160691, 3e-6);
  EXPECT_NEAR(heloco.momentum()[0][0].item<double>(), 0.068757410, 1e-6);
  heloco.apply(vec(0.5f, -0.1f));
  expect_theta(heloco, 0.285238407, 2.094988033, 3e-6);
  EXPECT_EQ(parse_outer_rule("heloco"), OuterRule::kHeloco);

  // With both corrections switched off (k_s = k_d = 0) HeLoCo is the look-ahead rule, bit for bit.
  AsyncOuterOptions off{OuterRule::kHeloco, 0.5, 0.9};
  off.heloco.k_s = off.heloco.k_d = 0;
  AsyncOuter plain(theta0(), off), lookahead(theta0(), {OuterRule::kLookahead, 0.5, 0.9});
  for (auto* o : {&plain, &lookahead}) {
    o->apply(vec(0.1f, -0.2f));
    o->apply(vec(-0.1f, 0.1f));
    o->apply(vec(0.1f, 0.4f));
  }
  EXPECT_TRUE(torch::equal(plain.theta()[0], lookahead.theta()[0]));
  AsyncOuterOptions bad{OuterRule::kHeloco, 0.5, 0.9};
  bad.heloco.kappa = -1;
  EXPECT_THROW(AsyncOuter(theta0(), bad), Error);
}

// A restart mid-period puts the buffer back: the run goes on as if never stopped.
TEST(AsyncOuterTest, DelayedNesterovRestoresItsBuffer) {
  const AsyncOuterOptions o{OuterRule::kDelayedNesterov, 0.5, 0.9, 3};
  AsyncOuter straight(theta0(), o), first(theta0(), o);
  for (auto* a : {&straight, &first}) {
    a->apply(vec(0.1f, -0.2f));
    a->apply(vec(0.3f, 0.1f));
  }
  ASSERT_EQ(first.momentum().size(), 2u);  // the momentum and the buffer
  AsyncOuter second(theta0(), o);
  second.restore(first.theta(), first.momentum(), first.updates());
  for (auto* a : {&straight, &second}) {
    a->apply(vec(-0.1f, 0.2f));
    a->apply(vec(0.05f, 0.05f));
  }
  EXPECT_TRUE(torch::equal(straight.theta()[0], second.theta()[0]));
  EXPECT_TRUE(torch::equal(straight.momentum()[0], second.momentum()[0]));
  AsyncOuter nesterov(theta0(), {});
  EXPECT_THROW(nesterov.restore(first.theta(), first.momentum(), 2), Error);  // 2 for 1
}

TEST(AsyncOuterTest, RefusesWhatDoesNotFitAndChangesNothing) {
  AsyncOuter outer(theta0(), {});
  EXPECT_THROW(outer.apply({}), Error);
  EXPECT_THROW(outer.apply({torch::zeros({3})}), Error);
  EXPECT_THROW(outer.apply(vec(std::nanf(""), 0.0f)), Error);
  EXPECT_THROW(outer.apply(vec(INFINITY, 0.0f)), Error);
  expect_theta(outer, 1.0, 2.0);
  EXPECT_EQ(outer.updates(), 0);
  EXPECT_THROW(parse_outer_rule("adam"), Error);
  EXPECT_EQ(parse_outer_rule("lookahead_discounted"), OuterRule::kLookaheadDiscounted);
  EXPECT_THROW(AsyncOuter(theta0(), {OuterRule::kNesterov, 0.0, 0.9}), Error);
  EXPECT_THROW(AsyncOuter(theta0(), {OuterRule::kNesterov, 0.7, 1.0}), Error);
}

RunConfig config() {
  return RunConfig::parse(fmt::format(R"(
seed = 3
[model]
preset = "tiny"
vocab_size = 8192
[data]
dir = "{}"
seq_len = 16
[train]
steps = 1000
batch_size = 4
micro_batch_size = 2
eval_windows = 4
device = "cpu"
threads = 1
[schedule]
kind = "constant"
warmup_steps = 1
[optimizer]
name = "diloco"
lr = 1e-3
[diloco]
inner_steps = 2
)",
                                      AGORA_DATA_DIR "/tokens/sp8k"),
                          "async_sim_test.toml");
}

AsyncSimOptions options(const std::string& method) {
  AsyncSimOptions o;
  o.method = method;
  o.step_times = {1.0, 2.0};
  o.sim_seconds = 12;
  o.eval_every = 4;
  return o;
}

TEST(AsyncSimTest, EachWorkerDeliversAtItsOwnPaceAndTheRunIsDeterministic) {
  // H = 2: worker 0 delivers at 2, 4, ..., 12 (6), worker 1 at 4, 8, 12 (3).
  const AsyncSimSummary a = run_async_sim(config(), options("async"));
  EXPECT_EQ(a.updates, 9);
  EXPECT_EQ(a.rounds, 9);
  EXPECT_EQ(a.tokens, 9 * 2 * 2 * 16);  // rounds x H x sequences per worker x seq_len
  // Ties go in worker order. Worker 1 delivers at 4, 8 and 12 with two updates applied since its
  // pull each time; worker 0 at 6 and 10 with one (worker 1's), else none: 3 x 2 + 2 x 1.
  EXPECT_EQ(a.staleness_max, 2);
  EXPECT_NEAR(a.staleness_mean, 8.0 / 9.0, 1e-9);
  // Validations at 0, 4 and 8, then the end.
  ASSERT_EQ(a.curve.size(), 4u);
  EXPECT_EQ(a.curve[1].sim_seconds, 4);
  EXPECT_EQ(a.curve[3].sim_seconds, 12);
  EXPECT_EQ(a.curve[1].updates, 1);  // worker 0's delivery at 2; those at 4 come after
  const AsyncSimSummary b = run_async_sim(config(), options("async"));
  ASSERT_EQ(b.curve.size(), a.curve.size());
  for (size_t i = 0; i < a.curve.size(); ++i) EXPECT_EQ(a.curve[i].val_loss, b.curve[i].val_loss);
}

TEST(AsyncSimTest, SyncWaitsForTheSlowestAndDyLUScalesInnerSteps) {
  const AsyncSimSummary sync = run_async_sim(config(), options("sync"));
  // Rounds end at 4, 8, 12 (the slow worker's 2 steps of 2 s): one update each, both workers.
  EXPECT_EQ(sync.updates, 3);
  EXPECT_EQ(sync.rounds, 6);
  EXPECT_EQ(sync.staleness_max, 0);

  AsyncSimOptions o = options("dylu");
  o.step_times = {1.0, 2.0, 5.0};
  o.inner_steps = 10;
  o.sim_seconds = 10;
  RunConfig c = config();
  c.train.batch_size = 6;
  const AsyncSimSummary dylu = run_async_sim(c, o);
  EXPECT_EQ(dylu.inner_steps, (std::vector<int64_t>{10, 5, 2}));  // floor(v_w / v_fastest x H)
  EXPECT_EQ(dylu.updates, 3);                                     // every round takes 10 s
}

TEST(AsyncSimTest, RefusesOptionsItCannotRun) {
  AsyncSimOptions o = options("hogwild");
  EXPECT_THROW(run_async_sim(config(), o), Error);
  o = options("async");
  o.step_times = {1.0, 0.0};
  EXPECT_THROW(run_async_sim(config(), o), Error);
  o.step_times = {1.0, 1.0, 1.0};  // 4 sequences do not split 3 ways
  EXPECT_THROW(run_async_sim(config(), o), Error);
  o.step_times = {};
  EXPECT_THROW(run_async_sim(config(), o), Error);
  o = options("sync");
  o.outer_rule = "nesterov";  // sync's round has its own step: the option would be ignored
  EXPECT_THROW(run_async_sim(config(), o), Error);
  o = options("async");
  o.outer_rule = "adam";
  EXPECT_THROW(run_async_sim(config(), o), Error);
}

}  // namespace
}  // namespace agora
