// swarm/schedule.h: the swarm coordinator's decisions, on a hand-driven clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/swarm/schedule.h"
#include "swarm_schedule_support.h"

namespace agora {
namespace {

using namespace swarm_test;

TEST(SwarmSchedule, WaitsForEveryStageThenHandsOutMicroBatchesByRoom) {
  SwarmScheduleOptions o = options();
  o.start_peers = 2;
  SwarmSchedule s(o);
  s.hello(key(0), endpoint(0), 0, 0);
  s.poll(key(0), ready(0, 0), 0);
  s.tick(0);
  EXPECT_EQ(s.phase(), SwarmPhase::kWaiting);
  EXPECT_EQ(s.status(0)["waiting_for"], "stage 1 has no replica holding step 0");
  s.hello(key(1), endpoint(1), 1, 0);
  s.poll(key(1), ready(1, 0), 0);
  s.tick(0);
  EXPECT_EQ(s.phase(), SwarmPhase::kTraining);

  SwarmReport r = ready(0, 0);
  r.wants = 10;
  const SwarmAnswer a = s.poll(key(0), r, 1);
  EXPECT_EQ(a.micro_batches, (std::vector<uint32_t>{0, 1, 2}));  // max_hold
  ASSERT_EQ(a.next.size(), 1u);
  EXPECT_EQ(a.next[0].key, key(1));
  EXPECT_EQ(a.next[0].endpoint, endpoint(1));
  // Stage 1 hears which keys may send it forwards.
  const SwarmAnswer b = s.poll(key(1), ready(1, 0), 1);
  ASSERT_EQ(b.prev.size(), 1u);
  EXPECT_EQ(b.prev[0].key, key(0));
  EXPECT_TRUE(b.micro_batches.empty());  // only stage 0 is handed micro-batches
}

TEST(SwarmSchedule, CountsOnlyMicroBatchesAPeerHolds) {
  SwarmSchedule s(options());
  start(s, {0, 0, 1});
  SwarmReport r = ready(0, 0);
  r.wants = 2;
  const SwarmAnswer a = s.poll(key(0), r, 1);
  ASSERT_EQ(a.micro_batches.size(), 2u);
  // Peer 1 claims peer 0's micro-batches and ones never handed out: none counts.
  SwarmReport liar = ready(0, 0);
  liar.done = {{a.micro_batches[0], 1.0f}, {a.micro_batches[1], 1.0f}, {3, 1.0f}, {99, 1.0f}};
  s.poll(key(1), liar, 1);
  EXPECT_EQ(s.status(1)["done"], 0);
  EXPECT_EQ(s.status(1)["samples_done"], 0);
  // Peer 0 reports one twice: counted once.
  r.wants = 0;
  r.done = {{a.micro_batches[0], 1.0f}, {a.micro_batches[0], 1.0f}};
  s.poll(key(0), r, 2);
  EXPECT_EQ(s.status(2)["done"], 1);
  EXPECT_EQ(s.status(2)["samples_done"], 2);  // micro_batch_size
  EXPECT_EQ(s.status(2)["samples"], 0);       // of finished steps
}

TEST(SwarmSchedule, RoundCompletesWithEveryReadyReplicaAndIsHandedOutInKeyOrder) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  EXPECT_EQ(s.phase(), SwarmPhase::kSyncing);
  auto contribute = [&](int peer, int64_t stage, const std::string& payload) {
    SwarmReport r = ready(stage, 0);
    r.payload = payload;
    return s.poll(key(peer), r, 2);
  };
  contribute(2, 1, "from-2");
  contribute(0, 0, "from-0");
  EXPECT_EQ(s.phase(), SwarmPhase::kSyncing);  // peer 1 of stage 1 has not sent yet
  EXPECT_EQ(s.step(), 0u);
  const SwarmAnswer last = contribute(1, 1, "from-1");
  EXPECT_EQ(s.step(), 1u);
  EXPECT_EQ(s.phase(), SwarmPhase::kTraining);
  ASSERT_EQ(last.round.size(), 2u);  // its stage's, in key order
  EXPECT_EQ(last.round[0], std::make_pair(key(1), std::string("from-1")));
  EXPECT_EQ(last.round[1], std::make_pair(key(2), std::string("from-2")));
  EXPECT_EQ(last.round_step, 0u);
  // A replica that applied it (now at step 1) gets no round; one still at 0 gets its stage's.
  EXPECT_TRUE(s.poll(key(1), ready(1, 1, hash(1)), 3).round.empty());
  const SwarmAnswer behind = s.poll(key(0), ready(0, 0), 3);
  ASSERT_EQ(behind.round.size(), 1u);
  EXPECT_EQ(behind.round[0].second, "from-0");
  EXPECT_EQ(behind.previous_hash, hash(0));
}

TEST(SwarmSchedule, ALostPeerGivesBackItsMicroBatchesAndLeavesItsRound) {
  SwarmSchedule s(options());
  start(s, {0, 0, 1, 1});
  SwarmReport r = ready(0, 0);
  r.wants = 3;
  ASSERT_EQ(s.poll(key(0), r, 1).micro_batches.size(), 3u);
  const uint64_t epoch = s.epoch();
  for (int i = 1; i < 4; ++i) s.poll(key(i), ready(i < 2 ? 0 : 1, 0), 5.5);
  s.tick(6.5);  // peer 0 silent for 5.5 s > peer_timeout
  EXPECT_FALSE(s.knows(key(0)));
  EXPECT_EQ(s.epoch(), epoch + 1);
  EXPECT_EQ(s.status(6.5)["pool"], 4);
  train_step(s, 1, 0, 7);
  ASSERT_EQ(s.phase(), SwarmPhase::kSyncing);
  // Peer 3 dies before it contributes: the round goes on without it.
  SwarmReport p = ready(0, 0);
  p.payload = "p1";
  s.poll(key(1), p, 7);
  p = ready(1, 0);
  p.payload = "p2";
  s.poll(key(2), p, 11);
  s.poll(key(1), ready(0, 0), 11);
  s.tick(12.5);
  EXPECT_FALSE(s.knows(key(3)));
  EXPECT_EQ(s.step(), 1u);
}

TEST(SwarmSchedule, AStageWithNoReplicaWaitsUntilOneHoldsTheStepAgain) {
  SwarmSchedule s(options());
  start(s, {0, 1});
  train_step(s, 0, 0, 1);
  contribute_all(s, {0, 1}, 1);
  ASSERT_EQ(s.step(), 1u);
  s.poll(key(0), ready(0, 1, hash(2)), 2);
  s.poll(key(1), ready(1, 1, hash(3)), 2);
  s.poll(key(0), ready(0, 1, hash(2)), 7);
  s.tick(7.5);  // peer 1 silent since 2
  EXPECT_FALSE(s.knows(key(1)));
  EXPECT_EQ(s.phase(), SwarmPhase::kWaiting);
  const nlohmann::json st = s.status(7.5);
  EXPECT_EQ(st["waiting_for"], "stage 1 has no replica holding step 1");
  EXPECT_EQ(st["stages"][1]["state"], "no replica");
  // A joiner at the seeded start is not at step 1; nobody can be its source.
  SwarmAnswer a = s.hello(key(5), endpoint(5), 1, 8);
  EXPECT_FALSE(a.source.has_value());
  EXPECT_EQ(a.stage_hash, hash(3));  // what it must bring back
  s.poll(key(5), ready(1, 0, hash(9)), 8);
  s.tick(8);
  EXPECT_EQ(s.phase(), SwarmPhase::kWaiting);
  s.poll(key(5), ready(1, 1, hash(3)), 9);
  s.tick(9);
  EXPECT_EQ(s.phase(), SwarmPhase::kTraining);
  EXPECT_GT(s.summary(9)["waiting_seconds"].get<double>(), 0.0);
}

TEST(SwarmSchedule, AJoinerIsNamedAReadySourceOfItsStage) {
  SwarmSchedule s(options());
  start(s, {0, 1});
  train_step(s, 0, 0, 1);
  contribute_all(s, {0, 1}, 1);
  s.poll(key(1), ready(1, 1, hash(4)), 2);
  const SwarmAnswer a = s.hello(key(7), endpoint(7), 1, 2);
  ASSERT_TRUE(a.source.has_value());
  EXPECT_EQ(a.source->key, key(1));
  EXPECT_EQ(a.stage_hash, hash(4));
  // A joiner that asks for no stage goes where the throughput is least: stage 0 has one
  // replica, stage 1 two.
  EXPECT_EQ(s.hello(key(8), endpoint(8), -1, 2).stage, 0);
}

TEST(SwarmSchedule, AnOutvotedHashIsNotReady) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1, 1});
  s.poll(key(3), ready(1, 0, hash(6)), 1);  // two of three say hash(0)
  const SwarmAnswer a = s.poll(key(3), ready(1, 0, hash(6)), 1);
  EXPECT_EQ(a.stage_hash, hash(0));
  ASSERT_TRUE(a.source.has_value());  // it must fetch the stage again
  EXPECT_GE(s.summary(1)["diverged"].get<int64_t>(), 1);
  // Stage 0 routes to the two that agree only.
  SwarmReport r = ready(0, 0);
  const SwarmAnswer origin = s.poll(key(0), r, 1);
  ASSERT_EQ(origin.next.size(), 2u);
  EXPECT_EQ(origin.next[0].key, key(1));
  EXPECT_EQ(origin.next[1].key, key(2));
}

