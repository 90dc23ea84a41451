// swarm/schedule.h, "Deadlines and strikes" and hash votes (issue 38, findings 2, 4 and 6): no
// member stalls a step, takes a stage over with a vote, or makes the coordinator keep what is not
// its stage's contribution. On a hand-driven clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "agora/core/hex.h"
#include "agora/swarm/schedule.h"
#include "swarm_schedule_support.h"

namespace agora {
namespace {

using namespace swarm_test;

int64_t count_events(const std::vector<nlohmann::json>& events, const char* name) {
  return std::count_if(events.begin(), events.end(),
                       [&](const nlohmann::json& e) { return e["event"] == name; });
}

// Issue 38, finding 2: a stage-0 member that asked for micro-batches and never reported them
// held the step open for good (they went back to the pool only when it was lost for silence,
// and it kept polling). Now what it holds past the hold deadline goes to the others, it is
// struck, and max_strikes strikes ban it.
TEST(SwarmSchedule, AHolderPastTheDeadlineLosesItsMicroBatchesAndIsStruck) {
  SwarmScheduleOptions o = options(2, 4);
  o.min_deadline = 1;
  o.deadline_factor = 2;
  o.max_strikes = 2;
  o.steps = 5;
  SwarmSchedule s(o);
  start(s, {0, 0, 1});
  s.take_events();
  double t = 1;
  for (uint64_t step = 0; step < 2; ++step) {
    // Peer 0 (the holder) takes all it may; peer 1 polls on and finishes one at a time.
    SwarmReport holder = ready(0, step);
    holder.wants = 3;
    const SwarmAnswer held = s.poll(key(0), holder, t);
    EXPECT_EQ(held.micro_batches.size(), 3u);
    SwarmReport honest = ready(0, step);
    honest.wants = 1;
    for (int i = 0; i < 60 && s.step() == step; ++i) {
      t += 0.1;
      const SwarmAnswer a = s.poll(key(1), honest, t);
      honest.done.clear();
      for (uint32_t j : a.micro_batches) honest.done.emplace_back(j, 4.0f);
      holder.wants = 0;
      s.poll(key(0), holder, t);  // keeps polling, never done: never lost for silence
      s.poll(key(2), ready(1, step), t);
      s.tick(t);
      if (s.phase() == SwarmPhase::kSyncing) {
        for (int p = 0; p < 3; ++p) {
          SwarmReport r = ready(p < 2 ? 0 : 1, step);
          r.payload = "x";
          s.poll(key(p), r, t);
        }
      }
    }
    ASSERT_EQ(s.step(), step + 1) << "the holder stalled step " << step;
    // Each step waits the hold deadline (the honest peer's 0.1 s times 2, at least 1 s) past
    // the hand-out, not more.
    EXPECT_DOUBLE_EQ(s.hold_deadline(), 1.0);
    for (int p = 0; p < 3; ++p) s.poll(key(p), ready(p < 2 ? 0 : 1, step + 1), t);
  }
  const std::vector<nlohmann::json> events = s.take_events();
  EXPECT_EQ(count_events(events, "swarm_struck"), 2);
  EXPECT_EQ(count_events(events, "swarm_banned"), 1);
  for (const nlohmann::json& e : events) {
    if (e["event"] == "swarm_struck") {
      EXPECT_EQ(e["peer"], hex_encode(key(0)).substr(0, 8)) << e;  // never the honest one
    }
  }
  EXPECT_FALSE(s.knows(key(0)));
  EXPECT_TRUE(s.banned(key(0)));
  EXPECT_EQ(s.take_banned(), std::vector<std::string>{key(0)});
  EXPECT_NE(s.hello(key(0), endpoint(0), 0, t + 100).refused.find("banned"), std::string::npos);
  EXPECT_EQ(s.summary(t)["banned"], 1);
}

// An honest replica whose micro-batch was lost on the way (it resends after its own timeout)
// loses that micro-batch to the others at the deadline but, having finished others meanwhile,
// is not struck.
TEST(SwarmSchedule, AHolderThatFinishesOthersIsNotStruck) {
  SwarmScheduleOptions o = options(2, 8);
  o.min_deadline = 1;
  o.deadline_factor = 2;
  o.max_hold = 2;
  SwarmSchedule s(o);
  start(s, {0, 1});
  s.take_events();
  SwarmReport r = ready(0, 0);
  r.wants = 2;
  const SwarmAnswer first = s.poll(key(0), r, 1);
  ASSERT_EQ(first.micro_batches.size(), 2u);
  double t = 1;  // first.micro_batches[0] is lost on the way: never reported
  std::vector<uint32_t> mine = {first.micro_batches[1]};
  for (int i = 0; i < 40 && s.phase() == SwarmPhase::kTraining; ++i) {
    t += 0.25;
    r.done.clear();
    for (uint32_t j : mine) r.done.emplace_back(j, 3.0f);
    r.wants = 1;
    const SwarmAnswer a = s.poll(key(0), r, t);
    // What it is handed it finishes, `stuck` too once handed back after the deadline.
    mine.assign(a.micro_batches.begin(), a.micro_batches.end());
    s.poll(key(1), ready(1, 0), t);
    s.tick(t);
  }
  EXPECT_EQ(s.phase(), SwarmPhase::kSyncing);
  EXPECT_EQ(count_events(s.take_events(), "swarm_struck"), 0);
}

// Finding 2, the round: a ready replica that never sends its contribution held the step open.
TEST(SwarmSchedule, AReplicaSilentInTheRoundIsDroppedAtTheDeadlineAndStruck) {
  SwarmScheduleOptions o = options();
  o.min_deadline = 1;
  o.deadline_factor = 3;
  SwarmSchedule s(o);
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  ASSERT_EQ(s.phase(), SwarmPhase::kSyncing);
  EXPECT_DOUBLE_EQ(s.round_deadline(), 3.0);  // nothing measured: min_deadline x factor
  for (int p : {0, 1}) {
    SwarmReport r = ready(p == 0 ? 0 : 1, 0);
    r.payload = "c" + std::to_string(p);
    s.poll(key(p), r, 1.5);
  }
  for (double t = 1.5; t < 3.9; t += 0.5) {
    s.poll(key(2), ready(1, 0), t);  // polls, never contributes
    s.tick(t);
  }
  EXPECT_EQ(s.step(), 0u);
  s.poll(key(2), ready(1, 0), 4.1);
  s.tick(4.1);
  EXPECT_EQ(s.step(), 1u);
  const std::vector<nlohmann::json> events = s.take_events();
  ASSERT_EQ(count_events(events, "swarm_struck"), 1);
  // Its contribution after the deadline is not taken: the round was stage 1's peer 1 alone.
  const SwarmAnswer a = s.poll(key(1), ready(1, 0), 4.2);
  ASSERT_EQ(a.round.size(), 1u);
  EXPECT_EQ(a.round[0].first, key(1));
  // Measured now: the next round's deadline is factor x the lower median delay (0.5 s), at
  // least min_deadline.
  EXPECT_DOUBLE_EQ(s.round_deadline(), 1.5);
}

// Finding 6: contributions were stored and relayed unchecked. One the check refuses is struck
// and leaves the round, which completes without it.
TEST(SwarmSchedule, ARefusedContributionIsStruckAndLeavesTheRound) {
  SwarmScheduleOptions o = options();
  o.check_contribution = [](int64_t, uint64_t, const std::string& payload) -> std::string {
    return payload.size() == 4 ? "" : "not 4 bytes";
  };
  SwarmSchedule s(o);
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  auto send = [&](int p, int64_t stage, const std::string& payload) {
    SwarmReport r = ready(stage, 0);
    r.payload = payload;
    return s.poll(key(p), r, 2);
  };
  send(0, 0, "good");
  send(2, 1, std::string(1 << 20, 'x'));
  send(2, 1, "good");  // one try per round: it left it
  EXPECT_EQ(s.step(), 0u);
  send(1, 1, "fine");
  EXPECT_EQ(s.step(), 1u);
  const SwarmAnswer a = s.poll(key(2), ready(1, 0), 3);
  ASSERT_EQ(a.round.size(), 1u);
  EXPECT_EQ(a.round[0], std::make_pair(key(1), std::string("fine")));
  const std::vector<nlohmann::json> events = s.take_events();
  ASSERT_EQ(count_events(events, "swarm_struck"), 1);
}

// Finding 4: a tie between two hashes went to the smaller, so in a stage of two one member
// decided which replica refetched (from it). Now a tie outvotes nobody and names no source.
TEST(SwarmSchedule, ATiedHashVoteOutvotesNobodyAndNamesNoSource) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1});
  // Peers 1 and 2 of stage 1 disagree; the smaller hash is hash(0), which peer 1 holds.
  s.poll(key(2), ready(1, 0, hash(5)), 1);
  const SwarmAnswer a = s.poll(key(2), ready(1, 0, hash(5)), 1);
  EXPECT_TRUE(a.stage_hash.empty());
  EXPECT_FALSE(a.source.has_value());
  EXPECT_TRUE(s.poll(key(1), ready(1, 0, hash(0)), 1).stage_hash.empty());
  EXPECT_EQ(s.summary(1)["diverged"], 0);
  const SwarmAnswer joiner = s.hello(key(6), endpoint(6), 1, 1);
  EXPECT_FALSE(joiner.source.has_value());
  // Stage 0 still routes to both.
  EXPECT_EQ(s.poll(key(0), ready(0, 0), 1).next.size(), 2u);
  // A third replica that agrees with one side makes a strict majority: the other is outvoted.
  s.poll(key(6), ready(1, 0, hash(5)), 1.5);
  EXPECT_EQ(s.poll(key(6), ready(1, 0, hash(5)), 1.5).stage_hash, hash(5));
  EXPECT_EQ(s.summary(2)["diverged"], 1);
}

