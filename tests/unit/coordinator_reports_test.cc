// The coordinator's hash reports and checkpoint reports against a member that lies (issue 13,
// item 3): what it refuses, what a joiner is handed, what stays bounded.
#include <limits>

#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

// The "reason" key of the newest `kind` event about member `i`, or "" when there is none.
std::string reason_of(const Actions& a, EventKind kind) {
  const auto v = logged_field(a, kind, "reason");
  return v ? std::get<std::string>(*v) : "";
}

class CoordinatorReportsTest : public CoordinatorTest {
 protected:
  // Members 0..n-1 train `steps` steps with hash_interval 2.
  void run(int n, uint64_t steps) {
    options_.network.hash_interval = 2;
    start(n);
    std::vector<int> all;
    for (int i = 0; i < n; ++i) all.push_back(i);
    for (uint64_t t = 0; t < steps; ++t) full_round(t, all, kT0 + 3 + static_cast<double>(t));
    ASSERT_EQ(state().finalized_steps(), steps);
  }
};

TEST_F(CoordinatorReportsTest, ReportsNoHonestPeerSendsAreRefused) {
  run(3, 4);
  const auto refused = [&](const wire::Envelope& report, const std::string& reason) {
    const uint64_t before = state().counters.state_reports_refused;
    const Actions a = handle(0, report, kT0 + 20);
    EXPECT_EQ(state().counters.state_reports_refused, before + 1) << reason;
    EXPECT_EQ(reason_of(a, EventKind::kIgnored), reason);
    EXPECT_TRUE(logged(a, EventKind::kIgnored, key(0)));
  };
  // Ahead of the ledger: the 2^64 - 2 that every joiner used to be handed.
  refused(state_report_msg(std::numeric_limits<uint64_t>::max() - 1, hash_of(1)), "ahead");
  refused(state_report_msg(5, hash_of(1)), "ahead");
  // Not on the schedule (multiples of hash_interval = 2, or a state handed out).
  refused(state_report_msg(3, hash_of(1)), "off_schedule");
  // An empty tensor list; names and hashes of different lengths; a name twice.
  wire::Envelope empty = state_report_msg(4, hash_of(1));
  empty.mutable_state_report()->mutable_state()->clear_tensor_names();
  empty.mutable_state_report()->mutable_state()->clear_tensor_hashes();
  empty.mutable_state_report()->mutable_state()->set_state_hash(blake2b256_bytes(""));
  refused(empty, "malformed");
  wire::Envelope uneven = state_report_msg(4, hash_of(1));
  uneven.mutable_state_report()->mutable_state()->add_tensor_names("v");
  refused(uneven, "malformed");
  wire::Envelope twice = state_report_msg(4, hash_of(1));
  twice.mutable_state_report()->mutable_state()->add_tensor_names("w");
  twice.mutable_state_report()->mutable_state()->add_tensor_hashes(hash_of(2));
  twice.mutable_state_report()->mutable_state()->set_state_hash(
      blake2b256_bytes(hash_of(1) + hash_of(2)));
  refused(twice, "malformed");
  // A state hash that is not that of its tensor hashes.
  wire::Envelope forged = state_report_msg(4, hash_of(1));
  forged.mutable_state_report()->mutable_state()->set_state_hash(hash_of(3));
  refused(forged, "inconsistent");
  EXPECT_FALSE(state().state_reports.contains(3));
  EXPECT_FALSE(state().state_reports.contains(5));
  EXPECT_FALSE(state().state_reports.contains(std::numeric_limits<uint64_t>::max() - 1));
  EXPECT_EQ(member(0).applied_steps, 0u);
  // The honest report of the same step is taken.
  handle(1, state_report_msg(4, hash_of(1)), kT0 + 20);
  ASSERT_TRUE(state().state_reports.contains(4));
  EXPECT_EQ(state().state_reports.at(4).reported.size(), 1u);
  EXPECT_EQ(state().counters.state_reports_refused, 7u);
}

TEST_F(CoordinatorReportsTest, HugeStepsDoNotEvictHonestReports) {
  run(3, 2);
  for (int i = 0; i < 3; ++i) handle(i, state_report_msg(2, hash_of(1)), kT0 + 20);
  for (uint64_t k = 0; k < 8; ++k) {
    handle(0, state_report_msg(std::numeric_limits<uint64_t>::max() - 2 * k, hash_of(9)), kT0 + 21);
  }
  ASSERT_TRUE(state().state_reports.contains(2));
  EXPECT_EQ(state().state_reports.at(2).reported.size(), 3u);
  EXPECT_EQ(state().state_reports.rbegin()->first, 2u);
}

