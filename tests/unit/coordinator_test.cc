// The coordinator's state machine, transition by transition: joins, phases, the batch split,
// silence, leaving, pausing and finishing (commits, finalization, hashes and recovery are in
// coordinator_rounds_test.cc). Time is the `now` each call passes; nothing sleeps or reads a clock.
#include <algorithm>
#include <limits>

#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

// ---- join --------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, JoinIsWelcomedWithTheRunAndTheInitialState) {
  make();
  Actions a = handle(0, join_msg(ids_[0]), kT0);
  auto welcome = sent(a, key(0), Body::kWelcome);
  ASSERT_EQ(welcome.size(), 1u);
  const wire::Welcome& w = welcome[0].welcome();
  EXPECT_EQ(w.run_id(), options_.run_id);
  EXPECT_EQ(w.run_config_toml(), options_.run_config_toml);
  EXPECT_EQ(w.finalized_steps(), 0u);
  EXPECT_EQ(w.state().applied_steps(), 0u);
  EXPECT_TRUE(w.state().state_hash().empty());
  EXPECT_TRUE(w.checkpointer());
  EXPECT_EQ(member(0).state, MemberState::kActive);  // nothing final: caught up already
  EXPECT_EQ(member(0).endpoint, endpoint_of(ids_[0]));
  EXPECT_TRUE(logged(a, "joined"));
  // One checkpointer is enough.
  a = handle(1, join_msg(ids_[1]), kT0);
  EXPECT_FALSE(sent(a, key(1), Body::kWelcome).at(0).welcome().checkpointer());
  EXPECT_EQ(state().counters.joins, 2u);
}

TEST_F(CoordinatorTest, JoinWithAnotherKeyIsRefused) {
  make();
  Actions a = sm_->handle(key(1), join_msg(ids_[0]), kT0);
  auto refused = sent(a, key(1), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].refused().reason().find("authenticated " + net::key_to_hex(key(1))),
            std::string::npos)
      << refused[0].refused().reason();
  EXPECT_TRUE(state().members.empty());
}

TEST_F(CoordinatorTest, JoinOutsideTheAllowlistIsRefused) {
  options_.allowlist = {key(0)};
  make();
  EXPECT_EQ(sent(handle(0, join_msg(ids_[0]), kT0), key(0), Body::kWelcome).size(), 1u);
  auto refused = sent(handle(1, join_msg(ids_[1]), kT0), key(1), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].refused().reason().find(net::key_to_hex(key(1))), std::string::npos);
  EXPECT_NE(refused[0].refused().reason().find("allowlist"), std::string::npos);
  EXPECT_FALSE(state().members.contains(key(1)));
}

TEST_F(CoordinatorTest, JoinWithABadEndpointIsRefused) {
  make();
  for (const char* endpoint : {"", "127.0.0.1:7500", "tcp://:7500", "tcp://host", "tcp://host:0",
                               "tcp://host:70000", "tcp://host:12ab", "udp://host:1"}) {
    auto refused = sent(handle(0, join_msg(ids_[0], 0, endpoint), kT0), key(0), Body::kRefused);
    ASSERT_EQ(refused.size(), 1u) << endpoint;
    EXPECT_NE(refused[0].refused().reason().find("tcp://host:port"), std::string::npos);
  }
  EXPECT_TRUE(state().members.empty());
  EXPECT_EQ(
      sent(handle(0, join_msg(ids_[0], 0, "tcp://[::1]:9"), kT0), key(0), Body::kWelcome).size(),
      1u);
}

TEST_F(CoordinatorTest, MessagesBeforeJoiningAreRefused) {
  make();
  auto refused = sent(handle(0, heartbeat_msg(0, 0), kT0), key(0), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].refused().reason().find("join first"), std::string::npos);
  EXPECT_EQ(state().counters.refusals, 1u);
}

