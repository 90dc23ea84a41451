// swarm/balance.h: the coordinator's choice of stage for joiners and moves.
#include "agora/swarm/balance.h"

#include <gtest/gtest.h>

#include "agora/core/error.h"

namespace agora {
namespace {

// The layout: 3 stages of equal cost, peers of speed 1 (3 s per sample: a forward of 1 s
// and a backward of 2) and 1/3 (9 s per sample).
std::vector<StagePeer> layout() {
  return {{0, 0, 3}, {1, 0, 3}, {2, 0, 9}, {3, 1, 3}, {4, 1, 9},
          {5, 2, 3}, {6, 2, 3}, {7, 2, 9}};
}
const std::vector<double> kEqual = {1, 1, 1};

TEST(SwarmBalance, StageThroughputsSumTheirPeers) {
  const std::vector<double> tp = stage_throughputs(layout(), kEqual);
  ASSERT_EQ(tp.size(), 3u);
  EXPECT_DOUBLE_EQ(tp[0], 7.0 / 9);
  EXPECT_DOUBLE_EQ(tp[1], 4.0 / 9);
  EXPECT_DOUBLE_EQ(tp[2], 7.0 / 9);
  // Unmeasured: the mean of its stage's measured peers, else of the swarm's (here both 2/9).
  const std::vector<double> partly =
      stage_throughputs({{0, 0, 3}, {1, 0, 9}, {2, 0, 0}, {3, 1, 0}}, {1, 2});
  EXPECT_DOUBLE_EQ(partly[0], 1.0 / 3 + 1.0 / 9 + 2.0 / 9);
  EXPECT_DOUBLE_EQ(partly[1], 2.0 / 9 / 2);
  // Nothing measured: every peer counts the same.
  EXPECT_EQ(stage_throughputs({{0, 0, 0}, {1, 0, 0}, {2, 1, 0}}, {1, 1}),
            (std::vector<double>{2, 1}));
}

TEST(SwarmBalance, JoinersGoToAnEmptyStageThenTheBottleneck) {
  EXPECT_EQ(stage_for_joiner(layout(), kEqual), 1);
  EXPECT_EQ(stage_for_joiner({{0, 0, 3}, {1, 2, 9}}, kEqual), 1);  // empty beats slow
  EXPECT_EQ(stage_for_joiner({{0, 1, 3}, {1, 2, 3}}, kEqual), 0);
  EXPECT_EQ(stage_for_joiner({{0, 0, 3}, {1, 1, 3}, {2, 2, 3}}, kEqual), 0);  // ties: lowest
  // A peer still loading holds its stage even before it is measured.
  EXPECT_EQ(stage_for_joiner({{0, 0, 3}, {1, 1, 0}, {2, 2, 9}}, kEqual), 2);
}

TEST(SwarmBalance, PlanMoveRaisesTheBottleneck) {
  const std::optional<StageMove> m = plan_move(layout(), kEqual, 0.05);
  ASSERT_TRUE(m.has_value());
  // Moving a fast peer to stage 1 only swaps the bottleneck; moving a slow one raises it.
  // Stages 0 and 2 tie as donors, so the smaller peer id goes.
  EXPECT_EQ(m->peer, 2u);
  EXPECT_EQ(m->from, 0);
  EXPECT_EQ(m->to, 1);
  EXPECT_DOUBLE_EQ(m->bottleneck_before, 4.0 / 9);
  EXPECT_DOUBLE_EQ(m->bottleneck_after, 5.0 / 9);
  // After that move the swarm is at the best it can do with single moves of enough gain.
  std::vector<StagePeer> after = layout();
  after[2].stage = 1;
  const std::optional<StageMove> next = plan_move(after, kEqual, 0.05);
  if (next) {
    EXPECT_GT(next->bottleneck_after, next->bottleneck_before * 1.05);
  }
}

TEST(SwarmBalance, PlanMoveKeepsStagesAndIgnoresNoise) {
  // A lone peer never leaves its stage, however slow the other stage is.
  EXPECT_FALSE(plan_move({{0, 0, 1}, {1, 1, 100}}, {1, 1}, 0).has_value());
  // Unmeasured peers are not moved.
  const std::optional<StageMove> measured = plan_move({{0, 0, 0}, {1, 0, 3}, {2, 1, 30}}, {1, 1}, 0);
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(measured->peer, 1u);
  // 4% better is not worth a move at a 5% threshold, and is at 3%.
  const std::vector<StagePeer> close = {{0, 0, 1}, {1, 0, 25}, {2, 1, 1.04}};
  EXPECT_FALSE(plan_move(close, {1, 1}, 0.05).has_value());
  const std::optional<StageMove> m = plan_move(close, {1, 1}, 0.03);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->peer, 1u);
  EXPECT_EQ(m->to, 1);
}

TEST(SwarmBalance, SpeedCarriesAcrossStagesByCost) {
  // Peer 1 takes 2 s per sample on stage 0 (cost 1); stage 1 costs 3, so it would take 6 s there.
  const std::optional<StageMove> m =
      plan_move({{0, 0, 2}, {1, 0, 2}, {2, 1, 6}}, {1, 3}, 0.01);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->bottleneck_before, 1.0 / 6);
  EXPECT_DOUBLE_EQ(m->bottleneck_after, 1.0 / 3);
}

TEST(SwarmBalance, BestBottleneck) {
  // 5 fast peers and 3 slow ones hold 6 units of speed: {1,1} {1,1} {1,1/3,1/3,1/3}.
  EXPECT_NEAR(best_bottleneck(layout(), kEqual), 2.0 / 3, 1e-12);
  EXPECT_EQ(best_bottleneck({{0, 0, 3}, {1, 0, 3}}, kEqual), 0);  // 2 peers, 3 stages
  // Beyond exhaustive search (16 equal peers on 4 stages): greedy, 4 per stage.
  std::vector<StagePeer> many;
  for (uint64_t i = 0; i < 16; ++i) many.push_back({i, 0, 1});
  EXPECT_DOUBLE_EQ(best_bottleneck(many, {1, 1, 1, 1}), 4);
}

TEST(SwarmBalance, RefusesWhatCannotBe) {
  EXPECT_THROW(stage_throughputs({{0, 3, 1}}, kEqual), Error);
  EXPECT_THROW(stage_throughputs({{0, -1, 1}}, kEqual), Error);
  EXPECT_THROW(stage_throughputs({{0, 0, -1}}, kEqual), Error);
  EXPECT_THROW(stage_throughputs({{0, 0, 1}}, {1, 0}), Error);
  EXPECT_THROW(stage_throughputs({}, {}), Error);
  EXPECT_THROW(plan_move(layout(), kEqual, -0.1), Error);
}

}  // namespace
}  // namespace agora
