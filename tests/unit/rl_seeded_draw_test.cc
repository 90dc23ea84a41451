// Seeded draws (rl/seeded_draw.h): the numbers every machine computes alike.
#include <gtest/gtest.h>

#include <set>

#include "agora/rl/seeded_draw.h"

namespace agora {
namespace {

TEST(SeededDraw, UniformIsSplitmix64) {
  // splitmix64's first output from state 0 is 0xe220a8397b1dcdaf (the reference generator of
  // Steele, Lea and Flood; Java's SplittableRandom(0).nextLong()).
  EXPECT_EQ(slot_uniform(0, 0), static_cast<double>(0xe220a8397b1dcdafULL >> 11) * 0x1.0p-53);
  // The second output, 0x6e789e6aa1b965f4, is position 1.
  EXPECT_EQ(slot_uniform(0, 1), static_cast<double>(0x6e789e6aa1b965f4ULL >> 11) * 0x1.0p-53);
}

TEST(SeededDraw, UniformsLieInTheUnitIntervalAndSpreadOverIt) {
  double sum = 0;
  int below_tenth = 0;
  const int n = 100000;
  for (int t = 0; t < n; ++t) {
    const double u = slot_uniform(12345, static_cast<uint32_t>(t));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_tenth += u < 0.1;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(below_tenth / static_cast<double>(n), 0.1, 0.01);
}

TEST(SeededDraw, SeedsDifferBySlotAndRun) {
  std::set<uint64_t> seeds;
  for (uint64_t problem = 0; problem < 50; ++problem) {
    for (uint32_t sample = 0; sample < 8; ++sample) seeds.insert(slot_seed("run", problem, sample));
  }
  EXPECT_EQ(seeds.size(), 400u);
  EXPECT_EQ(slot_seed("run", 3, 1), slot_seed("run", 3, 1));
  EXPECT_NE(slot_seed("run", 3, 1), slot_seed("run2", 3, 1));
  // The run id's length is hashed too: ("ab", ...) and ("a", ...) with shifted fields differ.
  EXPECT_NE(slot_seed("ab", 0, 0), slot_seed("a", 0, 0));
}

TEST(SeededDraw, GapIsTheDistanceOutsideTheInterval) {
  EXPECT_EQ(draw_gap(0.5, 0.4, 0.6), 0.0);
  EXPECT_EQ(draw_gap(0.4, 0.4, 0.6), 0.0);           // the interval is closed below
  EXPECT_NEAR(draw_gap(0.6, 0.4, 0.6), 0.0, 1e-15);  // and open above: 0 away, but outside
  EXPECT_NEAR(draw_gap(0.3, 0.4, 0.6), 0.1, 1e-12);
  EXPECT_NEAR(draw_gap(0.9, 0.4, 0.6), 0.3, 1e-12);
}

}  // namespace
}  // namespace agora
