// The coordinator's state machine, transition by transition: commits and strikes, witnesses and
// quorum, overlap, the ledger, hash reports, checkpoints, and what a restarted coordinator
// re-sends. Time is the `now` each call passes; nothing sleeps or reads a clock.
#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

// ---- deadlines and strikes ---------------------------------------------------------------------

TEST_F(CoordinatorTest, MissedDeadlineStrikesAndRequeuesTheData) {
  Actions opened = start(2);
  const double t = kT0 + 2;
  const auto missed = ranges_of(sent(opened, key(1), Body::kRoundStart).at(0).round_start());
  commit(0, 0, hash_of(0), t + 1);
  EXPECT_TRUE(state().round.has_value());  // still waiting for member 1
  Actions early = sm_->tick(t + 9.9);
  EXPECT_TRUE(state().round.has_value());
  Actions closed = sm_->tick(t + 10);
  EXPECT_FALSE(state().round.has_value());
  EXPECT_EQ(member(1).strikes, 1);
  EXPECT_EQ(state().counters.strikes, 1u);
  EXPECT_TRUE(logged(closed, "missed the deadline of round 0"));
  EXPECT_TRUE(logged(closed, EventKind::kStrike, key(1)));
  EXPECT_FALSE(logged(closed, EventKind::kStrike, key(0)));
  EXPECT_EQ(logged_field(closed, EventKind::kStrike, "strikes"), obs::LogValue(int64_t{1}));
  EXPECT_EQ(logged_field(closed, EventKind::kRound, "round"), obs::LogValue(uint64_t{0}));
  EXPECT_EQ(state().queue.pending, missed);
  // Both active members witness; member 0's payload is final (held by 2 of 2).
  auto collect = sent(closed, key(1), Body::kCollect);
  ASSERT_EQ(collect.size(), 1u);
  EXPECT_EQ(collect[0].collect().commits_size(), 1);
  handle(0, witness_msg(0, {hash_of(0)}), t + 11);
  Actions fin = handle(1, witness_msg(0, {hash_of(0)}), t + 11);
  ASSERT_EQ(state().finalized_steps(), 1u);
  EXPECT_EQ(state().finalized[0].size(), 1u);
  EXPECT_EQ(member(0).strikes, 0);
  // Round 1 hands the missed ids out first.
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 1u);
  const auto first = ranges_of(sent(fin, key(0), Body::kRoundStart).at(0).round_start());
  EXPECT_EQ(first.front(), missed.front());
  EXPECT_TRUE(state().queue.pending.empty());
}

TEST_F(CoordinatorTest, RepeatedStrikesDropAndTheDroppedAreRefused) {
  options_.network.max_strikes = 2;
  options_.network.min_peers = 1;
  start(2);
  double t = kT0 + 2;
  for (uint64_t step = 0; step < 2; ++step) {
    commit(0, step, hash_of(static_cast<int>(step)), t);
    handle(1, heartbeat_msg(0, step + 1), t);  // alive, just never commits
    Actions closed = sm_->tick(t + 10);
    if (step == 1) {
      EXPECT_TRUE(logged(closed, EventKind::kDrop, key(1)));
      EXPECT_EQ(logged_field(closed, EventKind::kDrop, "reason"),
                obs::LogValue(std::string("strikes")));
      EXPECT_EQ(sent(closed, key(1), Body::kRefused).size(), 1u);
    }
    handle(0, witness_msg(step, {hash_of(static_cast<int>(step))}), t + 10);
    if (member(1).state != MemberState::kDropped) {
      handle(1, witness_msg(step, {hash_of(static_cast<int>(step))}), t + 10);
    }
    t += 10;
  }
  EXPECT_EQ(member(1).state, MemberState::kDropped);
  EXPECT_EQ(member(1).drop_reason, DropReason::kStrikes);
  EXPECT_EQ(state().counters.drops, 1u);
  auto refused = sent(handle(1, heartbeat_msg(0, 2), t), key(1), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].refused().reason().find("strikes"), std::string::npos);
  refused = sent(handle(1, join_msg(ids_[1]), t), key(1), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].refused().reason().find("may not rejoin"), std::string::npos);
  // The run goes on with member 0 alone (min_peers 1), which trains the whole batch.
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->assignments.size(), 1u);
}

