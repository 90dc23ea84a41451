// swarm/simulation.h: a swarm on an event clock, with the real router and balancer.
#include "agora/swarm/simulation.h"

#include <gtest/gtest.h>

#include "agora/core/error.h"

namespace agora {
namespace {

SwarmSimOptions quiet() {
  SwarmSimOptions o;  // the layout: 3 stages of 1x / 1x / 3x slower peers
  o.kill_every = 0;
  o.sim_seconds = 1200;
  return o;
}

TEST(SwarmSim, SameOptionsSameNumbers) {
  SwarmSimOptions o;
  o.rebalance_seconds = 120;
  o.uniform = false;
  o.sim_seconds = 900;
  const SwarmSimSummary a = run_swarm_sim(o), b = run_swarm_sim(o);
  EXPECT_EQ(a.micro_batches, b.micro_batches);
  EXPECT_EQ(a.lost, b.lost);
  EXPECT_EQ(a.retries, b.retries);
  EXPECT_EQ(a.moves, b.moves);
  ASSERT_EQ(a.windows.size(), b.windows.size());
  for (size_t i = 0; i < a.windows.size(); ++i) {
    EXPECT_EQ(a.windows[i].samples_per_second, b.windows[i].samples_per_second);
  }
  o.seed = 2;
  EXPECT_NE(run_swarm_sim(o).micro_batches, a.micro_batches);
}

TEST(SwarmSim, EqualPeersReachTheIdeal) {
  SwarmSimOptions o = quiet();
  o.speeds = {{1, 1}, {1, 1}, {1, 1}};
  o.jitter = 0;
  const SwarmSimSummary s = run_swarm_sim(o);
  // Each stage serves 2 / 3 samples per second. Short of that: the pipeline's fill (one
  // micro-batch's forward and backward through 3 stages, 9 * micro_batch seconds), and the
  // micro-batches still in flight at the end (4 per peer), which count for nothing.
  EXPECT_NEAR(s.ideal, 2.0 / 3, 1e-9);
  const double fill = 9.0 * static_cast<double>(o.micro_batch) / o.sim_seconds;
  const double unfinished = 4.0 * 6 * static_cast<double>(o.micro_batch) / (s.ideal * o.sim_seconds);
  EXPECT_GT(s.efficiency, 1 - 2 * fill - unfinished);
  EXPECT_LE(s.efficiency, 1.0 + 1e-9);
  EXPECT_EQ(s.lost, 0);
}

TEST(SwarmSim, RoutingByThroughputBeatsUniform) {
  SwarmSimOptions o = quiet();
  const SwarmSimSummary by_throughput = run_swarm_sim(o);
  o.uniform = true;
  const SwarmSimSummary uniform = run_swarm_sim(o);
  // Uniform routing gives a slow replica as much as a fast one, so the slow ones set the pace
  // of their stages: stage 1 then serves 2 / 9 samples/s instead of 4 / 9.
  EXPECT_NEAR(by_throughput.ideal, 4.0 / 9, 1e-9);
  EXPECT_GT(by_throughput.efficiency, 0.9);
  EXPECT_LT(uniform.samples_per_second, 0.7 * by_throughput.samples_per_second);
}

TEST(SwarmSim, RebalancingMovesPeersToTheBottleneck) {
  SwarmSimOptions o = quiet();
  const SwarmSimSummary fixed = run_swarm_sim(o);
  o.rebalance_seconds = 120;
  const SwarmSimSummary balanced = run_swarm_sim(o);
  EXPECT_GE(balanced.moves, 1);
  EXPECT_EQ(balanced.stage_peers, (std::vector<int64_t>{2, 4, 2}));  // the slow ones on stage 1
  EXPECT_GT(balanced.samples_per_second, 1.1 * fixed.samples_per_second);
  // The last windows run at the moved swarm's bottleneck, not the first layout's.
  EXPECT_GT(balanced.windows.back().ideal, balanced.initial_bottleneck);
  EXPECT_LE(balanced.windows.back().ideal, balanced.best_bottleneck + 1e-12);
}

TEST(SwarmSim, KillsCostComputeNotMicroBatchesAndAnEmptyStageWaits) {
  SwarmSimOptions o;
  o.speeds = {{1}, {1}};
  o.kill_every = 300;
  o.restart_seconds = 10;
  o.join_seconds = 5;
  o.sim_seconds = 590;
  o.window_seconds = 10;
  const SwarmSimSummary s = run_swarm_sim(o);
  EXPECT_EQ(s.kills, 1);
  // Whichever peer died, the one before it (or the source) held the inputs of what it held:
  // those micro-batches were sent again or recomputed, none lost.
  EXPECT_EQ(s.lost, 0);
  EXPECT_GT(s.retries + s.recomputed, 0);
  // While the killed peer's stage has nobody, nothing finishes and the ideal is 0; after it
  // loads the parameters again the swarm runs at its full pace again.
  const SwarmSimWindow& down = s.windows[30];  // (300, 310]
  EXPECT_EQ(down.ideal, 0);
  EXPECT_GT(s.windows.back().samples_per_second, 0.8 * s.windows.back().ideal);
  EXPECT_GT(s.windows.back().ideal, 0);
}

TEST(SwarmSim, RunsOnUnderAKillEveryMinute) {
  SwarmSimOptions o;
  o.rebalance_seconds = 120;
  o.sim_seconds = 1800;
  const SwarmSimSummary s = run_swarm_sim(o);
  EXPECT_EQ(s.kills, 30);
  // The ideal counts only the peers serving at each moment; what the kills cost beyond that is
  // the work redone and the time senders take to notice. The goal: 90% of the ideal.
  EXPECT_GE(s.efficiency, 0.9);
  int64_t peers = 0;
  for (int64_t n : s.stage_peers) peers += n;
  EXPECT_GE(peers, 7);  // at most one peer is down or loading at the end
}

TEST(SwarmSim, RefusesBadOptions) {
  auto refused = [](auto change) {
    SwarmSimOptions o;
    change(o);
    EXPECT_THROW(run_swarm_sim(o), Error);
  };
  refused([](SwarmSimOptions& o) { o.speeds = {}; });
  refused([](SwarmSimOptions& o) { o.speeds = {{1}, {}}; });
  refused([](SwarmSimOptions& o) { o.speeds = {{1}, {0}}; });
  refused([](SwarmSimOptions& o) { o.costs = {1, 1}; });
  refused([](SwarmSimOptions& o) { o.costs = {1, 0, 1}; });
  refused([](SwarmSimOptions& o) { o.kill_every = -1; });
  refused([](SwarmSimOptions& o) { o.jitter = 1; });
  refused([](SwarmSimOptions& o) { o.micro_batch = 0; });
  refused([](SwarmSimOptions& o) { o.sim_seconds = 0; });
}

}  // namespace
}  // namespace agora
