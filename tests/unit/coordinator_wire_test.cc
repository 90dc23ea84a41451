// The coordinator's messages in their compact forms (issue 41, docs/scaling.md): a broadcast
// built once and shared, whose encoding followed by the member's own part parses as the whole;
// and witnesses as bits over the Collect, which decide exactly what lists of hashes decide.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "agora/core/list_bits.h"
#include "agora/net/envelope.h"
#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using namespace testing_support;

wire::Envelope witness_bits(uint64_t step, const std::string& bits) {
  wire::Envelope e;
  e.mutable_witness()->set_step(step);
  e.mutable_witness()->set_of_collect(bits);
  return e;
}

// What the member reads off the wire: the shared encoding, then its own (service.cc).
wire::Envelope on_the_wire(const Outgoing& o) {
  std::string bytes = o.shared ? net::encode_envelope(*o.shared) : std::string();
  bytes += net::encode_envelope(o.message);
  wire::Envelope parsed;
  EXPECT_TRUE(parsed.ParseFromString(bytes));
  return parsed;
}

TEST_F(CoordinatorTest, SharedMessagesParseAsTheWholeAndAreBuiltOnce) {
  Actions opened = start(3);
  std::set<const wire::Envelope*> common;
  for (const Outgoing& o : opened.send) {
    if (o.body_case() != Body::kRoundStart) continue;
    ASSERT_NE(o.shared, nullptr);
    common.insert(o.shared.get());
    const wire::Envelope whole = on_the_wire(o);
    EXPECT_EQ(whole.SerializeAsString(), o.merged().SerializeAsString());
    // The whole: the common part (every member) and this member's own share and deadline.
    EXPECT_EQ(whole.round_start().members_size(), 3);
    EXPECT_EQ(count_of(whole.round_start()), 4u);
    EXPECT_GT(whole.round_start().deadline_seconds(), 0.0);
    EXPECT_EQ(o.message.round_start().members_size(), 0) << "the member list is shared";
  }
  EXPECT_EQ(common.size(), 1u) << "one RoundStart body for the round";
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(1), t);
  Actions closed = commit(2, 0, hash_of(2), t);
  std::set<const wire::Envelope*> collects;
  for (const Outgoing& o : closed.send) {
    if (o.body_case() != Body::kCollect) continue;
    collects.insert(o.shared.get());
    EXPECT_EQ(on_the_wire(o).collect().commits_size(), 3);
  }
  EXPECT_EQ(collects.size(), 1u);
  EXPECT_FALSE(collects.contains(nullptr));
}

// A healed copy shares the round's common part until what it lists changes: a joiner since
// the round opened is in the next copy's `joining`.
TEST_F(CoordinatorTest, AHealedRoundStartListsWhoJoinedSince) {
  options_.network.min_deadline_seconds = 100;
  start(2);  // round 0 opens at +2
  const Actions last = full_round(0, {0, 1}, kT0 + 3);  // final: round 1 opens at +3
  ASSERT_EQ(state().round->step, 1u);
  const auto opened = std::find_if(last.send.begin(), last.send.end(), [&](const Outgoing& o) {
    return o.body_case() == Body::kRoundStart;
  });
  ASSERT_NE(opened, last.send.end());
  auto heal = [&](double t) {
    Actions a = handle(0, heartbeat_msg(1, 1), kT0 + t);
    return std::find_if(a.send.begin(), a.send.end(), [](const Outgoing& o) {
      return o.body_case() == Body::kRoundStart;
    })->shared;
  };
  const auto first = heal(8.5);  // 5 s into round 1
  EXPECT_EQ(first.get(), opened->shared.get()) << "nothing changed: the same common part";
  EXPECT_EQ(first->round_start().joining_size(), 0);
  handle(2, join_msg(ids_[2]), kT0 + 9);  // steps are final: it joins syncing
  const auto second = heal(19);
  EXPECT_NE(second.get(), first.get());
  ASSERT_EQ(second->round_start().joining_size(), 1);
  EXPECT_EQ(second->round_start().joining(0).key(), key(2));
}