TEST_F(CoordinatorTest, AFinalPayloadResetsStrikes) {
  start(2);
  double t = kT0 + 2;
  commit(0, 0, hash_of(0), t);
  sm_->tick(t + 10);
  EXPECT_EQ(member(1).strikes, 1);
  full_round(0, {0}, t + 10);
  handle(1, witness_msg(0, {hash_of(0)}), t + 10);
  ASSERT_EQ(state().finalized_steps(), 1u);
  full_round(1, {0, 1}, t + 11);
  ASSERT_EQ(state().finalized_steps(), 2u);
  EXPECT_EQ(member(1).strikes, 0);
}

// ---- commit validation -------------------------------------------------------------------------

TEST_F(CoordinatorTest, InvalidCommitsAreDroppedNeverTrusted) {
  start(2);
  const double t = kT0 + 3;
  // Signed by someone else.
  wire::Envelope forged = commit_msg(ids_[1], options_.run_id, 0, hash_of(0));
  forged.mutable_commit()->mutable_record()->set_author(key(0));
  Actions a = handle(0, forged, t);
  EXPECT_TRUE(logged(a, "signature"));
  // Signed for another run.
  handle(0, commit_msg(ids_[0], "another-run", 0, hash_of(0)), t);
  // The wrong step.
  a = handle(0, commit_msg(ids_[0], options_.run_id, 3, hash_of(0)), t);
  EXPECT_TRUE(logged(a, "the open round is step 0"));
  // Author is not the sender.
  a = sm_->handle(key(1), commit_msg(ids_[0], options_.run_id, 0, hash_of(0)), t);
  EXPECT_TRUE(logged(a, "author"));
  // A hash of the wrong size.
  handle(0, commit_msg(ids_[0], options_.run_id, 0, "short"), t);
  // Not assigned: member 2 joined after the round opened.
  handle(2, join_msg(ids_[2]), t);
  a = commit(2, 0, hash_of(2), t);
  EXPECT_TRUE(logged(a, "not assigned in round 0"));
  // From a stranger: refused.
  EXPECT_EQ(sent(commit(3, 0, hash_of(3), t), key(3), Body::kRefused).size(), 1u);

  EXPECT_EQ(state().counters.commits_rejected, 6u);
  EXPECT_EQ(state().counters.commits_accepted, 0u);
  EXPECT_TRUE(state().round->commits.empty());

  // The valid ones are accepted; a repeat is harmless; a second, different hash is not taken.
  commit(0, 0, hash_of(0), t);
  commit(0, 0, hash_of(0), t);
  commit(0, 0, hash_of(5), t);
  EXPECT_EQ(state().counters.commits_accepted, 1u);
  EXPECT_EQ(state().counters.commits_rejected, 7u);
  EXPECT_EQ(state().round->commits.at(key(0)).payload_hash, hash_of(0));
  commit(1, 0, hash_of(1), t);
  EXPECT_FALSE(state().round.has_value());  // everyone committed: closed early
  // Now late.
  a = commit(1, 0, hash_of(1), t);
  EXPECT_TRUE(logged(a, "late commit"));
  EXPECT_EQ(state().counters.commits_late, 1u);
}

TEST_F(CoordinatorTest, CommitsUpdateTheThroughputEstimate) {
  start(2);
  handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0), 6, 2.0), kT0 + 3);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 3.0);
  full_round(0, {1}, kT0 + 3);
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 3);
  ASSERT_EQ(state().round->step, 1u);
  handle(0, commit_msg(ids_[0], options_.run_id, 1, hash_of(0), 4, 4.0), kT0 + 4);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 2.0);  // 0.5 * 3 + 0.5 * 1
}

TEST_F(CoordinatorTest, AThroughputClaimCountsNoFasterThanTheCommitArrives) {
  start(2);  // round 0 opened at kT0 + 2, 6 sequences each
  // Member 0 says its 6 sequences took 10 ms and that it trained 600; its commit arrived 3 s
  // after the round opened. The coordinator's clock and the share it handed out decide: 2 per
  // second, not 60,000.
  handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0), 600, 0.01), kT0 + 5);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 2.0);
  // Member 1 waited (fetching) before it trained: its claim of 4 s is slower than the 3 s seen,
  // and stands.
  handle(1, commit_msg(ids_[1], options_.run_id, 0, hash_of(1), 6, 4.0), kT0 + 5);
  EXPECT_DOUBLE_EQ(member(1).sequences_per_second, 1.5);
  // The next round's split follows what they delivered: 12 x 2 / 3.5 and 12 x 1.5 / 3.5.
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 5);
  const Actions opened = handle(1, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 5);
  ASSERT_EQ(state().round->step, 1u);
  EXPECT_EQ(count_of(sent(opened, key(0), Body::kRoundStart).at(0).round_start()), 7u);
  EXPECT_EQ(count_of(sent(opened, key(1), Body::kRoundStart).at(0).round_start()), 5u);
}

