// What one member can make the coordinator keep, send or decide (issue 13, items 5 and 7 and
// the medium items): bounded events, membership, endpoints, and witnesses that lie.
#include "agora/coord/admit_batch.h"
#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

std::optional<std::string> reason_of(const Actions& a, EventKind kind) {
  const auto v = logged_field(a, kind, "reason");
  if (!v) return std::nullopt;
  return std::get<std::string>(*v);
}

// ---- events ------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, ARepeatedWitnessWithThousandsOfRejectionsRecordsLittle) {
  start(3);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);
  commit(2, 0, hash_of(2), t);
  ASSERT_EQ(state().collecting.size(), 1u);
  wire::Envelope w = witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)});
  for (int i = 0; i < 30; ++i) {  // authors nobody committed are ignored
    wire::Rejection* r = w.mutable_witness()->add_rejected();
    r->set_author(Identity::generate().public_key());
    r->set_reason("no");
  }
  for (int i = 0; i < 2000; ++i) {
    wire::Rejection* r = w.mutable_witness()->add_rejected();
    r->set_author(key(i % 2 == 0 ? 1 : 2));
    r->set_reason("no");
  }
  const uint64_t events = state().counters.events;
  for (int repeat = 0; repeat < 100; ++repeat) handle(0, w, t + 1);
  // One rejection per committed author other than the witness, once.
  EXPECT_EQ(state().counters.rejections_reported, 2u);
  EXPECT_EQ(state().counters.witnesses, 1u);
  EXPECT_EQ(state().counters.witnesses_repeated, 99u);
  EXPECT_LE(state().counters.events - events, 2u);
}

TEST_F(CoordinatorTest, IgnoredMessagesOfOneMemberAreCappedPerRound) {
  start(2);
  const uint64_t events = state().counters.events;
  Actions last;
  for (int i = 0; i < 1000; ++i) last = handle(0, witness_msg(7, {}), kT0 + 3);
  EXPECT_EQ(state().counters.events - events, kMaxMemberEventsPerRound + 1);
  EXPECT_EQ(state().counters.events_suppressed, 1000u - kMaxMemberEventsPerRound);
  EXPECT_TRUE(last.log.empty());
  // The other member's events are its own.
  EXPECT_TRUE(logged(handle(1, witness_msg(7, {}), kT0 + 3), EventKind::kIgnored, key(1)));
}

// ---- membership --------------------------------------------------------------------------------