// ---- phases ------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, WaitsForPeersThenWarmsUpThenTrains) {
  make();
  handle(0, join_msg(ids_[0]), kT0);
  EXPECT_EQ(state().phase, Phase::kWaitingForPeers);
  handle(1, join_msg(ids_[1]), kT0 + 1);
  EXPECT_EQ(state().phase, Phase::kWarmup);
  EXPECT_EQ(state().phase_since, kT0 + 1);
  // A third joins during the warmup, which is what the warmup is for.
  handle(2, join_msg(ids_[2]), kT0 + 2);
  Actions early = sm_->tick(kT0 + 2.9);
  EXPECT_EQ(state().phase, Phase::kWarmup);
  EXPECT_TRUE(early.send.empty());
  Actions a = sm_->tick(kT0 + 3.0);
  EXPECT_EQ(state().phase, Phase::kTraining);
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 0u);
  for (int i = 0; i < 3; ++i) {
    auto start = sent(a, key(i), Body::kRoundStart);
    ASSERT_EQ(start.size(), 1u);
    EXPECT_EQ(start[0].round_start().step(), 0u);
    EXPECT_EQ(start[0].round_start().apply_through(), 0u);
    EXPECT_TRUE(start[0].round_start().report_state());  // 0 % hash_interval == 0
    EXPECT_EQ(start[0].round_start().members_size(), 3);
    EXPECT_EQ(count_of(start[0].round_start()), 4u);
  }
}

TEST_F(CoordinatorTest, WarmupFallsBackWhenAMemberLeaves) {
  make();
  handle(0, join_msg(ids_[0]), kT0);
  handle(1, join_msg(ids_[1]), kT0);
  EXPECT_EQ(state().phase, Phase::kWarmup);
  handle(1, leave_msg(), kT0 + 1);
  EXPECT_EQ(member(1).state, MemberState::kLeft);
  EXPECT_EQ(state().phase, Phase::kWaitingForPeers);
  sm_->tick(kT0 + 10);
  EXPECT_FALSE(state().round.has_value());
  // The member comes back; the warmup starts over.
  handle(1, join_msg(ids_[1]), kT0 + 11);
  EXPECT_EQ(state().phase, Phase::kWarmup);
  sm_->tick(kT0 + 12);
  EXPECT_EQ(state().phase, Phase::kWarmup);
  sm_->tick(kT0 + 13);
  EXPECT_EQ(state().phase, Phase::kTraining);
}

// ---- assignment --------------------------------------------------------------------------------

TEST_F(CoordinatorTest, SplitFollowsThroughputAndCoversTheBatchOnce) {
  options_.batch_size = 70;
  make();
  handle(0, join_msg(ids_[0], 30.0), kT0);
  handle(1, join_msg(ids_[1], 30.0), kT0);
  handle(2, join_msg(ids_[2], 10.0), kT0);  // three times slower
  Actions a = sm_->tick(kT0 + 2);
  std::vector<uint64_t> counts;
  std::set<uint64_t> seen;
  for (int i = 0; i < 3; ++i) {
    const wire::RoundStart start = sent(a, key(i), Body::kRoundStart).at(0).round_start();
    counts.push_back(count_of(start));
    for (const SequenceRange& r : ranges_of(start)) {
      for (uint64_t q = r.first; q < r.first + r.count; ++q)
        EXPECT_TRUE(seen.insert(q).second) << q;
    }
    // deadline: max(10, 3 x the slowest, 30 / 30 = 1 s or 10 / 10 = 1 s) = 10 s
    EXPECT_DOUBLE_EQ(start.deadline_seconds(), 10.0);
  }
  EXPECT_EQ(counts, (std::vector<uint64_t>{30, 30, 10}));
  EXPECT_EQ(seen.size(), 70u);
  EXPECT_EQ(*seen.rbegin(), 69u);
  EXPECT_EQ(state().queue.next_fresh, 70u);
}

TEST_F(CoordinatorTest, DeadlineStretchesWithTheSlowestMember) {
  options_.batch_size = 100;
  make();
  handle(0, join_msg(ids_[0], 2.0), kT0);
  handle(1, join_msg(ids_[1], 2.0), kT0);
  Actions a = sm_->tick(kT0 + 2);
  // 50 sequences at 2 per second = 25 s, x3 = 75 s.
  EXPECT_DOUBLE_EQ(sent(a, key(0), Body::kRoundStart).at(0).round_start().deadline_seconds(), 75.0);
  EXPECT_DOUBLE_EQ(state().round->deadline, kT0 + 2 + 75.0);
}