TEST_F(CoordinatorTest, ALateCommitMeasuresAMemberTooSlowForTheDeadline) {
  start(2);  // round 0 opened at kT0 + 2: 6 sequences each, deadline 10 s (speeds unknown)
  handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0)), kT0 + 5);  // 2 per second
  const Actions closed = sm_->tick(kT0 + 12.5);
  ASSERT_EQ(state().next_step, 1u);
  EXPECT_EQ(member(1).strikes, 1);
  // The close says what held the round: who committed last, and when.
  EXPECT_EQ(logged_field(closed, EventKind::kRound, "last_committer"),
            obs::LogValue(net::short_key(key(0))));
  EXPECT_EQ(logged_field(closed, EventKind::kRound, "last_commit_seconds"), obs::LogValue(3.0));
  EXPECT_EQ(logged_field(closed, EventKind::kRound, "seconds"), obs::LogValue(10.5));
  // Signed for another run: no sample.
  Actions late = handle(1, commit_msg(ids_[1], "another run", 0, hash_of(1)), kT0 + 20);
  EXPECT_FALSE(logged_field(late, EventKind::kIgnored, "sequences_per_second"));
  EXPECT_EQ(member(1).sequences_per_second, 0.0);
  // Member 1's commit arrives 18 s after the opening: 6 / 18 per second, its first measure.
  late = handle(1, commit_msg(ids_[1], options_.run_id, 0, hash_of(1)), kT0 + 20);
  EXPECT_EQ(logged_field(late, EventKind::kIgnored, "sequences_per_second"),
            obs::LogValue(6.0 / 18.0));
  EXPECT_DOUBLE_EQ(member(1).sequences_per_second, 6.0 / 18.0);
  EXPECT_EQ(member(1).strikes, 0);  // the miss's strike taken back: it was working
  // A missed round measures once; a round the member did not miss, never.
  late = handle(1, commit_msg(ids_[1], options_.run_id, 0, hash_of(1)), kT0 + 21);
  EXPECT_FALSE(logged_field(late, EventKind::kIgnored, "sequences_per_second"));
  late = handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0)), kT0 + 21);
  EXPECT_FALSE(logged_field(late, EventKind::kIgnored, "sequences_per_second"));
  EXPECT_DOUBLE_EQ(member(1).sequences_per_second, 6.0 / 18.0);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 2.0);
  EXPECT_EQ(state().counters.commits_late, 4u);
  // The next round fits it: weights 2 and 1/3 over 12 give 11 (5.5 s) and 1 (3 s); a split by
  // largest remainders would give 10 and 2 (6 s). The deadline covers the slower finish.
  handle(0, witness_msg(0, {hash_of(0)}), kT0 + 21);
  const Actions opened = handle(1, witness_msg(0, {hash_of(0)}), kT0 + 21);
  ASSERT_EQ(state().round->step, 1u);
  const wire::RoundStart start1 = sent(opened, key(1), Body::kRoundStart).at(0).round_start();
  EXPECT_EQ(count_of(sent(opened, key(0), Body::kRoundStart).at(0).round_start()), 11u);
  EXPECT_EQ(count_of(start1), 1u);
  EXPECT_DOUBLE_EQ(start1.deadline_seconds(), 3.0 * 5.5);
}

TEST_F(CoordinatorTest, AnEvenSplitIgnoresMeasuredThroughput) {
  options_.network.split = "even";
  start(2);
  // The same commits as above: 2 and 1.5 sequences per second measured, and still 6 and 6.
  handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0), 600, 0.01), kT0 + 5);
  handle(1, commit_msg(ids_[1], options_.run_id, 0, hash_of(1), 6, 4.0), kT0 + 5);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 2.0);
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 5);
  const Actions opened = handle(1, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 5);
  ASSERT_EQ(state().round->step, 1u);
  EXPECT_EQ(count_of(sent(opened, key(0), Body::kRoundStart).at(0).round_start()), 6u);
  EXPECT_EQ(count_of(sent(opened, key(1), Body::kRoundStart).at(0).round_start()), 6u);
}