// The first replica of a stage to report the new step cannot name the stage's hash for the
// others still applying the round: they count toward the majority before they vote.
TEST(SwarmSchedule, TheFirstReplicaAtAStepDoesNotDecideItsHash) {
  SwarmSchedule s(options());
  start(s, {0, 1, 1});
  train_step(s, 0, 0, 1);
  contribute_all(s, {0, 1, 1}, 1);
  ASSERT_EQ(s.step(), 1u);
  s.poll(key(2), ready(1, 1, hash(7)), 2);  // first at step 1, with its own hash
  const SwarmAnswer behind = s.poll(key(1), ready(1, 0), 2);
  EXPECT_EQ(behind.round.size(), 2u);
  EXPECT_TRUE(behind.stage_hash.empty()) << "one vote of two named the stage's hash";
  EXPECT_TRUE(s.poll(key(1), ready(1, 1, hash(3)), 2.1).stage_hash.empty());
  EXPECT_EQ(s.summary(2.1)["diverged"], 0);
}

// Issue 38: a replica that dropped the micro-batches routed to it was skipped by its senders'
// routers but never struck, since only a sender sees a send time out. Now senders name it, and a
// strict majority of the previous stage (two at least) strikes it at the step's end; one sender
// alone, or a replica lost during the step, strikes nobody.
TEST(SwarmSchedule, AReplicaThatAMajorityOfItsSendersNameForDropsIsStruck) {
  SwarmScheduleOptions o = options();
  o.max_strikes = 5;
  SwarmSchedule s(o);
  const std::vector<int64_t> stages = {0, 0, 0, 1, 1, 1};
  start(s, stages);
  const auto name = [&](int sender, std::vector<std::string> dropped) {
    SwarmReport r = ready(0, 0);
    r.dropped = std::move(dropped);
    s.poll(key(sender), r, 0.5);
  };
  name(0, {key(4), key(3)});
  name(1, {key(4)});
  name(1, {key(4)});          // twice from one sender counts once
  name(2, {key(5), key(0)});  // key(0) is not of the next stage: ignored
  name(2, {key(3) + "x"});    // not a member: ignored
  train_step(s, 0, 0, 1);
  contribute_all(s, stages, 2);
  ASSERT_EQ(s.step(), 1u);
  std::vector<nlohmann::json> struck;
  for (const nlohmann::json& e : s.take_events()) {
    if (e["event"] == "swarm_struck") struck.push_back(e);
  }
  ASSERT_EQ(struck.size(), 1u) << nlohmann::json(struck).dump();
  EXPECT_EQ(struck[0]["peer"], hex_encode(key(4)).substr(0, 8));
  EXPECT_EQ(struck[0]["step"], 0);
  EXPECT_NE(struck[0]["why"].get<std::string>().find("2 of the 3 replicas of stage 0"),
            std::string::npos);
}

