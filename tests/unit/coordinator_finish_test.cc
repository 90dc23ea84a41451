// The coordinator's checkpointer role and the end of a run (issue 19): the role passes on when
// its holder goes, gaps in the run's checkpoints are reported, and members are released only
// when nobody is behind and the final checkpoint is on record, or the grace period passed.
#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

wire::Envelope checkpoint_msg(uint64_t applied, const std::string& state_hash) {
  wire::Envelope e;
  e.mutable_checkpoint_report()->set_applied_steps(applied);
  e.mutable_checkpoint_report()->set_state_hash(state_hash);
  e.mutable_checkpoint_report()->set_path("ckpt/checkpoint");
  return e;
}

// The Finished messages `a` sends to member `i`.
std::vector<wire::Finished> finished_to(const Actions& a, const PublicKey& to) {
  std::vector<wire::Finished> out;
  for (const wire::Envelope& e : sent(a, to, Body::kFinished)) out.push_back(e.finished());
  return out;
}

class CoordinatorFinishTest : public CoordinatorTest {
 protected:
  // Members 0..n-1 train every step; returns the actions of the last one (which finishes).
  Actions run_to_end(int n) {
    start(n);
    std::vector<int> all;
    for (int i = 0; i < n; ++i) all.push_back(i);
    Actions last;
    for (uint64_t t = 0; t < options_.total_steps; ++t) last = full_round(t, all, at(t));
    EXPECT_EQ(state().phase, Phase::kFinished);
    return last;
  }
  double at(uint64_t t) const { return kT0 + 3 + static_cast<double>(t); }
  double end() const { return at(options_.total_steps - 1); }  // when the last step finalized
};

TEST_F(CoordinatorFinishTest, TheRoleGoesToTheLongestServingActiveMemberWhenItsHolderLeaves) {
  start(3);
  ASSERT_TRUE(member(0).checkpointer);
  EXPECT_FALSE(member(1).checkpointer);
  full_round(0, {0, 1, 2}, at(0));
  Actions a = handle(0, leave_msg(), at(1));
  EXPECT_FALSE(member(0).checkpointer);
  // Members 1 and 2 joined at the same time: the key order breaks the tie, the same on every
  // replay.
  const int heir = key(1) < key(2) ? 1 : 2;
  EXPECT_TRUE(member(heir).checkpointer);
  EXPECT_FALSE(member(3 - heir).checkpointer);
  EXPECT_TRUE(logged(a, EventKind::kCheckpoint, key(heir)));
  EXPECT_EQ(std::get<std::string>(*logged_field(a, EventKind::kCheckpoint, "reason")), "handoff");
  // The next RoundStart says who holds it.
  const Actions opened = full_round(1, {1, 2}, at(2));
  ASSERT_TRUE(state().round.has_value());
  for (int i : {1, 2}) {
    const auto starts = sent(opened, key(i), Body::kRoundStart);
    ASSERT_EQ(starts.size(), 1u);
    EXPECT_EQ(starts[0].round_start().checkpointer(), i == heir);
  }
  // Joining again, the old holder does not take the role back: one is network.checkpointers.
  a = handle(0, join_msg(ids_[0]), at(3));
  EXPECT_FALSE(sent(a, key(0), Body::kWelcome).at(0).welcome().checkpointer());
}

TEST_F(CoordinatorFinishTest, ASilentHolderLosesTheRole) {
  start(2);
  ASSERT_TRUE(member(0).checkpointer);
  handle(1, heartbeat_msg(0, 0), kT0 + 14);
  sm_->tick(kT0 + 16);  // member 0 silent past heartbeat_timeout_seconds = 15
  EXPECT_EQ(member(0).state, MemberState::kDropped);
  EXPECT_TRUE(member(1).checkpointer);
}