TEST_F(CoordinatorTest, AJoinersOwnEstimateCountsForNoMoreThanTheFastestMember) {
  start(2);
  handle(0, commit_msg(ids_[0], options_.run_id, 0, hash_of(0), 6, 0.0), kT0 + 5);  // 2 / s
  handle(1, commit_msg(ids_[1], options_.run_id, 0, hash_of(1), 6, 0.0), kT0 + 8);  // 1 / s
  handle(2, join_msg(ids_[2], 1e9), kT0 + 8);
  EXPECT_DOUBLE_EQ(member(2).sequences_per_second, 2.0);
  handle(3, join_msg(ids_[3], 0.5), kT0 + 8);  // a modest estimate stands
  EXPECT_DOUBLE_EQ(member(3).sequences_per_second, 0.5);
}

TEST_F(CoordinatorTest, AJoinersEstimateHasACeilingWhenNobodyWasMeasured) {
  make();
  // Sums of such weights would overflow to infinity and poison the split.
  handle(0, join_msg(ids_[0], 1e300), kT0);
  handle(1, join_msg(ids_[1], 1e300), kT0);
  EXPECT_DOUBLE_EQ(member(0).sequences_per_second, 1e6);
  EXPECT_DOUBLE_EQ(member(1).sequences_per_second, 1e6);
  EXPECT_TRUE(sm_->tick(kT0 + options_.network.warmup_seconds).send.size() > 0);
}

// ---- collect, witness, finalize ----------------------------------------------------------------

TEST_F(CoordinatorTest, QuorumDecidesWhichPayloadsAreFinal) {
  options_.batch_size = 9;
  Actions opened = start(3);
  const double t = kT0 + 3;
  const auto ranges2 = ranges_of(sent(opened, key(2), Body::kRoundStart).at(0).round_start());
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);
  Actions closed = commit(2, 0, hash_of(2), t);
  for (int i = 0; i < 3; ++i) {
    auto collect = sent(closed, key(i), Body::kCollect);
    ASSERT_EQ(collect.size(), 1u);
    ASSERT_EQ(collect[0].collect().commits_size(), 3);
    EXPECT_EQ(collect[0].collect().members_size(), 3);
  }
  // Sorted by author key.
  EXPECT_EQ(state().collecting.at(0).commits[0].author, key(0));
  // Payload 0: held by all. Payload 1: by members 0 and 2, the others than its author. Payload
  // 2: only by its author: not final, and missing for both other witnesses: a strike.
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), t + 1);
  wire::Envelope w1 = witness_msg(0, {hash_of(0), hash_of(1)});
  wire::Rejection* rej = w1.mutable_witness()->add_rejected();
  rej->set_author(key(2));
  rej->set_reason("payload does not decode");
  Actions a = handle(1, w1, t + 1);
  EXPECT_TRUE(logged(a, "payload does not decode"));
  EXPECT_EQ(state().finalized_steps(), 0u);  // member 2 has not witnessed yet
  // Member 3 joins after the close: it got no Collect.
  handle(3, join_msg(ids_[3]), t + 1.5);
  Actions fin = handle(2, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2), hash_of(9)}), t + 2);
  ASSERT_EQ(state().finalized_steps(), 1u);
  ASSERT_EQ(state().finalized[0].size(), 2u);
  EXPECT_EQ(state().finalized[0][0].payload_hash, hash_of(0));
  EXPECT_EQ(state().finalized[0][1].payload_hash, hash_of(1));
  // The witnesses hold the Collect (commits 0, 1, 2 by author key): one bit per commit, 0 and 1
  // final.
  for (int i = 0; i < 3; ++i) {
    auto f = sent(fin, key(i), Body::kFinalized);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].finalized().set_size(), 0);
    ASSERT_TRUE(f[0].finalized().has_of_collect());
    EXPECT_EQ(f[0].finalized().of_collect(), std::string(1, '\x03'));
  }
  // The joiner hears the whole set; and GetFinalized is always answered with it.
  auto whole = sent(fin, key(3), Body::kFinalized);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_FALSE(whole[0].finalized().has_of_collect());
  ASSERT_EQ(whole[0].finalized().set_size(), 2);
  EXPECT_EQ(whole[0].finalized().set(1).payload_hash(), hash_of(1));
  EXPECT_EQ(member(2).strikes, 1);
  EXPECT_EQ(state().counters.payloads_final, 2u);
  EXPECT_EQ(state().counters.payloads_not_final, 1u);
  EXPECT_EQ(state().counters.rejections_reported, 1u);
  // Member 2's data went back and comes out first in round 1.
  ASSERT_TRUE(state().round.has_value());
  const auto first = ranges_of(sent(fin, key(0), Body::kRoundStart).at(0).round_start());
  EXPECT_EQ(first.front(), ranges2.front());
}