TEST(CoordinatorAssignmentTest, SharesSumToTheTotal) {
  EXPECT_EQ(fastest_shares(10, {1, 1, 1}), (std::vector<uint64_t>{4, 3, 3}));
  EXPECT_EQ(fastest_shares(7, {3, 3, 1}), (std::vector<uint64_t>{3, 3, 1}));
  EXPECT_EQ(fastest_shares(2, {1, 1, 1, 1}), (std::vector<uint64_t>{1, 1, 0, 0}));
  EXPECT_EQ(fastest_shares(0, {1, 2}), (std::vector<uint64_t>{0, 0}));
  for (uint64_t total : {1u, 13u, 97u, 1000u}) {
    auto s = fastest_shares(total, {0.3, 7.1, 2.2, 1e-3});
    uint64_t sum = 0;
    for (uint64_t v : s) sum += v;
    EXPECT_EQ(sum, total);
  }
  EXPECT_THROW(fastest_shares(3, {}), Error);
  EXPECT_THROW(fastest_shares(3, {1.0, 0.0}), Error);
}

TEST(CoordinatorAssignmentTest, TheSlowMemberIsNotRoundedUpPastTheRoundsLength) {
  // Quotas 5.9 and 3 x 40.7: largest remainders would give the slow member 6 (6 / 5.9 = 1.017 s)
  // and two others 41; the shortest round gives the three fast ones 41 (1.007 s) and it 5.
  EXPECT_EQ(fastest_shares(128, {5.9, 40.7, 40.7, 40.7}), (std::vector<uint64_t>{5, 41, 41, 41}));
  // Against every split of small totals: none ends sooner than the one chosen.
  const std::vector<std::vector<double>> cases = {{1, 10}, {0.4, 2.9, 2.9}, {3, 1, 1}, {7, 2, 5}};
  for (const auto& w : cases) {
    for (uint64_t total = 0; total <= 12; ++total) {
      const auto length = [&](const std::vector<uint64_t>& s) {
        double t = 0.0;
        for (size_t i = 0; i < s.size(); ++i) t = std::max(t, static_cast<double>(s[i]) / w[i]);
        return t;
      };
      const std::vector<uint64_t> chosen = fastest_shares(total, w);
      double best = std::numeric_limits<double>::infinity();
      std::vector<uint64_t> s(w.size(), 0);
      // Every split of `total` into w.size() parts, by counting in base total + 1.
      while (true) {
        uint64_t sum = 0;
        for (size_t i = 0; i + 1 < s.size(); ++i) sum += s[i];
        if (sum <= total) {
          s.back() = total - sum;
          best = std::min(best, length(s));
        }
        size_t i = 0;
        while (i + 1 < s.size() && s[i] == total) s[i++] = 0;
        if (i + 1 == s.size()) break;
        ++s[i];
      }
      EXPECT_DOUBLE_EQ(length(chosen), best) << "total " << total;
    }
  }
}