// The same round decided from hashes and from bits: the same final set, strikes and counters.
TEST_F(CoordinatorTest, WitnessBitsDecideWhatHashesDecide) {
  auto decide = [&](bool bits) {
    start(4);
    const double t = kT0 + 3;
    for (int i = 0; i < 4; ++i) commit(i, 0, hash_of(i), t);
    // Commits are in author-key order, which is member order here. Member 0 holds all; member
    // 1 all but 3's; member 2 only its own and 0's; member 3 never answers.
    const std::vector<std::vector<int>> holds = {{0, 1, 2, 3}, {0, 1, 2}, {0, 2}};
    for (int w = 0; w < 3; ++w) {
      std::vector<std::string> hashes;
      std::string set = list_bits(4);
      for (int i : holds[w]) {
        hashes.push_back(hash_of(i));
        set_list_bit(set, static_cast<size_t>(i));
      }
      handle(w, bits ? witness_bits(0, set) : witness_msg(0, hashes), t + 1);
    }
    sm_->tick(t + 1 + options_.network.witness_seconds);
    EXPECT_EQ(state().finalized_steps(), 1u);
    std::vector<std::string> final_set;
    for (const CommitRecord& c : state().finalized.at(0)) final_set.push_back(c.payload_hash);
    std::vector<int64_t> strikes;
    for (int i = 0; i < 4; ++i) strikes.push_back(member(i).strikes);
    return std::make_tuple(final_set, strikes, state().counters.payloads_final,
                           state().counters.witness_disagreements);
  };
  const auto from_hashes = decide(false);
  const auto from_bits = decide(true);
  EXPECT_EQ(from_hashes, from_bits);
  // Payload 1: held by 0 of the 2 others that answered (0 and 2), not more than half: not final,
  // no strike (1 missing of 3 others). Payload 3: held by 0 alone of the 3 that answered: not
  // final, and missing for 2 of its 3 others: a strike.
  EXPECT_EQ(std::get<0>(from_bits), (std::vector<std::string>{hash_of(0), hash_of(2)}));
  EXPECT_EQ(std::get<1>(from_bits), (std::vector<int64_t>{0, 0, 0, 1}));
}

// Two authors may commit the same bytes; a witness that lists that hash holds both commits.
TEST_F(CoordinatorTest, AHashListedHoldsEveryCommitThatNamesIt) {
  start(3);
  const double t = kT0 + 3;
  commit(0, 0, hash_of(0), t);
  commit(1, 0, hash_of(0), t);  // the same payload as member 0's
  commit(2, 0, hash_of(2), t);
  handle(2, witness_msg(0, {hash_of(0)}), t + 1);
  EXPECT_EQ(state().collecting.at(0).witnessed.at(key(2)), std::string(1, '\x03'));
}

TEST_F(CoordinatorTest, MalformedWitnessBitsAreIgnoredAndNamed) {
  start(3);
  const double t = kT0 + 3;
  for (int i = 0; i < 3; ++i) commit(i, 0, hash_of(i), t);
  wire::Envelope both = witness_bits(0, std::string(1, '\x07'));
  both.mutable_witness()->add_held(hash_of(0));
  for (const wire::Envelope& bad : {witness_bits(0, std::string(2, '\x07')),  // 2 bytes for 3
                                    witness_bits(0, std::string(1, '\x0f')),  // a padding bit
                                    witness_bits(0, std::string()), both}) {
    Actions a = handle(1, bad, t + 1);
    EXPECT_EQ(logged_field(a, EventKind::kIgnored, "reason"),
              std::optional<obs::LogValue>(std::string("malformed_witness")));
    EXPECT_FALSE(state().collecting.at(0).witnessed.contains(key(1)));
  }
  handle(1, witness_bits(0, std::string(1, '\x07')), t + 1);
  EXPECT_EQ(state().collecting.at(0).witnessed.at(key(1)), std::string(1, '\x07'));
}

}  // namespace
}  // namespace agora::coord