TEST_F(CoordinatorTest, WitnessDeadlineFinalizesWithWhatArrived) {
  start(3);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);  // member 2 never commits
  sm_->tick(t + 8);
  ASSERT_TRUE(state().round.has_value());
  for (int i = 0; i < 3; ++i) handle(i, heartbeat_msg(0, 1), t + 8);
  sm_->tick(t + 9);  // the commit deadline (opened at t - 1, 10 s) closes round 0 with {0, 1}
  ASSERT_EQ(state().collecting.size(), 1u);
  EXPECT_EQ(member(2).strikes, 1);
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), t + 10);
  handle(2, witness_msg(0, {hash_of(0), hash_of(1)}), t + 10);
  sm_->tick(t + 18.9);
  EXPECT_EQ(state().finalized_steps(), 0u);  // member 1 may still witness
  sm_->tick(t + 19);
  ASSERT_EQ(state().finalized_steps(), 1u);
  // Member 1 never witnessed. Payload 0: held by member 2, the one other witness that answered
  // (and with its author 2 of 3 > 1.5); payload 1: by members 0 and 2.
  EXPECT_EQ(state().finalized[0].size(), 2u);
}

TEST_F(CoordinatorTest, NobodyCommittedFinalizesAnEmptyStep) {
  options_.network.min_peers = 1;
  start(1);
  Actions a = sm_->tick(kT0 + 2 + 10);
  ASSERT_EQ(state().finalized_steps(), 1u);
  EXPECT_TRUE(state().finalized[0].empty());
  EXPECT_EQ(count_kind(a, Body::kCollect), 0u);
  EXPECT_EQ(sent(a, key(0), Body::kFinalized).size(), 1u);
  EXPECT_EQ(state().queue.pending, (std::vector<SequenceRange>{}));  // handed out again already
  EXPECT_EQ(state().round->assignments.at(key(0)).front(), (SequenceRange{0, 12}));
}

// ---- overlap -----------------------------------------------------------------------------------

TEST_F(CoordinatorTest, WithoutOverlapTheNextRoundWaitsForTheStepToBeFinal) {
  start(2);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);
  EXPECT_FALSE(state().round.has_value());
  EXPECT_EQ(state().next_step, 1u);
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), t);
  EXPECT_FALSE(state().round.has_value());
  Actions a = handle(1, witness_msg(0, {hash_of(0), hash_of(1)}), t);
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 1u);
  EXPECT_EQ(sent(a, key(0), Body::kRoundStart).at(0).round_start().apply_through(), 1u);
}

TEST_F(CoordinatorTest, RoundStartListsJoinersSoPeersServeThemTheState) {
  start(2);
  full_round(0, {0, 1}, kT0 + 3);  // step 0 final, round 1 open
  handle(2, join_msg(ids_[2]), kT0 + 4);
  ASSERT_EQ(member(2).state, MemberState::kSyncing);
  const Actions a = full_round(1, {0, 1}, kT0 + 5);  // round 2 opens with a syncing member
  const auto starts = sent(a, key(0), Body::kRoundStart);
  ASSERT_EQ(starts.size(), 1u);
  ASSERT_EQ(starts[0].round_start().joining_size(), 1);
  EXPECT_EQ(starts[0].round_start().joining(0).key(), key(2));
  EXPECT_FALSE(starts[0].round_start().joining(0).endpoint().empty());
  for (const auto& m : starts[0].round_start().members()) EXPECT_NE(m.key(), key(2));
}