TEST(SwarmSchedule, RebalancingMovesAPeerToTheBottleneck) {
  SwarmScheduleOptions o = options();
  o.rebalance_seconds = 10;
  SwarmSchedule s(o);
  start(s, {0, 0, 0, 1});
  // Stage 0: three replicas at 1 s per sample; stage 1: one at 1 s. Bottleneck 1 -> 1.5.
  for (int i = 0; i < 4; ++i) {
    SwarmReport r = ready(i < 3 ? 0 : 1, 0);
    r.seconds_per_sample = 1;
    s.poll(key(i), r, 11);
  }
  train_step(s, 0, 0, 11);
  contribute_all(s, {0, 0, 0, 1}, 12);
  ASSERT_EQ(s.step(), 1u);
  EXPECT_EQ(s.summary(12)["moves"], 1);
  int moved = -1;
  for (int i = 0; i < 3; ++i) {
    if (s.poll(key(i), ready(0, 0), 12).stage == 1) moved = i;
  }
  ASSERT_GE(moved, 0);
  // The moved peer is not ready on its new stage: it gets stage 1's source once that replica
  // has applied the round.
  s.poll(key(3), ready(1, 1, hash(5)), 13);
  SwarmReport loading = ready(0, 0);  // still reports its old stage
  const SwarmAnswer a = s.poll(key(moved), loading, 13);
  EXPECT_EQ(a.stage, 1);
  ASSERT_TRUE(a.source.has_value());
  EXPECT_EQ(a.source->key, key(3));
}