TEST_F(CoordinatorTest, JoinersBeyondMaxMembersAreRefused) {
  options_.network.max_members = 3;
  make();
  for (int i = 0; i < 3; ++i) handle(i, join_msg(ids_[i]), kT0);
  const Actions a = handle(3, join_msg(ids_[3]), kT0);
  const auto refused = sent(a, key(3), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_FALSE(refused[0].refused().may_rejoin());
  EXPECT_NE(refused[0].refused().reason().find("network.max_members = 3"), std::string::npos);
  EXPECT_EQ(reason_of(a, EventKind::kRejection), "full");
  EXPECT_FALSE(state().members.contains(key(3)));
  // A member already in may rejoin; once one leaves, the newcomer fits.
  EXPECT_EQ(sent(handle(0, join_msg(ids_[0]), kT0 + 1), key(0), Body::kWelcome).size(), 1u);
  handle(2, leave_msg(), kT0 + 1);
  EXPECT_EQ(sent(handle(3, join_msg(ids_[3]), kT0 + 2), key(3), Body::kWelcome).size(), 1u);
}

TEST_F(CoordinatorTest, MembersLongGoneAreForgotten) {
  options_.network.max_members = 4;
  options_.network.min_peers = 1;
  make();
  std::vector<Identity> visitors;
  for (int i = 0; i < 20; ++i) {
    visitors.push_back(Identity::generate());
    sm_->handle(visitors.back().public_key(), join_msg(visitors.back()), kT0 + i);
    sm_->handle(visitors.back().public_key(), leave_msg(), kT0 + i);
  }
  sm_->tick(kT0 + 30);
  EXPECT_LE(state().members.size(), 4u);
  // The newest stay.
  EXPECT_TRUE(state().members.contains(visitors.back().public_key()));
}

TEST_F(CoordinatorTest, AJoinAdvertisingAnotherMembersEndpointIsRefused) {
  make();
  handle(0, join_msg(ids_[0]), kT0);
  const Actions a = handle(1, join_msg(ids_[1], 0, endpoint_of(ids_[0])), kT0);
  const auto refused = sent(a, key(1), Body::kRefused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(reason_of(a, EventKind::kRejection), "endpoint_taken");
  EXPECT_FALSE(state().members.contains(key(1)));
  // Spelled in capitals, it is the same host.
  std::string upper = endpoint_of(ids_[0]);
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(sent(handle(1, join_msg(ids_[1], 0, upper), kT0), key(1), Body::kRefused).size(), 1u);
  // The owner rejoining with its own endpoint is welcome; the other with its own too.
  EXPECT_EQ(sent(handle(0, join_msg(ids_[0]), kT0 + 1), key(0), Body::kWelcome).size(), 1u);
  EXPECT_EQ(sent(handle(1, join_msg(ids_[1]), kT0 + 1), key(1), Body::kWelcome).size(), 1u);
  // Once the owner is gone, the endpoint is free (a peer restarted with a new key).
  handle(0, leave_msg(), kT0 + 2);
  EXPECT_EQ(
      sent(handle(2, join_msg(ids_[2], 0, endpoint_of(ids_[0])), kT0 + 2), key(2), Body::kWelcome)
          .size(),
      1u);
}

// Peers' servers answer only keys the coordinator listed to them: a joiner is listed to every
// current member at once (Admit), also when no RoundStart would list it (a paused run).
TEST_F(CoordinatorTest, AJoinerIsAdmittedToEveryCurrentMemberAtOnce) {
  make();
  handle(0, join_msg(ids_[0]), kT0);
  handle(1, join_msg(ids_[1]), kT0);
  const Actions a = handle(2, join_msg(ids_[2]), kT0 + 1);
  for (int member : {0, 1}) {
    const auto admits = sent(a, key(member), Body::kAdmit);
    ASSERT_EQ(admits.size(), 1u) << member;
    ASSERT_EQ(admits[0].admit().joining_size(), 1);
    EXPECT_EQ(admits[0].admit().joining(0).key(), key(2));
    EXPECT_EQ(admits[0].admit().joining(0).endpoint(), endpoint_of(ids_[2]));
  }
  EXPECT_TRUE(sent(a, key(2), Body::kAdmit).empty()) << "the joiner is not told about itself";
  // Its Join again (a lost Welcome, a retry): it is on every list already, so only the Welcome
  // goes out. Each retry of each joiner cost one message per member, which at 1000 members
  // kept the coordinator too busy to answer the joins it retried (docs/scaling.md).
  const Actions again = handle(2, join_msg(ids_[2]), kT0 + 2);
  EXPECT_EQ(sent(again, key(2), Body::kWelcome).size(), 1u);
  for (int member : {0, 1}) EXPECT_TRUE(sent(again, key(member), Body::kAdmit).empty()) << member;
  // One that left is gone from the members' lists: its return is told to them.
  handle(2, leave_msg(), kT0 + 3);
  const Actions back = handle(2, join_msg(ids_[2]), kT0 + 4);
  for (int member : {0, 1}) EXPECT_EQ(sent(back, key(member), Body::kAdmit).size(), 1u) << member;
}

// The service sends a batch's Admits as one per member (coord/admit_batch.h): joiners in order,
// every other message where it was.
TEST_F(CoordinatorTest, ABatchOfJoinsIsOneAdmitPerMember) {
  make();
  handle(0, join_msg(ids_[0]), kT0);
  Actions batch;
  for (int joiner : {1, 2, 3}) {
    Actions a = handle(joiner, join_msg(ids_[joiner]), kT0 + 1);
    for (auto& o : a.send) batch.send.push_back(std::move(o));
  }
  ASSERT_EQ(sent(batch, key(0), Body::kAdmit).size(), 3u);
  const size_t welcomes = sent(batch, key(3), Body::kWelcome).size();
  coalesce_admits(batch.send);
  const auto admits = sent(batch, key(0), Body::kAdmit);
  ASSERT_EQ(admits.size(), 1u);
  ASSERT_EQ(admits[0].admit().joining_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(admits[0].admit().joining(i).key(), key(i + 1));
  // Member 1 heard of 2 and 3, member 2 of 3; the Welcomes are untouched.
  ASSERT_EQ(sent(batch, key(1), Body::kAdmit).size(), 1u);
  EXPECT_EQ(sent(batch, key(1), Body::kAdmit)[0].admit().joining_size(), 2);
  EXPECT_EQ(sent(batch, key(2), Body::kAdmit)[0].admit().joining_size(), 1);
  EXPECT_EQ(sent(batch, key(3), Body::kWelcome).size(), welcomes);
}

// ---- witnesses ---------------------------------------------------------------------------------

// Members 0, 1, 2 commit step 0 (payload i from member i); the round closes.
class WitnessRuleTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    start(3);
    for (int i = 0; i < 3; ++i) commit(i, 0, hash_of(i), kT0 + 3);
    ASSERT_EQ(state().collecting.size(), 1u);
  }
  bool is_final(int author) const {
    for (const CommitRecord& c : state().finalized.at(0)) {
      if (c.author == key(author)) return true;
    }
    return false;
  }
};

TEST_F(WitnessRuleTest, AnAuthorAndOneLyingWitnessCannotFinalizeAPayload) {
  // Member 1 vouches for member 0's payload; member 2, honest, could not get it.
  handle(0, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)}), kT0 + 4);
  handle(1, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)}), kT0 + 4);
  handle(2, witness_msg(0, {hash_of(1), hash_of(2)}), kT0 + 4);
  ASSERT_EQ(state().finalized_steps(), 1u);
  EXPECT_FALSE(is_final(0));
  EXPECT_TRUE(is_final(1));
  EXPECT_TRUE(is_final(2));
  // One of two accusers is no strict majority: no strike either.
  EXPECT_EQ(member(0).strikes, 0);
  EXPECT_EQ(state().counters.witness_disagreements, 1u);  // member 1's vouching
}

