// The torch-free decisions of asynchronous data parallelism across processes (async/rules.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "agora/async/rules.h"
#include "agora/core/error.h"

namespace agora {
namespace {

TEST(DeliverySigning, BindsRunWorkAndPayload) {
  const std::string base = delivery_signing_bytes("run", 7, "payload");
  EXPECT_EQ(base, delivery_signing_bytes("run", 7, "payload"));
  EXPECT_NE(base, delivery_signing_bytes("run2", 7, "payload"));
  EXPECT_NE(base, delivery_signing_bytes("run", 8, "payload"));
  EXPECT_NE(base, delivery_signing_bytes("run", 7, "payloaD"));
  // The tag, u16 length, the run id, u64 work id and a 32-byte hash: no ambiguity between a
  // longer run id and a work id.
  EXPECT_EQ(base.size(), std::string("agora/async-delivery/v1").size() + 2 + 3 + 8 + 32);
  EXPECT_THROW(delivery_signing_bytes(std::string(70000, 'r'), 1, ""), Error);
}

TEST(Verdicts, OnlyAcceptedAndStaleAreFree) {
  EXPECT_FALSE(strikes(kAccepted));
  EXPECT_FALSE(strikes(kStale));
  EXPECT_TRUE(strikes(kUnassigned));
  EXPECT_TRUE(strikes(kBadSignature));
  EXPECT_TRUE(strikes(kMalformed));
  EXPECT_TRUE(strikes(kOutlier));
  EXPECT_TRUE(strikes(kTooSoon));
}

TEST(NormGuard, RefusesWhatIsLargerThanTheta) {
  NormGuard guard;
  EXPECT_FALSE(guard.check(9.9, 10, 1));
  EXPECT_TRUE(guard.check(10.1, 10, 1));
  EXPECT_TRUE(guard.check(std::numeric_limits<double>::quiet_NaN(), 10, 1));
  EXPECT_TRUE(guard.check(std::numeric_limits<double>::infinity(), 10, 1));
}

TEST(NormGuard, ComparesPerStepWithTheMedianOverWorkersOnceTwoDelivered) {
  NormGuardOptions options;
  options.max_ratio = 10;
  options.per_worker = 3;
  NormGuard guard(options);
  // Before two workers delivered, only the bound by theta holds.
  EXPECT_FALSE(guard.check(500, 1000, 1));
  for (double norm : {1.0, 2.0, 3.0}) guard.accept("a", norm, 1);
  EXPECT_FALSE(guard.check(500, 1000, 1));
  guard.accept("b", 4.0, 1);
  EXPECT_DOUBLE_EQ(guard.median(), 3.0);  // the median of a's median 2 and b's 4
  EXPECT_FALSE(guard.check(30, 1000, 1));
  EXPECT_TRUE(guard.check(30.1, 1000, 1));
  // Per inner step: ten steps may move ten times as far.
  EXPECT_FALSE(guard.check(300, 1000, 10));
  EXPECT_TRUE(guard.check(301, 1000, 10));
  // Each worker keeps its newest three: a's 1 drops out, its median becomes 3.
  guard.accept("a", 2 * 10.0, 2);
  EXPECT_DOUBLE_EQ(guard.median(), 3.5);  // a {2, 3, 10} -> 3, b {4} -> 4
}

TEST(NormGuard, AnAllZeroDeliveryIsRefused) {
  NormGuard guard;
  EXPECT_TRUE(guard.check(0.0, 1000, 1));
  EXPECT_FALSE(guard.check(1e-30, 1000, 1));
}

// The attack of issue 38, finding 1: one worker delivers near-zero updates four times as often as
// three honest workers. The old guard took the median of the last 16 deliveries, which the liar
// filled with its own, so every honest delivery became an outlier, struck and banned.
TEST(NormGuard, AWorkerCountsOnceHoweverOftenItDelivers) {
  NormGuard guard;
  int refused = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 4; ++i) {
      if (guard.check(1e-12, 1000, 1)) {
        ++refused;  // too small once the median holds (below)
      } else {
        guard.accept("liar", 1e-12, 1);
      }
    }
    for (const char* honest : {"h1", "h2", "h3"}) {
      const double norm = 1.0 + 0.1 * round;  // honest norms drift
      ASSERT_FALSE(guard.check(norm, 1000, 1)) << honest << " refused in round " << round;
      guard.accept(honest, norm, 1);
    }
  }
  EXPECT_EQ(guard.workers(), 4u);
  EXPECT_EQ(refused, 19 * 4);  // accepted only while no median held (the first round)
  // Half of the workers lying is where the median falls to them: documented, not defended.
  EXPECT_GT(guard.median(), 1.0);
}