TEST(CoordinatorAssignmentTest, UnknownThroughputCountsAsTheMedian) {
  EXPECT_EQ(throughput_weights({0, 0}), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(throughput_weights({4, 0, 2, 10}), (std::vector<double>{4, 4, 2, 10}));
  EXPECT_EQ(throughput_weights({4, 0, 2}), (std::vector<double>{4, 3, 2}));
}

TEST(CoordinatorAssignmentTest, SpotCheckWorkComesOutOfTheVerifiersShare) {
  // 12 sequences and a check of 4 on member 1: 16 sequences of work at 2 + 2 per second is 4 s,
  // of which member 1 spends 2 s on its check, so it trains at 1 per second.
  EXPECT_EQ(weights_after_checks({2, 2}, 12, {0, 4}), (std::vector<double>{2, 1}));
  EXPECT_EQ(fastest_shares(12, weights_after_checks({2, 2}, 12, {0, 4})),
            (std::vector<uint64_t>{8, 4}));
  // No checks: the weights as they were.
  EXPECT_EQ(weights_after_checks({3, 1}, 12, {0, 0}), (std::vector<double>{3, 1}));
  // Checks that fill the round leave a token weight, never zero or less.
  const auto w = weights_after_checks({1, 1}, 2, {0, 100});
  EXPECT_GT(w[1], 0.0);
  EXPECT_EQ(fastest_shares(2, w), (std::vector<uint64_t>{2, 0}));
  EXPECT_THROW(weights_after_checks({1, 1}, 2, {0}), Error);
  // Weights whose sum overflows are left as they are, not turned into NaN.
  EXPECT_EQ(weights_after_checks({1e308, 1e308}, 2, {0, 1}), (std::vector<double>{1e308, 1e308}));
}

TEST(CoordinatorAssignmentTest, ReturnedIdsGoOutFirstLowestFirst) {
  DataQueue q;
  EXPECT_EQ(take_sequences(q, 10), (std::vector<SequenceRange>{{0, 10}}));
  return_sequences(q, {{6, 2}});
  return_sequences(q, {{2, 2}, {4, 2}});  // merges with its neighbours
  EXPECT_EQ(q.pending, (std::vector<SequenceRange>{{2, 6}}));
  EXPECT_EQ(take_sequences(q, 3), (std::vector<SequenceRange>{{2, 3}}));
  EXPECT_EQ(take_sequences(q, 5), (std::vector<SequenceRange>{{5, 3}, {10, 2}}));
  EXPECT_TRUE(q.pending.empty());
  EXPECT_EQ(q.next_fresh, 12u);
  return_sequences(q, {{10, 2}});
  EXPECT_THROW(return_sequences(q, {{11, 1}}), Error);  // already pending
  EXPECT_THROW(return_sequences(q, {{11, 5}}), Error);  // never handed out
  EXPECT_EQ(cut_ranges({{0, 3}, {10, 4}}, {2, 0, 5}),
            (std::vector<std::vector<SequenceRange>>{{{0, 2}}, {}, {{2, 1}, {10, 4}}}));
  EXPECT_THROW(cut_ranges({{0, 3}}, {2}), Error);
}

// ---- silence, leaving, pausing, finishing ------------------------------------------------------

TEST_F(CoordinatorTest, SilentMembersAreDroppedAndMayRejoin) {
  options_.network.min_peers = 1;
  options_.network.min_deadline_seconds = 100;  // the round outlasts the silence
  Actions opened = start(2);
  const auto ranges1 = ranges_of(sent(opened, key(1), Body::kRoundStart).at(0).round_start());
  handle(0, heartbeat_msg(0, 1), kT0 + 10);
  sm_->tick(kT0 + 15);  // exactly the timeout: not yet
  EXPECT_EQ(member(1).state, MemberState::kActive);
  Actions a = sm_->tick(kT0 + 15.5);
  EXPECT_EQ(member(1).state, MemberState::kDropped);
  EXPECT_EQ(member(1).drop_reason, DropReason::kHeartbeatTimeout);
  EXPECT_EQ(member(0).state, MemberState::kActive);
  EXPECT_TRUE(logged(a, "silent"));
  // The round no longer waits for it: member 0's commit closes it; no strike for a dropped one.
  commit(0, 0, hash_of(0), kT0 + 16);
  EXPECT_FALSE(state().round.has_value() && state().round->step == 0);
  EXPECT_EQ(member(1).strikes, 0);
  EXPECT_EQ(state().queue.pending, ranges1);
  // It restarted: it may join again, and catches up first.
  handle(0, witness_msg(0, {hash_of(0)}), kT0 + 16);
  ASSERT_EQ(state().finalized_steps(), 1u);
  a = handle(1, join_msg(ids_[1]), kT0 + 17);
  EXPECT_EQ(sent(a, key(1), Body::kWelcome).size(), 1u);
  EXPECT_EQ(member(1).state, MemberState::kSyncing);
}

TEST_F(CoordinatorTest, LeavingMidRoundRequeuesWithoutAStrike) {
  options_.network.min_peers = 1;
  Actions opened = start(2);
  const auto ranges1 = ranges_of(sent(opened, key(1), Body::kRoundStart).at(0).round_start());
  commit(0, 0, hash_of(0), kT0 + 3);
  EXPECT_TRUE(state().round.has_value());
  Actions a = handle(1, leave_msg(), kT0 + 4);
  EXPECT_TRUE(logged(a, "left"));
  EXPECT_EQ(member(1).state, MemberState::kLeft);
  EXPECT_EQ(state().collecting.size(), 1u);  // closed at once: nobody left to wait for
  EXPECT_EQ(member(1).strikes, 0);
  EXPECT_EQ(state().queue.pending, ranges1);
  EXPECT_EQ(sent(handle(1, heartbeat_msg(0, 0), kT0 + 5), key(1), Body::kRefused).size(), 1u);
}

TEST_F(CoordinatorTest, PausesBelowMinPeersAndResumesWithoutWarmup) {
  start(2);
  const double t = kT0 + 3;
  full_round(0, {0, 1}, t);
  ASSERT_EQ(state().round->step, 1u);
  handle(1, leave_msg(), t + 1);
  commit(0, 1, hash_of(1), t + 1);  // closes round 1 (member 1 is gone)
  Actions a = handle(0, witness_msg(1, {hash_of(1)}), t + 1);
  EXPECT_EQ(state().finalized_steps(), 2u);
  EXPECT_EQ(state().phase, Phase::kPaused);
  EXPECT_FALSE(state().round.has_value());
  sm_->tick(t + 5);
  EXPECT_FALSE(state().round.has_value());
  // Member 1 returns: syncing first (steps are final), then caught up.
  handle(1, join_msg(ids_[1]), t + 6);
  EXPECT_EQ(state().phase, Phase::kPaused);
  a = handle(1, heartbeat_msg(2, 2), t + 7);
  EXPECT_EQ(member(1).state, MemberState::kActive);
  EXPECT_EQ(state().phase, Phase::kTraining);
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 2u);
  EXPECT_EQ(sent(a, key(1), Body::kRoundStart).size(), 1u);
}