TEST_F(CoordinatorTest, WithOverlapTheNextRoundOpensWhileTheStepIsCollected) {
  options_.network.overlap = 1;
  start(2);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  Actions a = commit(1, 0, hash_of(1), t);
  // Round 1 opens as soon as round 0 closed.
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 1u);
  EXPECT_EQ(sent(a, key(0), Body::kCollect).size(), 1u);
  EXPECT_EQ(sent(a, key(0), Body::kRoundStart).at(0).round_start().apply_through(), 0u);
  // Round 1 closes, but round 2 waits for step 0.
  commit(0, 1, hash_of(2), t + 1);
  commit(1, 1, hash_of(3), t + 1);
  EXPECT_FALSE(state().round.has_value());
  EXPECT_EQ(state().collecting.size(), 2u);
  // A witness for step 1 first does not finalize it out of order.
  handle(0, witness_msg(1, {hash_of(2), hash_of(3)}), t + 2);
  handle(1, witness_msg(1, {hash_of(2), hash_of(3)}), t + 2);
  EXPECT_EQ(state().finalized_steps(), 0u);
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), t + 2);
  a = handle(1, witness_msg(0, {hash_of(0), hash_of(1)}), t + 2);
  EXPECT_EQ(state().finalized_steps(), 2u);  // 0, then 1 at once
  ASSERT_TRUE(state().round.has_value());
  EXPECT_EQ(state().round->step, 2u);
  EXPECT_EQ(sent(a, key(0), Body::kRoundStart).at(0).round_start().apply_through(), 1u);
  EXPECT_EQ(sent(a, key(0), Body::kFinalized).size(), 2u);
}

TEST_F(CoordinatorTest, GetFinalizedAnswersFromTheLedger) {
  start(2);
  full_round(0, {0, 1}, kT0 + 3);
  wire::Envelope get;
  get.mutable_get_finalized()->set_step(0);
  auto f = sent(handle(0, get, kT0 + 4), key(0), Body::kFinalized);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].finalized().step(), 0u);
  ASSERT_EQ(f[0].finalized().set_size(), 2);
  EXPECT_EQ(f[0].finalized().set(0).author(), key(0));
  EXPECT_TRUE(net::verify_signature(
      key(0), net::commit_signing_bytes(options_.run_id, 0, f[0].finalized().set(0).payload_hash()),
      f[0].finalized().set(0).signature()));
  get.mutable_get_finalized()->set_step(1);
  EXPECT_EQ(sent(handle(0, get, kT0 + 4), key(0), Body::kNotFound).size(), 1u);
}

// ---- hashes ------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, MinorityHashGetsOneResync) {
  start(3);
  handle(0, state_report_msg(0, hash_of(0)), kT0 + 5);
  Actions a = handle(1, state_report_msg(0, hash_of(1)), kT0 + 5);
  EXPECT_EQ(count_kind(a, Body::kResync), 0u);  // 1 vs 1: no strict majority
  a = handle(2, state_report_msg(0, hash_of(0)), kT0 + 5);
  auto resync = sent(a, key(1), Body::kResync);
  ASSERT_EQ(resync.size(), 1u);
  EXPECT_EQ(count_kind(a, Body::kResync), 1u);
  EXPECT_EQ(resync[0].resync().state().applied_steps(), 0u);
  EXPECT_EQ(resync[0].resync().state().state_hash(), state_hash_for(hash_of(0)));
  EXPECT_EQ(resync[0].resync().state().tensor_names(0), "w");
  ASSERT_EQ(resync[0].resync().holders_size(), 2);
  EXPECT_EQ(resync[0].resync().holders(0).key(), key(0));
  EXPECT_EQ(resync[0].resync().holders(0).endpoint(), endpoint_of(ids_[0]));
  EXPECT_EQ(resync[0].resync().holders(1).key(), key(2));
  // At most once per member per step.
  a = handle(1, state_report_msg(0, hash_of(1)), kT0 + 6);
  EXPECT_EQ(count_kind(a, Body::kResync), 0u);
  EXPECT_EQ(state().counters.resyncs_sent, 1u);
}