TEST_F(CoordinatorReportsTest, AJoinerIsHandedOnlyAStateAQuorumReported) {
  run(4, 4);
  for (int i = 0; i < 4; ++i) handle(i, state_report_msg(2, hash_of(1)), kT0 + 20);
  // Member 0 reports a consistent record of parameters of its own, first, at the newest step.
  handle(0, state_report_msg(4, hash_of(9)), kT0 + 20);
  auto w = sent(handle(4, join_msg(ids_[4]), kT0 + 21), key(4), Body::kWelcome);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].welcome().state().applied_steps(), 2u);
  EXPECT_EQ(w[0].welcome().state().state_hash(), state_hash_for(hash_of(1)));
  EXPECT_EQ(w[0].welcome().holders_size(), 4);
  // Once three of the four active members reported step 4 alike, that is handed out.
  handle(4, leave_msg(), kT0 + 22);
  handle(1, state_report_msg(4, hash_of(1)), kT0 + 22);
  handle(2, state_report_msg(4, hash_of(1)), kT0 + 22);
  w = sent(handle(4, join_msg(ids_[4]), kT0 + 23), key(4), Body::kWelcome);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].welcome().state().applied_steps(), 2u);  // 2 of 4 is not more than half
  handle(4, leave_msg(), kT0 + 24);
  const Actions a = handle(3, state_report_msg(4, hash_of(1)), kT0 + 24);
  EXPECT_EQ(sent(a, key(0), Body::kResync).size(), 1u);  // the odd one out is told
  w = sent(handle(4, join_msg(ids_[4]), kT0 + 25), key(4), Body::kWelcome);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].welcome().state().applied_steps(), 4u);
  EXPECT_EQ(w[0].welcome().state().state_hash(), state_hash_for(hash_of(1)));
  EXPECT_EQ(w[0].welcome().holders_size(), 3);
}

TEST_F(CoordinatorReportsTest, WithoutAQuorumForAnyStateAJoinerIsAskedToComeBack) {
  run(2, 2);
  handle(0, state_report_msg(0, hash_of(1)), kT0 + 20);
  handle(1, state_report_msg(0, hash_of(2)), kT0 + 20);
  const Actions a = handle(2, join_msg(ids_[2]), kT0 + 21);
  EXPECT_TRUE(sent(a, key(2), Body::kWelcome).empty());
  const auto refused = sent(a, key(2), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(refused[0].refused().may_rejoin());
  EXPECT_FALSE(state().members.contains(key(2)));
}

TEST_F(CoordinatorReportsTest, OneMemberCannotGrowTheRecordsKept) {
  run(2, 2);
  for (int i = 0; i < 200; ++i) handle(0, state_report_msg(2, hash_of(i % 26)), kT0 + 20);
  handle(1, state_report_msg(2, hash_of(1)), kT0 + 20);
  EXPECT_LE(state().state_reports.at(2).records.size(), 2u);
  EXPECT_EQ(state().state_reports.at(2).reported.size(), 2u);
}

TEST_F(CoordinatorReportsTest, CheckpointReportsMustMatchTheRun) {
  run(3, 4);
  for (int i = 0; i < 3; ++i) handle(i, state_report_msg(2, hash_of(1)), kT0 + 20);
  ASSERT_TRUE(member(0).checkpointer);
  ASSERT_FALSE(member(1).checkpointer);
  const auto report = [](uint64_t k, const std::string& hash) {
    wire::Envelope e;
    e.mutable_checkpoint_report()->set_applied_steps(k);
    e.mutable_checkpoint_report()->set_state_hash(hash);
    e.mutable_checkpoint_report()->set_path("ckpt/checkpoint");
    return e;
  };
  EXPECT_EQ(reason_of(handle(0, report(2, hash_of(5)), kT0 + 21), EventKind::kIgnored),
            "wrong_hash");
  EXPECT_EQ(reason_of(handle(0, report(9, hash_of(5)), kT0 + 21), EventKind::kIgnored), "ahead");
  EXPECT_EQ(
      reason_of(handle(1, report(2, state_hash_for(hash_of(1))), kT0 + 21), EventKind::kIgnored),
      "not_checkpointer");
  EXPECT_EQ(state().counters.checkpoints_refused, 3u);
  EXPECT_TRUE(state().checkpoints.empty());
  // The right hash is taken, and a repeat replaces rather than piles up.
  handle(0, report(2, state_hash_for(hash_of(1))), kT0 + 22);
  handle(0, report(2, state_hash_for(hash_of(1))), kT0 + 23);
  ASSERT_EQ(state().checkpoints.size(), 1u);
  EXPECT_EQ(state().checkpoints[0].at, kT0 + 23);
}

}  // namespace
}  // namespace agora::coord