TEST(SwarmSchedule, RefusesWhatItCannotServe) {
  SwarmScheduleOptions o = options();
  o.max_members = 2;
  SwarmSchedule s(o);
  EXPECT_NE(s.hello(key(0), endpoint(0), 2, 0).refused.find("stage 2 does not exist"),
            std::string::npos);
  EXPECT_NE(s.hello(key(0), "ipc:///tmp/x", 0, 0).refused.find("tcp://"), std::string::npos);
  EXPECT_TRUE(s.hello(key(0), endpoint(0), 0, 0).refused.empty());
  EXPECT_TRUE(s.hello(key(1), endpoint(1), 1, 0).refused.empty());
  EXPECT_NE(s.hello(key(2), endpoint(2), 1, 0).refused.find("full"), std::string::npos);
  EXPECT_NE(s.poll(key(9), ready(0, 0), 0).refused.find("hello"), std::string::npos);
  // A hello from a known key, a peer timeout after its last, is a restart: the old one is lost,
  // the new one joins.
  EXPECT_TRUE(s.hello(key(1), endpoint(3), 1, o.peer_timeout).refused.empty());
  EXPECT_EQ(s.summary(o.peer_timeout)["lost"], 1);
  SwarmScheduleOptions bad = options();
  bad.micro_batches = 0;
  EXPECT_THROW(SwarmSchedule{bad}, Error);
  bad = options();
  bad.costs = {1};
  EXPECT_THROW(SwarmSchedule{bad}, Error);
}

