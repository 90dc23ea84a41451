// serve/rate_gate.h: a budget per member, one for all strangers, a bounded map, and the drops
// reported per key, on a hand-driven clock.
#include <gtest/gtest.h>

#include <string>

#include "agora/serve/rate_gate.h"

namespace agora::serve {
namespace {

TEST(ServeRateGate, EachMemberHasItsOwnBudgetAndStrangersShareOne) {
  RateGate gate({/*per_second=*/1, /*burst=*/3}, {/*per_second=*/1, /*burst=*/2});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(gate.take("a", true, 0));
  EXPECT_FALSE(gate.take("a", true, 0));
  // Another member is untouched by a's flood.
  EXPECT_TRUE(gate.take("b", true, 0));
  // Two strangers together spend the strangers' burst of 2.
  EXPECT_TRUE(gate.take("x", false, 0));
  EXPECT_TRUE(gate.take("y", false, 0));
  EXPECT_FALSE(gate.take("z", false, 0));
  EXPECT_EQ(gate.tracked(), 2u);  // strangers leave no entry
  // One second refills one message of a's budget.
  EXPECT_TRUE(gate.take("a", true, 1));
  EXPECT_FALSE(gate.take("a", true, 1));
  EXPECT_EQ(gate.dropped_total(), 3u);
}

TEST(ServeRateGate, ReportCountsDropsPerKeyAndForgetsRefilledBuckets) {
  RateGate gate({1, 2}, {1, 1});
  gate.take("a", true, 0);
  gate.take("a", true, 0);
  gate.take("a", true, 0);  // dropped
  gate.take("s", false, 0);
  gate.take("s", false, 0);  // dropped
  gate.take("b", true, 0);
  const auto first = gate.report(0);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].key, "");  // the strangers come first
  EXPECT_EQ(first[0].messages, 1u);
  EXPECT_EQ(first[1].key, "a");
  EXPECT_EQ(first[1].messages, 1u);
  EXPECT_EQ(gate.tracked(), 2u);  // both still spent
  EXPECT_TRUE(gate.report(10).empty());
  EXPECT_EQ(gate.tracked(), 0u);  // refilled buckets are forgotten
}

TEST(ServeRateGate, TheMapIsBoundedWhateverKeysArrive) {
  RateGate gate({1, 5}, {1, 1}, /*max_tracked=*/8);
  for (int i = 0; i < 10000; ++i) {
    EXPECT_TRUE(gate.take("route-" + std::to_string(i), true, 0));
    EXPECT_LE(gate.tracked(), 8u);
  }
  // Keys that left are forgotten on request.
  gate.forget_if([](const std::string&) { return true; });
  EXPECT_EQ(gate.tracked(), 0u);
}

TEST(ServeRateGate, TheMembersBudgetCanBeSetLater) {
  RateGate gate({1, 1}, {1, 1});
  gate.set_member_rate({10, 40});
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(gate.take("a", true, 0));
  EXPECT_FALSE(gate.take("a", true, 0));
}

}  // namespace
}  // namespace agora::serve