TEST_F(CoordinatorFinishTest, MissingCheckpointStepsAreReportedAsAGap) {
  options_.total_steps = 40;
  options_.checkpoint_interval = 10;
  start(2);
  for (uint64_t t = 0; t < 35; ++t) full_round(t, {0, 1}, at(t));
  Actions a = handle(0, checkpoint_msg(10, state_hash_for("x")), at(35));
  EXPECT_FALSE(logged_field(a, EventKind::kCheckpoint, "missing").has_value());
  // 20 and 30 were written by nobody.
  a = handle(0, checkpoint_msg(34, state_hash_for("y")), at(35));
  const auto missing = logged_field(a, EventKind::kCheckpoint, "missing");
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(std::get<uint64_t>(*missing), 2u);
  EXPECT_EQ(std::get<uint64_t>(*logged_field(a, EventKind::kCheckpoint, "from")), 10u);
  EXPECT_EQ(std::get<uint64_t>(*logged_field(a, EventKind::kCheckpoint, "to")), 34u);
  // No multiple between 34 and 35: no gap.
  a = handle(0, checkpoint_msg(35, state_hash_for("z")), at(35));
  EXPECT_FALSE(logged_field(a, EventKind::kCheckpoint, "missing").has_value());
}

TEST_F(CoordinatorFinishTest, MembersLingerUntilCaughtUpAndCheckpointed) {
  options_.total_steps = 3;
  const Actions a = run_to_end(2);
  for (int i = 0; i < 2; ++i) {
    const auto f = finished_to(a, key(i));
    ASSERT_EQ(f.size(), 1u);
    EXPECT_TRUE(f[0].linger());
    EXPECT_EQ(f[0].checkpointer(), member(i).checkpointer);
  }
  EXPECT_FALSE(sm_->released());
  // Both applied every step; no checkpoint yet: still lingering.
  handle(0, heartbeat_msg(3, 3), end());
  handle(1, heartbeat_msg(3, 3), end());
  EXPECT_FALSE(sm_->released());
  EXPECT_TRUE(sm_->tick(end() + 1).send.empty());
  // The checkpointer reports the final state: everyone is released at once.
  const Actions done = handle(0, checkpoint_msg(3, state_hash_for("final")), end() + 2);
  EXPECT_TRUE(sm_->released());
  for (int i = 0; i < 2; ++i) {
    const auto f = finished_to(done, key(i));
    ASSERT_EQ(f.size(), 1u);
    EXPECT_FALSE(f[0].linger());
  }
  EXPECT_EQ(std::get<std::string>(*logged_field(done, EventKind::kPhase, "reason")), "complete");
}

TEST_F(CoordinatorFinishTest, AMemberBehindIsServedAndCanAskForSets) {
  options_.total_steps = 3;
  run_to_end(2);
  handle(0, checkpoint_msg(3, state_hash_for("final")), end());
  handle(0, heartbeat_msg(3, 3), end());
  handle(1, heartbeat_msg(1, 3), end());  // member 1 is two steps behind
  EXPECT_FALSE(sm_->released());
  wire::Envelope ask;
  ask.mutable_get_finalized()->set_step(1);
  const auto sets = sent(handle(1, ask, end() + 1), key(1), Body::kFinalized);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0].finalized().step(), 1u);
  EXPECT_EQ(sets[0].finalized().set_size(), 2);
  const Actions done = handle(1, heartbeat_msg(3, 3), end() + 2);
  EXPECT_TRUE(sm_->released());
  const auto told = finished_to(done, key(1));
  ASSERT_EQ(told.size(), 1u);  // the release, not also the repeat the heartbeat would get
  EXPECT_FALSE(told[0].linger());
}

TEST_F(CoordinatorFinishTest, AHolderLostAtTheEndIsReplacedBeforeTheRelease) {
  options_.total_steps = 3;
  run_to_end(3);
  ASSERT_TRUE(member(0).checkpointer);
  handle(1, heartbeat_msg(3, 3), end() + 10);
  handle(2, heartbeat_msg(3, 3), end() + 10);
  // Member 0 dies before writing the final checkpoint.
  const Actions a = sm_->tick(end() + 16);
  EXPECT_EQ(member(0).state, MemberState::kDropped);
  const int heir = key(1) < key(2) ? 1 : 2;
  const auto told = finished_to(a, key(heir));
  ASSERT_EQ(told.size(), 1u);
  EXPECT_TRUE(told[0].checkpointer());
  EXPECT_TRUE(told[0].linger());
  EXPECT_FALSE(sm_->released());
  handle(heir, checkpoint_msg(3, state_hash_for("final")), end() + 17);
  EXPECT_TRUE(sm_->released());
}