TEST_F(CoordinatorTest, SyncingBecomesActiveWithinOverlapOfTheLedger) {
  options_.network.overlap = 1;
  start(2);
  const double t = kT0 + 3;
  for (uint64_t s = 0; s < 3; ++s) full_round(s, {0, 1}, t + static_cast<double>(s));
  EXPECT_EQ(state().finalized_steps(), 3u);
  handle(2, join_msg(ids_[2]), t + 5);
  EXPECT_EQ(member(2).state, MemberState::kSyncing);
  handle(2, heartbeat_msg(1, 0), t + 6);
  EXPECT_EQ(member(2).state, MemberState::kSyncing);  // 1 + 1 < 3
  handle(2, heartbeat_msg(2, 0), t + 6);
  EXPECT_EQ(member(2).state, MemberState::kActive);  // 2 + 1 >= 3
}

TEST_F(CoordinatorTest, FinishesAfterTheLastStep) {
  options_.total_steps = 2;
  options_.network.finish_grace_seconds = 5;
  start(2);
  const double t = kT0 + 3;
  full_round(0, {0, 1}, t);
  Actions a = full_round(1, {0, 1}, t + 1);
  EXPECT_EQ(state().phase, Phase::kFinished);
  EXPECT_FALSE(state().round.has_value());
  for (int i = 0; i < 2; ++i) {
    auto f = sent(a, key(i), Body::kFinished);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].finished().steps(), 2u);
  }
  EXPECT_EQ(count_kind(a, Body::kRoundStart), 0u);
  // Anyone, member or not, hears Finished from now on.
  EXPECT_EQ(sent(handle(3, join_msg(ids_[3]), t + 2), key(3), Body::kFinished).size(), 1u);
  EXPECT_EQ(sent(handle(0, heartbeat_msg(2, 2), t + 2), key(0), Body::kFinished).size(), 1u);
  // No checkpoint of the final state was reported: the grace period releases the members once
  // (coordinator_finish_test.cc), and then nothing more is sent.
  EXPECT_EQ(count_kind(sm_->tick(t + 10), Body::kFinished), 2u);
  EXPECT_TRUE(sm_->released());
  EXPECT_TRUE(sm_->tick(t + 200).send.empty());
}

TEST_F(CoordinatorTest, EventsAreRecordedAndBounded) {
  make();
  for (int i = 0; i < 150; ++i) {
    sm_->handle(key(0), join_msg(ids_[0]), kT0 + i);
    sm_->handle(key(0), leave_msg(), kT0 + i);
  }
  EXPECT_EQ(state().events.size(), kMaxEvents);
  EXPECT_EQ(state().events.back().seq, 300u);
  EXPECT_EQ(state().events.back().at, kT0 + 149);
}

TEST_F(CoordinatorTest, BadOptionsAreRejected) {
  options_.batch_size = 0;
  EXPECT_THROW(make(), Error);
  options_.batch_size = 4;
  options_.network.overlap = 2;
  EXPECT_THROW(make(), Error);
}

}  // namespace
}  // namespace agora::coord