TEST_F(CoordinatorTest, WelcomeHandsOutTheNewestMajorityState) {
  options_.network.hash_interval = 1;
  start(3);
  for (uint64_t t = 0; t < 6; ++t) full_round(t, {0, 1, 2}, kT0 + 3 + t);
  ASSERT_EQ(state().finalized_steps(), 6u);
  handle(0, state_report_msg(0, hash_of(5)), kT0 + 10);
  handle(0, state_report_msg(2, hash_of(0)), kT0 + 10);
  handle(1, state_report_msg(2, hash_of(1)), kT0 + 10);
  handle(2, state_report_msg(2, hash_of(1)), kT0 + 10);
  auto w = sent(handle(3, join_msg(ids_[3]), kT0 + 11), key(3), Body::kWelcome);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].welcome().state().applied_steps(), 2u);
  EXPECT_EQ(w[0].welcome().state().state_hash(), state_hash_for(hash_of(1)));
  ASSERT_EQ(w[0].welcome().holders_size(), 2);
  EXPECT_EQ(w[0].welcome().holders(0).key(), key(1));
  EXPECT_EQ(w[0].welcome().holders(1).key(), key(2));
  // Only the newest few steps are kept.
  for (uint64_t k = 3; k <= 6; ++k) handle(0, state_report_msg(k, hash_of(0)), kT0 + 12);
  EXPECT_EQ(state().state_reports.size(), kMaxStateReportSteps);
  EXPECT_EQ(state().state_reports.begin()->first, 3u);
}

TEST_F(CoordinatorTest, CheckpointReportsAreRecorded) {
  start(2);
  wire::Envelope e;
  e.mutable_checkpoint_report()->set_applied_steps(0);
  e.mutable_checkpoint_report()->set_state_hash(hash_of(0));
  e.mutable_checkpoint_report()->set_path("runs/x/step_0.safetensors");
  Actions a = handle(0, e, kT0 + 5);
  EXPECT_TRUE(logged(a, EventKind::kCheckpoint, key(0)));
  ASSERT_EQ(state().checkpoints.size(), 1u);
  EXPECT_EQ(state().checkpoints[0].reporter, key(0));
  EXPECT_EQ(state().checkpoints[0].path, "runs/x/step_0.safetensors");
}

// ---- healing and restarts ----------------------------------------------------------------------

TEST_F(CoordinatorTest, WhenEveryMemberLeftTheRunGoesBackToItsCheckpoint) {
  start(2);
  const double t = kT0 + 3;
  full_round(0, {0, 1}, t);
  wire::Envelope checkpoint;
  checkpoint.mutable_checkpoint_report()->set_applied_steps(1);
  checkpoint.mutable_checkpoint_report()->set_state_hash(hash_of(7));
  checkpoint.mutable_checkpoint_report()->set_path("ckpt/checkpoint_000001");
  handle(0, checkpoint, t);
  full_round(1, {0, 1}, t + 1);
  ASSERT_EQ(state().finalized_steps(), 2u);
  handle(0, leave_msg(), t + 2);
  handle(1, leave_msg(), t + 2);
  // (round 2, left by everyone, closes with nothing committed: an empty final step)
  const uint64_t final_steps = state().finalized_steps();

  // A member that still holds the newest parameters coming back alone changes nothing...
  wire::Envelope holder = join_msg(ids_[0]);
  holder.mutable_join()->set_applied_steps(final_steps);
  handle(0, holder, t + 3);
  EXPECT_EQ(state().finalized_steps(), final_steps);
  handle(0, leave_msg(), t + 4);

  // ... a fresh process alone sends the run back to step 1, the checkpoint's.
  Actions a = handle(2, join_msg(ids_[2]), t + 5);
  EXPECT_TRUE(logged(a, "restarts from the checkpoint"));
  EXPECT_EQ(state().finalized_steps(), 1u);
  EXPECT_EQ(state().next_step, 1u);
  EXPECT_FALSE(state().round.has_value());
  EXPECT_EQ(state().counters.restarts, 1u);
  const auto welcome = sent(a, key(2), Body::kWelcome);
  ASSERT_EQ(welcome.size(), 1u);
  EXPECT_EQ(welcome[0].welcome().finalized_steps(), 1u);
  EXPECT_EQ(welcome[0].welcome().state().applied_steps(), 1u);
  EXPECT_EQ(welcome[0].welcome().state().state_hash(), hash_of(7));
  EXPECT_EQ(welcome[0].welcome().holders_size(), 0);  // it must bring the checkpoint itself
}