// Saves `s` as the coordinator does and restores it into a fresh schedule `down` seconds later.
SwarmSchedule restarted(SwarmSchedule& s, double now, double down,
                        std::vector<SwarmSchedule::Contribution>& kept,
                        const SwarmScheduleOptions& o = options()) {
  for (auto& c : s.take_contributions()) kept.push_back(std::move(c));
  SwarmSchedule r(o);
  r.restore(s.durable(now), kept, now + down, down);
  return r;
}

TEST(SwarmSchedule, ARestartGoesOnFromTheSaveAndGivesBackWhatWasOut) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  contribute_all(s, {0, 1, 1}, 2);
  ASSERT_EQ(s.step(), 1u);
  SwarmReport r = ready(0, 1, hash(1));
  r.wants = 3;
  ASSERT_EQ(s.poll(key(0), r, 3).micro_batches, (std::vector<uint32_t>{0, 1, 2}));
  r.wants = 0;
  r.done = {{0, 4.0f}, {1, 4.0f}};
  s.poll(key(0), r, 3);
  s.take_events();
  std::vector<SwarmSchedule::Contribution> kept;
  SwarmSchedule t = restarted(s, 4, 10, kept);
  EXPECT_DOUBLE_EQ(t.summary(14)["seconds"].get<double>(), s.summary(4)["seconds"].get<double>());
  EXPECT_EQ(t.step(), 1u);
  EXPECT_EQ(t.member_keys(), s.member_keys());
  const nlohmann::json status = t.status(14);
  EXPECT_EQ(status["done"], 2);
  EXPECT_EQ(status["pool"], 2);  // 3 never reported back before the save, and 2 that was out
  EXPECT_EQ(t.summary(14)["restarts"], 1);
  EXPECT_GE(t.summary(14)["waiting_seconds"].get<double>(), 10.0);
  const std::vector<nlohmann::json> events = t.take_events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["event"], "swarm_restored");
  // A replica still at step 0 gets the completed round, as before the restart.
  const SwarmAnswer behind = t.poll(key(2), ready(1, 0), 14);
  ASSERT_EQ(behind.round.size(), 2u);
  EXPECT_EQ(behind.round[0], std::make_pair(key(1), std::string("x1")));
  EXPECT_EQ(behind.round[1], std::make_pair(key(2), std::string("x2")));
  // Stage 0 reports again: micro-batch 2, given out before, is not its to report now.
  t.poll(key(1), ready(1, 1, hash(1)), 14);
  t.poll(key(0), ready(0, 1, hash(1)), 14);
  t.tick(14);
  ASSERT_EQ(t.phase(), SwarmPhase::kTraining);
  r.done = {{2, 4.0f}};
  r.wants = 4;
  const SwarmAnswer again = t.poll(key(0), r, 14);
  EXPECT_EQ(again.micro_batches, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(t.status(14)["done"], 2);
  // Another shape of run does not restore.
  std::vector<SwarmSchedule::Contribution> none;
  EXPECT_THROW(restarted(s, 4, 0, none, options(3)), Error);
}