TEST_F(WitnessRuleTest, OneMissingReportWithTheOtherWitnessSilentStrikesNobody) {
  handle(0, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)}), kT0 + 4);
  handle(1, witness_msg(0, {hash_of(1), hash_of(2)}), kT0 + 4);  // lies about member 0
  sm_->tick(kT0 + 4 + options_.network.witness_seconds);         // member 2 never answers
  ASSERT_EQ(state().finalized_steps(), 1u);
  EXPECT_FALSE(is_final(0));
  EXPECT_EQ(member(0).strikes, 0);
  EXPECT_TRUE(is_final(1));  // held by member 0, the one other that answered
}

TEST_F(WitnessRuleTest, APayloadMissingForTheMajorityStrikesItsAuthor) {
  handle(0, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 4);
  handle(1, witness_msg(0, {hash_of(0), hash_of(1)}), kT0 + 4);
  const Actions a = handle(2, witness_msg(0, {hash_of(0), hash_of(1), hash_of(2)}), kT0 + 4);
  EXPECT_FALSE(is_final(2));
  EXPECT_EQ(member(2).strikes, 1);
  EXPECT_TRUE(logged(a, EventKind::kStrike, key(2)));
}

TEST_F(CoordinatorTest, TwoHonestMembersStillFinalize) {
  start(2);
  full_round(0, {0, 1}, kT0 + 3);
  ASSERT_EQ(state().finalized_steps(), 1u);
  EXPECT_EQ(state().finalized[0].size(), 2u);
  EXPECT_EQ(state().counters.witness_disagreements, 0u);
}

}  // namespace
}  // namespace agora::coord
