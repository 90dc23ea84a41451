// The coordinator's state machine, transition by transition. Time is the `now` each call passes;
// nothing here sleeps or reads a clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine.h"
#include "agora/core/error.h"
#include "agora/net/identity.h"

namespace agora::coord {
namespace {

using net::Identity;
using Body = wire::Envelope::BodyCase;

constexpr double kT0 = 1'700'000'000.0;  // an epoch time, like the service passes

std::string hash_of(int i) {
  return std::string(32, static_cast<char>('a' + i));
}

wire::Envelope join_msg(const Identity& id, double sps = 0.0,
                        std::string endpoint = "tcp://127.0.0.1:7500") {
  wire::Envelope e;
  e.mutable_join()->set_key(id.public_key());
  e.mutable_join()->set_endpoint(endpoint);
  e.mutable_join()->set_agent("agora test");
  e.mutable_join()->set_sequences_per_second(sps);
  return e;
}

wire::Envelope commit_msg(const Identity& signer, const std::string& run_id, uint64_t step,
                          const std::string& hash, uint64_t sequences = 0, double seconds = 0.0) {
  wire::Envelope e;
  wire::CommitRecord* r = e.mutable_commit()->mutable_record();
  r->set_author(signer.public_key());
  r->set_step(step);
  r->set_payload_hash(hash);
  r->set_signature(signer.sign(net::commit_signing_bytes(run_id, step, hash)));
  e.mutable_commit()->set_sequences(sequences);
  e.mutable_commit()->set_compute_seconds(seconds);
  return e;
}

wire::Envelope witness_msg(uint64_t step, const std::vector<std::string>& held) {
  wire::Envelope e;
  e.mutable_witness()->set_step(step);
  for (const std::string& h : held) e.mutable_witness()->add_held(h);
  return e;
}

wire::Envelope heartbeat_msg(uint64_t applied, uint64_t next_round) {
  wire::Envelope e;
  e.mutable_heartbeat()->set_applied_steps(applied);
  e.mutable_heartbeat()->set_next_round(next_round);
  return e;
}

wire::Envelope state_report_msg(uint64_t applied, const std::string& state_hash) {
  wire::Envelope e;
  wire::StateRecord* s = e.mutable_state_report()->mutable_state();
  s->set_applied_steps(applied);
  s->set_state_hash(state_hash);
  s->add_tensor_names("w");
  s->add_tensor_hashes(hash_of(20));
  return e;
}

wire::Envelope leave_msg() {
  wire::Envelope e;
  e.mutable_leave();
  return e;
}

// Messages of kind `body` that `actions` sends to `to`.
std::vector<wire::Envelope> sent(const Actions& actions, const net::PublicKey& to, Body body) {
  std::vector<wire::Envelope> out;
  for (const Outgoing& o : actions.send) {
    if (o.to == to && o.message.body_case() == body) out.push_back(o.message);
  }
  return out;
}

size_t count_kind(const Actions& actions, Body body) {
  return std::count_if(actions.send.begin(), actions.send.end(),
                       [&](const Outgoing& o) { return o.message.body_case() == body; });
}

bool logged(const Actions& actions, const std::string& part) {
  return std::any_of(actions.log.begin(), actions.log.end(),
                     [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

std::vector<SequenceRange> ranges_of(const wire::RoundStart& start) {
  std::vector<SequenceRange> out;
  for (const auto& r : start.assignment()) out.push_back({r.first(), r.count()});
  return out;
}

uint64_t count_of(const wire::RoundStart& start) {
  return total_count(ranges_of(start));
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 5; ++i) ids_.push_back(Identity::generate());
    // Key order decides the split's tie-breaks; sort so that ids_[0] < ids_[1] < ...
    std::sort(ids_.begin(), ids_.end(),
              [](const Identity& a, const Identity& b) { return a.public_key() < b.public_key(); });
    options_.run_id = "0123abcd";
    options_.run_config_toml = "seed = 1\n";
    options_.total_steps = 10;
    options_.batch_size = 12;
    options_.network.min_peers = 2;
    options_.network.warmup_seconds = 2.0;
    options_.network.overlap = 0;
    options_.network.deadline_factor = 3.0;
    options_.network.min_deadline_seconds = 10.0;
    options_.network.witness_seconds = 10.0;
    options_.network.heartbeat_timeout_seconds = 15.0;
    options_.network.max_strikes = 3;
    options_.network.hash_interval = 10;
    options_.network.quorum = 0.5;
    options_.network.checkpointers = 1;
  }

  void make() { sm_ = std::make_unique<StateMachine>(options_, RunState{}); }
  const net::PublicKey& key(int i) const { return ids_[i].public_key(); }
  const RunState& state() const { return sm_->state(); }
  const Member& member(int i) const { return state().members.at(key(i)); }

  Actions handle(int i, const wire::Envelope& e, double now) { return sm_->handle(key(i), e, now); }
  Actions commit(int i, uint64_t step, const std::string& hash, double now) {
    return handle(i, commit_msg(ids_[i], options_.run_id, step, hash), now);
  }

  // Joins members 0..n-1 at kT0 and ticks past the warmup: round 0 is open. Returns the tick.
  Actions start(int n, double sps = 0.0) {
    make();
    for (int i = 0; i < n; ++i) handle(i, join_msg(ids_[i], sps), kT0);
    Actions opened = sm_->tick(kT0 + options_.network.warmup_seconds);
    EXPECT_EQ(state().phase, Phase::kTraining);
    EXPECT_TRUE(state().round.has_value());
    return opened;
  }

  // Every member in `committers` commits step `step`, then every committer witnesses every
  // payload. Returns the actions of the last witness (which finalizes the step).
  Actions full_round(uint64_t step, const std::vector<int>& committers, double now) {
    std::vector<std::string> hashes;
    for (int i : committers) {
      hashes.push_back(hash_of(static_cast<int>(step % 10) + i));
      commit(i, step, hashes.back(), now);
    }
    Actions last;
    for (int i : committers) last = handle(i, witness_msg(step, hashes), now);
    return last;
  }

  Options options_;
  std::vector<Identity> ids_;
  std::unique_ptr<StateMachine> sm_;
};

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
  EXPECT_EQ(member(0).endpoint, "tcp://127.0.0.1:7500");
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

TEST(CoordinatorAssignmentTest, SharesSumToTheTotalWithLargestRemainders) {
  EXPECT_EQ(proportional_shares(10, {1, 1, 1}), (std::vector<uint64_t>{4, 3, 3}));
  EXPECT_EQ(proportional_shares(7, {3, 3, 1}), (std::vector<uint64_t>{3, 3, 1}));
  EXPECT_EQ(proportional_shares(2, {1, 1, 1, 1}), (std::vector<uint64_t>{1, 1, 0, 0}));
  EXPECT_EQ(proportional_shares(0, {1, 2}), (std::vector<uint64_t>{0, 0}));
  for (uint64_t total : {1u, 13u, 97u, 1000u}) {
    auto s = proportional_shares(total, {0.3, 7.1, 2.2, 1e-3});
    uint64_t sum = 0;
    for (uint64_t v : s) sum += v;
    EXPECT_EQ(sum, total);
  }
  EXPECT_THROW(proportional_shares(3, {}), Error);
  EXPECT_THROW(proportional_shares(3, {1.0, 0.0}), Error);
}

TEST(CoordinatorAssignmentTest, UnknownThroughputCountsAsTheMedian) {
  EXPECT_EQ(throughput_weights({0, 0}), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(throughput_weights({4, 0, 2, 10}), (std::vector<double>{4, 4, 2, 10}));
  EXPECT_EQ(throughput_weights({4, 0, 2}), (std::vector<double>{4, 3, 2}));
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
      EXPECT_TRUE(logged(closed, "dropped"));
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
  // Payload 0: held by all. Payload 1: by its author and member 0 (2 of 3 > 1.5). Payload 2:
  // only by its author (1 of 3): not final.
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), t + 1);
  wire::Envelope w1 = witness_msg(0, {hash_of(0), hash_of(1)});
  wire::Rejection* rej = w1.mutable_witness()->add_rejected();
  rej->set_author(key(2));
  rej->set_reason("payload does not decode");
  Actions a = handle(1, w1, t + 1);
  EXPECT_TRUE(logged(a, "payload does not decode"));
  EXPECT_EQ(state().finalized_steps(), 0u);  // member 2 has not witnessed yet
  Actions fin = handle(2, witness_msg(0, {hash_of(0), hash_of(2), hash_of(9)}), t + 2);
  ASSERT_EQ(state().finalized_steps(), 1u);
  ASSERT_EQ(state().finalized[0].size(), 2u);
  EXPECT_EQ(state().finalized[0][0].payload_hash, hash_of(0));
  EXPECT_EQ(state().finalized[0][1].payload_hash, hash_of(1));
  for (int i = 0; i < 3; ++i) {
    auto f = sent(fin, key(i), Body::kFinalized);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].finalized().set_size(), 2);
  }
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
  handle(2, witness_msg(0, {hash_of(0)}), t + 10);
  sm_->tick(t + 18.9);
  EXPECT_EQ(state().finalized_steps(), 0u);  // member 1 may still witness
  sm_->tick(t + 19);
  ASSERT_EQ(state().finalized_steps(), 1u);
  // Payload 0: its author and member 2; payload 1: its author and member 0. 2 of 3 > 1.5.
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
  EXPECT_TRUE(sm_->tick(t + 100).send.empty());
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
  handle(0, state_report_msg(10, hash_of(0)), kT0 + 5);
  Actions a = handle(1, state_report_msg(10, hash_of(1)), kT0 + 5);
  EXPECT_EQ(count_kind(a, Body::kResync), 0u);  // 1 vs 1: no strict majority
  a = handle(2, state_report_msg(10, hash_of(0)), kT0 + 5);
  auto resync = sent(a, key(1), Body::kResync);
  ASSERT_EQ(resync.size(), 1u);
  EXPECT_EQ(count_kind(a, Body::kResync), 1u);
  EXPECT_EQ(resync[0].resync().state().applied_steps(), 10u);
  EXPECT_EQ(resync[0].resync().state().state_hash(), hash_of(0));
  EXPECT_EQ(resync[0].resync().state().tensor_names(0), "w");
  ASSERT_EQ(resync[0].resync().holders_size(), 2);
  EXPECT_EQ(resync[0].resync().holders(0).key(), key(0));
  EXPECT_EQ(resync[0].resync().holders(0).endpoint(), "tcp://127.0.0.1:7500");
  EXPECT_EQ(resync[0].resync().holders(1).key(), key(2));
  // At most once per member per step.
  a = handle(1, state_report_msg(10, hash_of(1)), kT0 + 6);
  EXPECT_EQ(count_kind(a, Body::kResync), 0u);
  EXPECT_EQ(state().counters.resyncs_sent, 1u);
}