TEST(SwarmSchedule, ARestartInTheRoundKeepsTheContributionsThatCame) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  auto contribute = [](SwarmSchedule& x, int peer, int64_t stage, const std::string& payload) {
    SwarmReport r = ready(stage, 0);
    r.payload = payload;
    return x.poll(key(peer), r, 2);
  };
  contribute(s, 2, 1, "from-2");
  contribute(s, 0, 0, "from-0");
  std::vector<SwarmSchedule::Contribution> kept;
  SwarmSchedule t = restarted(s, 2, 1, kept);
  ASSERT_EQ(t.phase(), SwarmPhase::kSyncing);
  // The two that came are not asked for again: a repeat changes nothing, the last completes.
  contribute(t, 2, 1, "again");
  EXPECT_EQ(t.step(), 0u);
  const SwarmAnswer last = contribute(t, 1, 1, "from-1");
  EXPECT_EQ(t.step(), 1u);
  ASSERT_EQ(last.round.size(), 2u);
  EXPECT_EQ(last.round[1], std::make_pair(key(2), std::string("from-2")));
  // Only the contribution that came after the restart is new for the store.
  const auto arrived = t.take_contributions();
  ASSERT_EQ(arrived.size(), 1u);
  EXPECT_EQ(arrived[0].key, key(1));
}

// Issue 38, finding 10: every hello from a known key was a restart, so a member sending hellos
// at its rate limit lost itself, bumped the epoch (stage 0 sent again all it had in flight) and
// logged a loss and a join, each time.
TEST(SwarmSchedule, AHelloAgainWithinAPeerTimeoutIsNoRestart) {
  const SwarmScheduleOptions o = options();
  SwarmSchedule s(o);
  ASSERT_TRUE(s.hello(key(0), endpoint(0), 0, 0).refused.empty());
  ASSERT_TRUE(s.hello(key(1), endpoint(1), 1, 0).refused.empty());
  s.take_events();
  const uint64_t epoch = s.epoch();
  for (int i = 1; i <= 1000; ++i) {
    const double t = 0.001 * i;
    ASSERT_TRUE(s.hello(key(1), endpoint(1), i % 2 == 0 ? 1 : -1, t).refused.empty()) << i;
  }
  EXPECT_EQ(s.epoch(), epoch);
  EXPECT_EQ(s.summary(1)["lost"], 0);
  for (const nlohmann::json& e : s.take_events()) {
    EXPECT_NE(e["event"], "swarm_lost") << e;
    EXPECT_NE(e["event"], "swarm_join") << e;
  }
  // Meanwhile another endpoint or stage is refused, and named.
  const std::string moved = s.hello(key(1), endpoint(5), 1, 1.5).refused;
  EXPECT_NE(moved.find("another endpoint or stage"), std::string::npos) << moved;
  EXPECT_FALSE(s.hello(key(1), endpoint(1), 0, 1.5).refused.empty());
  // A peer timeout after its last hello, a hello is a restart again.
  EXPECT_TRUE(s.hello(key(1), endpoint(5), 1, 1 + o.peer_timeout).refused.empty());
  EXPECT_EQ(s.summary(1 + o.peer_timeout)["lost"], 1);
  EXPECT_EQ(s.epoch(), epoch + 1);
}

TEST(SwarmSchedule, FinishesAfterTheLastStep) {
  SwarmScheduleOptions o = options();
  o.steps = 1;
  SwarmSchedule s(o);
  start(s, {0, 1});
  train_step(s, 0, 0, 1);
  contribute_all(s, {0, 1}, 2);
  EXPECT_EQ(s.phase(), SwarmPhase::kFinished);
  const std::vector<nlohmann::json> events = s.take_events();
  const auto summary = std::find_if(events.begin(), events.end(), [](const nlohmann::json& e) {
    return e["event"] == "swarm_summary";
  });
  ASSERT_NE(summary, events.end());
  EXPECT_EQ((*summary)["samples"], 8);
  EXPECT_DOUBLE_EQ((*summary)["seconds"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ((*summary)["samples_per_second"].get<double>(), 4.0);
  // The replica still at step 0 gets the round; peers that then go silent are not lost.
  EXPECT_EQ(s.poll(key(1), ready(1, 0), 3).round.size(), 1u);
  s.tick(60);
  EXPECT_EQ(s.summary(60)["lost"], 0);
}

}  // namespace
}  // namespace agora
