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
}

TEST(NormGuard, RefusesWhatIsLargerThanTheta) {
  NormGuard guard;
  EXPECT_FALSE(guard.check(9.9, 10, 1));
  EXPECT_TRUE(guard.check(10.1, 10, 1));
  EXPECT_TRUE(guard.check(std::numeric_limits<double>::quiet_NaN(), 10, 1));
  EXPECT_TRUE(guard.check(std::numeric_limits<double>::infinity(), 10, 1));
}

TEST(NormGuard, ComparesPerStepWithTheMedianOnceItHasAHistory) {
  NormGuardOptions options;
  options.max_ratio = 10;
  options.min_history = 4;
  options.window = 5;
  NormGuard guard(options);
  // Before min_history accepted deliveries, only the bound by theta holds.
  EXPECT_FALSE(guard.check(500, 1000, 1));
  for (double norm : {1.0, 2.0, 3.0}) guard.accept(norm, 1);
  EXPECT_FALSE(guard.check(500, 1000, 1));
  guard.accept(4.0, 1);
  EXPECT_DOUBLE_EQ(guard.median(), 2.5);
  EXPECT_FALSE(guard.check(25, 1000, 1));
  EXPECT_TRUE(guard.check(25.1, 1000, 1));
  // Per inner step: ten steps may move ten times as far.
  EXPECT_FALSE(guard.check(250, 1000, 10));
  EXPECT_TRUE(guard.check(251, 1000, 10));
  // The window forgets the oldest: 1 and 2 drop out after three more.
  for (double norm : {10.0, 10.0, 10.0}) guard.accept(norm * 2, 2);
  EXPECT_DOUBLE_EQ(guard.median(), 10.0);  // {3, 4, 10, 10, 10}
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