// Each delivery is an outer step, and under a momentum method each applies the momentum again:
// negligible deliveries at once would buy outer steps for nothing (the bench's `tiny` attack).
TEST(NormGuard, ADeliveryTenTimesSmallerThanTheMedianIsRefused) {
  NormGuard guard;
  EXPECT_FALSE(guard.check(1e-6, 1000, 1));  // no median yet
  guard.accept("a", 1.0, 1);
  guard.accept("b", 1.0, 1);
  EXPECT_FALSE(guard.check(0.1, 1000, 1));
  EXPECT_TRUE(guard.check(0.099, 1000, 1));
  EXPECT_FALSE(guard.check(1.0, 1000, 10));  // per inner step: 0.1 each
  EXPECT_TRUE(guard.check(0.99, 1000, 10));
}

TEST(TooSoon, ADeliveryTenTimesFasterThanTheMedianWorkerIsRefused) {
  EXPECT_FALSE(too_soon(1e-6, {}));     // nobody measured yet
  EXPECT_FALSE(too_soon(1e-6, {1.0}));  // one other worker decides nothing
  EXPECT_FALSE(too_soon(0.1, {1.0, 1.0, 5.0}));
  const auto why = too_soon(0.099, {1.0, 1.0, 5.0});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("median"), std::string::npos) << *why;
  EXPECT_FALSE(too_soon(0.7, {1.0, 2.0, 3.0, 100.0}, 4));  // median 2.5, bound 0.625
  EXPECT_TRUE(too_soon(0.6, {1.0, 2.0, 3.0, 100.0}, 4));
}

TEST(NormGuard, RemembersBoundedWorkersAndRoundTripsThroughASave) {
  NormGuardOptions options;
  options.max_workers = 3;
  NormGuard guard(options);
  for (int i = 0; i < 10; ++i) guard.accept("w" + std::to_string(i), 1.0 + i, 1);
  EXPECT_EQ(guard.workers(), 3u);  // w7, w8, w9: the longest without a delivery went first
  EXPECT_EQ(guard.recent().count("w9"), 1u);
  EXPECT_EQ(guard.recent().count("w6"), 0u);
  NormGuard restored(options);
  restored.restore(guard.recent());
  EXPECT_EQ(restored.recent(), guard.recent());
  EXPECT_DOUBLE_EQ(restored.median(), guard.median());
}

TEST(PaceEstimate, IsBiasCorrected) {
  PaceEstimate pace;
  EXPECT_FALSE(pace.known());
  pace.add(2.0);
  EXPECT_TRUE(pace.known());
  EXPECT_DOUBLE_EQ(pace.seconds_per_step(), 2.0);  // the first measurement counts fully
  pace.add(1.0);
  // (0.7 * 0.3 * 2 + 0.3 * 1) / (0.7 * 0.3 + 0.3)
  EXPECT_NEAR(pace.seconds_per_step(), (0.42 + 0.3) / 0.51, 1e-12);
}

// Issue 38, finding 9: a worker that delivers right after each hand-out measures as fastest by
// any factor; as DyLU's reference it gave every honest worker H_w = 1.
TEST(Dylu, AWorkerFasterThanTenTimesTheMedianIsNotTheReference) {
  EXPECT_DOUBLE_EQ(dylu_reference_seconds({}), 0.0);
  EXPECT_DOUBLE_EQ(dylu_reference_seconds({2.0}), 2.0);
  // The honest speeds: the fastest is the reference, as DyLU says.
  EXPECT_DOUBLE_EQ(dylu_reference_seconds({1.0, 1.3, 2.6, 5.7}), 1.0);
  const double reference = dylu_reference_seconds({1.0, 1.3, 2.6, 5.7, 1e-6});
  EXPECT_DOUBLE_EQ(reference, 1.0);
  EXPECT_EQ(dylu_inner_steps(1.3, reference, 10), 7);  // not 1
  // Within the factor a fast worker is believed (10x faster than the median 2.6 is 0.26).
  EXPECT_DOUBLE_EQ(dylu_reference_seconds({0.3, 1.3, 2.6, 5.7, 6.0}), 0.3);
}

TEST(Dylu, ScalesInnerStepsToSpeed) {
  // The speeds 1 : 1.3 : 2.6 : 5.7 with H = 10.
  EXPECT_EQ(dylu_inner_steps(1.0, 1.0, 10), 10);
  EXPECT_EQ(dylu_inner_steps(1.3, 1.0, 10), 7);
  EXPECT_EQ(dylu_inner_steps(2.6, 1.0, 10), 3);
  EXPECT_EQ(dylu_inner_steps(5.7, 1.0, 10), 1);
  EXPECT_EQ(dylu_inner_steps(100, 1.0, 10), 1);   // at least one
  EXPECT_EQ(dylu_inner_steps(0.5, 1.0, 10), 10);  // at most H, with a stale reference
  EXPECT_THROW(dylu_inner_steps(0, 1.0, 10), Error);
  EXPECT_THROW(dylu_inner_steps(1.0, 1.0, 0), Error);
}

}  // namespace
}  // namespace agora