TEST_F(CoordinatorTest, HeartbeatResendsALostRoundStart) {
  start(2);
  // Waiting for round 0 a second after it opened (at +2): the first copy may still be on its
  // way, so nothing yet.
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 0), kT0 + 3).send.empty());
  // Still waiting kRoundStartHealSeconds after the opening: the push was lost.
  auto again = sent(handle(0, heartbeat_msg(0, 0), kT0 + 7), key(0), Body::kRoundStart);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].round_start().step(), 0u);
  EXPECT_DOUBLE_EQ(again[0].round_start().deadline_seconds(), 5.0);  // opened at +2, 10 s
  // The next heartbeats within kRoundStartHealSeconds get no second copy (a coordinator whose
  // sends queue up would otherwise answer every heartbeat of every member with one)...
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 0), kT0 + 8).send.empty());
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 0), kT0 + 11.9).send.empty());
  // ... another member's heal is its own.
  EXPECT_EQ(sent(handle(1, heartbeat_msg(0, 0), kT0 + 8), key(1), Body::kRoundStart).size(), 1u);
  // Training round 0 (waiting for 1): nothing to resend.
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 1), kT0 + 11.9).send.empty());
  // Committed: nothing to resend either.
  commit(0, 0, hash_of(0), kT0 + 11.9);
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 0), kT0 + 11.9).send.empty());
}

// A member whose copies keep not arriving (queued behind a busy coordinator's sends) gets each
// next one after twice the wait of the one before: at 2000 simulated members, a copy every 5 s
// made rounds of 688 s (docs/scaling.md).
TEST_F(CoordinatorTest, HealsOfOneRoundBackOff) {
  options_.network.min_deadline_seconds = 100;
  start(2);  // round 0 opens at +2
  const auto heals = [&](double t) {
    return sent(handle(0, heartbeat_msg(0, 0), kT0 + t), key(0), Body::kRoundStart).size();
  };
  EXPECT_EQ(heals(7), 1u);     // 5 s in
  EXPECT_EQ(heals(12.5), 0u);  // 5.5 s later: the second waits 10
  EXPECT_EQ(heals(17.5), 1u);
  EXPECT_EQ(heals(35), 0u);  // 17.5 s later: the third waits 20
  EXPECT_EQ(heals(38), 1u);
  EXPECT_EQ(heals(60), 0u);  // the fourth waits 40
  EXPECT_EQ(heals(79), 1u);
}

TEST_F(CoordinatorTest, ResumeResendsWhatIsOutstanding) {
  options_.network.overlap = 1;
  start(3);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);
  commit(2, 0, hash_of(2), t);  // round 0 closes; round 1 opens
  handle(0, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)}), t);
  commit(1, 1, hash_of(3), t + 1);

  // The coordinator dies; a new one loads the state 100 s later.
  RunState saved = state();
  StateMachine again(options_, saved);
  const double later = t + 100;
  Actions a = again.resume(later);
  // Round 1: members 0 and 2 have not committed; member 1 has.
  EXPECT_EQ(sent(a, key(0), Body::kRoundStart).size(), 1u);
  EXPECT_EQ(sent(a, key(1), Body::kRoundStart).size(), 0u);
  auto start2 = sent(a, key(2), Body::kRoundStart);
  ASSERT_EQ(start2.size(), 1u);
  EXPECT_EQ(start2[0].round_start().step(), 1u);
  EXPECT_DOUBLE_EQ(start2[0].round_start().deadline_seconds(), 10.0);  // pushed out
  // Step 0: members 1 and 2 have not witnessed.
  EXPECT_EQ(sent(a, key(0), Body::kCollect).size(), 0u);
  EXPECT_EQ(sent(a, key(1), Body::kCollect).size(), 1u);
  EXPECT_EQ(sent(a, key(2), Body::kCollect).size(), 1u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.state().members.at(key(i)).last_seen, later);
  // Nobody is dropped for the coordinator's own absence, and the run goes on.
  again.tick(later + 1);
  EXPECT_EQ(again.state().members.at(key(2)).state, MemberState::kActive);
  EXPECT_EQ(again.state().round->step, 1u);
}

}  // namespace
}  // namespace agora::coord