TEST_F(CoordinatorFinishTest, TheGracePeriodReleasesWhatNeverCompletes) {
  options_.total_steps = 3;
  options_.network.finish_grace_seconds = 30;
  run_to_end(2);
  handle(0, heartbeat_msg(3, 3), end() + 29);
  handle(1, heartbeat_msg(2, 3), end() + 29);  // never catches up; no checkpoint either
  EXPECT_FALSE(sm_->released());
  const Actions a = sm_->tick(end() + 30.5);
  EXPECT_TRUE(sm_->released());
  EXPECT_EQ(std::get<std::string>(*logged_field(a, EventKind::kPhase, "reason")), "grace_passed");
  EXPECT_FALSE(std::get<bool>(*logged_field(a, EventKind::kPhase, "checkpointed")));
  EXPECT_FALSE(finished_to(a, key(0)).at(0).linger());
}

TEST_F(CoordinatorFinishTest, NoCheckpointersMeansNoWaitForOne) {
  options_.total_steps = 2;
  options_.network.checkpointers = 0;
  run_to_end(2);
  handle(0, heartbeat_msg(2, 2), end());
  EXPECT_FALSE(sm_->released());
  handle(1, heartbeat_msg(2, 2), end());
  EXPECT_TRUE(sm_->released());
}

// Round `t`: all three commit; members 0 and 1 hold only each other's payload (member 2's is
// unreachable), member 2 holds all three.
Actions unreachable_round(StateMachine& sm, uint64_t t, double now,
                          const std::vector<Identity>& ids, const std::string& run_id) {
  std::vector<std::string> hashes;
  for (int i = 0; i < 3; ++i) {
    hashes.push_back(hash_of(static_cast<int>(t % 10) * 3 + i));
    sm.handle(ids[i].public_key(), commit_msg(ids[i], run_id, t, hashes.back()), now);
  }
  sm.handle(ids[0].public_key(), witness_msg(t, {hashes[0], hashes[1]}), now);
  sm.handle(ids[1].public_key(), witness_msg(t, {hashes[0], hashes[1]}), now);
  return sm.handle(ids[2].public_key(), witness_msg(t, hashes), now);
}

TEST_F(CoordinatorFinishTest, AnUnreachableMemberIsNotStruckForWhatNobodyCouldFetch) {
  start(3);
  sm_->set_probing(key(2));  // the service probes it as it joins
  unreachable_round(*sm_, 0, at(0), ids_, options_.run_id);
  EXPECT_EQ(member(2).strikes, 0);  // its reachability was not known yet
  // The probe answers while round 1 is open: relayed from round 2 on, which alone tells it.
  ASSERT_EQ(state().round->step, 1u);
  sm_->set_relayed(key(2), true, "no answer", at(1));
  EXPECT_TRUE(sm_->is_relayed(key(2)));
  unreachable_round(*sm_, 1, at(1), ids_, options_.run_id);
  EXPECT_EQ(member(2).strikes, 0);
  // From round 2 on it was told to upload: a payload that still reaches nobody is its own fault.
  const Actions a = unreachable_round(*sm_, 2, at(2), ids_, options_.run_id);
  EXPECT_EQ(member(2).strikes, 1);
  // And member lists say it is relayed.
  const auto starts = sent(a, key(0), Body::kRoundStart);
  ASSERT_EQ(starts.size(), 1u);
  for (const wire::Member& m : starts[0].round_start().members()) {
    EXPECT_EQ(m.relayed(), m.key() == key(2));
  }
}

}  // namespace
}  // namespace agora::coord
