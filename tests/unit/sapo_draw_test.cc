// rl/sapo_draw.h: SAPO's choice of shared groups. Groups whose rewards are all alike are never
// drawn (their advantages are zero), at most J are drawn and none twice, and the draw is the
// same for the same seed.
#include "agora/rl/sapo_draw.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace agora {
namespace {

TEST(SapoDraw, AGroupIsInformativeWhenItsRewardsDiffer) {
  EXPECT_FALSE(rewards_differ({}));
  EXPECT_FALSE(rewards_differ({1.0}));
  EXPECT_FALSE(rewards_differ({0.0, 0.0, 0.0, 0.0}));
  EXPECT_FALSE(rewards_differ({1.0, 1.0, 1.0}));
  EXPECT_TRUE(rewards_differ({0.0, 0.0, 1.0}));
  EXPECT_TRUE(rewards_differ({1.0, 0.0}));
  EXPECT_TRUE(rewards_differ({0.5, 0.5, 0.25, 0.5}));
}

TEST(SapoDraw, OnlyInformativeGroupsAreDrawnEachAtMostOnce) {
  // 12 groups, informative at 1, 4, 5, 9 and 11.
  std::vector<bool> informative(12, false);
  for (size_t i : {1, 4, 5, 9, 11}) informative[i] = true;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<size_t> drawn = draw_shared(informative, 3, sapo_mix(seed));
    ASSERT_EQ(drawn.size(), 3u) << seed;
    EXPECT_EQ(std::set<size_t>(drawn.begin(), drawn.end()).size(), 3u) << "a repeat, seed " << seed;
    for (size_t i : drawn) EXPECT_TRUE(informative[i]) << "drew uninformative group " << i;
  }
  // Asking for more than there are gives all of them, once each; none and negative give none.
  const std::vector<size_t> all = draw_shared(informative, 100, 7);
  EXPECT_EQ(std::set<size_t>(all.begin(), all.end()), (std::set<size_t>{1, 4, 5, 9, 11}));
  EXPECT_TRUE(draw_shared(informative, 0, 7).empty());
  EXPECT_TRUE(draw_shared(informative, -3, 7).empty());
  EXPECT_TRUE(draw_shared(std::vector<bool>(8, false), 3, 7).empty());
}

TEST(SapoDraw, TheDrawIsSeededAndSpreadsOverTheCandidates) {
  std::vector<bool> informative(10, true);
  EXPECT_EQ(draw_shared(informative, 4, 42), draw_shared(informative, 4, 42));
  // Over many seeds every candidate is drawn first about equally often (10% each): a draw that
  // always starts at the same group, or never reaches the last, fails.
  std::vector<int> first(10, 0);
  const int seeds = 5000;
  for (int s = 0; s < seeds; ++s) ++first[draw_shared(informative, 1, sapo_mix(s))[0]];
  for (int count : first) {
    EXPECT_GT(count, seeds / 10 * 0.8);
    EXPECT_LT(count, seeds / 10 * 1.2);
  }
  // The first pick is the candidate at sapo_mix(state) modulo the candidates, as documented.
  EXPECT_EQ(draw_shared(informative, 1, 99)[0], sapo_mix(99) % 10);
}

}  // namespace
}  // namespace agora