TEST(SwarmSchedule, OneSenderOrALostReplicaIsNeverStruckForDrops) {
  {
    SwarmSchedule s(options());  // a stage 0 of one: its sender alone decides nothing
    start(s, {0, 1});
    SwarmReport r = ready(0, 0);
    r.dropped = {key(1)};
    s.poll(key(0), r, 0.5);
    train_step(s, 0, 0, 1);
    contribute_all(s, {0, 1}, 2);
    ASSERT_EQ(s.step(), 1u);
    EXPECT_EQ(count_events(s.take_events(), "swarm_struck"), 0);
  }
  SwarmSchedule s(options());  // two of two name it, but it was lost: its work went with it
  start(s, {0, 0, 1});
  for (int sender : {0, 1}) {
    SwarmReport r = ready(0, 0);
    r.dropped = {key(2)};
    s.poll(key(sender), r, 0.5);
  }
  for (int sender : {0, 1}) s.poll(key(sender), ready(0, 0), 5.5);
  s.tick(5.6);  // key(2) silent for the peer timeout
  ASSERT_FALSE(s.knows(key(2)));
  ASSERT_TRUE(s.hello(key(2), endpoint(2), 1, 5.7).refused.empty());
  s.poll(key(2), ready(1, 0), 5.7);
  s.tick(5.7);
  train_step(s, 0, 0, 6);
  contribute_all(s, {0, 0, 1}, 6.5);
  ASSERT_EQ(s.step(), 1u);
  EXPECT_EQ(count_events(s.take_events(), "swarm_struck"), 0);
}

}  // namespace
}  // namespace agora