TEST_F(CoordinatorTest, WelcomeHandsOutTheNewestMajorityState) {
  start(3);
  handle(0, state_report_msg(0, hash_of(5)), kT0 + 5);
  handle(0, state_report_msg(10, hash_of(0)), kT0 + 5);
  handle(1, state_report_msg(10, hash_of(1)), kT0 + 5);
  handle(2, state_report_msg(10, hash_of(1)), kT0 + 5);
  auto w = sent(handle(3, join_msg(ids_[3]), kT0 + 6), key(3), Body::kWelcome);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].welcome().state().applied_steps(), 10u);
  EXPECT_EQ(w[0].welcome().state().state_hash(), hash_of(1));
  ASSERT_EQ(w[0].welcome().holders_size(), 2);
  EXPECT_EQ(w[0].welcome().holders(0).key(), key(1));
  EXPECT_EQ(w[0].welcome().holders(1).key(), key(2));
  // Only the newest few steps are kept.
  for (uint64_t k = 20; k <= 60; k += 10) handle(0, state_report_msg(k, hash_of(0)), kT0 + 7);
  EXPECT_EQ(state().state_reports.size(), kMaxStateReportSteps);
  EXPECT_EQ(state().state_reports.begin()->first, 30u);
}

TEST_F(CoordinatorTest, CheckpointReportsAreRecorded) {
  start(2);
  wire::Envelope e;
  e.mutable_checkpoint_report()->set_applied_steps(10);
  e.mutable_checkpoint_report()->set_state_hash(hash_of(0));
  e.mutable_checkpoint_report()->set_path("runs/x/step_10.safetensors");
  Actions a = handle(0, e, kT0 + 5);
  EXPECT_TRUE(logged(a, "checkpoint"));
  ASSERT_EQ(state().checkpoints.size(), 1u);
  EXPECT_EQ(state().checkpoints[0].reporter, key(0));
  EXPECT_EQ(state().checkpoints[0].path, "runs/x/step_10.safetensors");
}

// ---- healing and restarts ----------------------------------------------------------------------

TEST_F(CoordinatorTest, HeartbeatResendsALostRoundStart) {
  start(2);
  // Waiting for round 0 while round 0 is open: the push was lost.
  auto again = sent(handle(0, heartbeat_msg(0, 0), kT0 + 5), key(0), Body::kRoundStart);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].round_start().step(), 0u);
  EXPECT_DOUBLE_EQ(again[0].round_start().deadline_seconds(), 7.0);  // opened at +2, 10 s
  // Training round 0 (waiting for 1): nothing to resend.
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 1), kT0 + 5).send.empty());
  // Committed: nothing to resend either.
  commit(0, 0, hash_of(0), kT0 + 6);
  EXPECT_TRUE(handle(0, heartbeat_msg(0, 0), kT0 + 6).send.empty());
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

TEST_F(CoordinatorTest, EventsAreRecordedAndBounded) {
  make();
  for (int i = 0; i < 300; ++i) sm_->handle(key(0), heartbeat_msg(0, 0), kT0 + i);
  EXPECT_EQ(state().events.size(), kMaxEvents);
  EXPECT_EQ(state().events.back().seq, 300u);
  EXPECT_EQ(state().events.back().at, kT0 + 299);
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
