// The learner's hand-out of (problem, sample) slots: who may answer what, reassignment of
// overdue slots, per-worker caps, and what a banned worker's slots become.
#include "agora/rl/slot_pool.h"

#include <gtest/gtest.h>

#include "agora/core/error.h"
#include "agora/core/token_bucket.h"
#include "agora/rl/rollout.h"

namespace agora {
namespace {

SlotPoolOptions options(uint32_t group, double reassign, uint32_t cap) {
  SlotPoolOptions o;
  o.group_size = group;
  o.reassign_seconds = reassign;
  o.max_slots_per_worker = cap;
  o.max_handouts = 2;
  return o;
}

TEST(RlSlotPool, FreeSlotsGoOutInOrderAndEachOnce) {
  SlotPool pool(options(2, 10, 100));
  pool.open({7, 3});
  ASSERT_EQ(pool.size(), 4u);
  const auto a = pool.hand_out("a", 3, 0);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], (SlotId{3, 0}));
  EXPECT_EQ(a[1], (SlotId{3, 1}));
  EXPECT_EQ(a[2], (SlotId{7, 0}));
  const auto b = pool.hand_out("b", 3, 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0], (SlotId{7, 1}));
  EXPECT_TRUE(pool.held_by("a", {3, 0}));
  EXPECT_FALSE(pool.held_by("b", {3, 0}));  // another worker's slot: refused as unassigned
  EXPECT_FALSE(pool.held_by("a", {9, 0}));  // no such problem
  EXPECT_TRUE(pool.hand_out("c", 5, 2).empty());  // nothing free, nothing overdue yet
}

TEST(RlSlotPool, OverdueSlotsAreHandedAgainAndEitherHolderMayFillThem) {
  SlotPool pool(options(1, 10, 100));
  pool.open({1, 2});
  ASSERT_EQ(pool.hand_out("slow", 2, 0).size(), 2u);
  EXPECT_TRUE(pool.hand_out("fast", 2, 9.9).empty());
  const auto again = pool.hand_out("fast", 1, 10);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(pool.held_by("fast", again[0]));
  EXPECT_TRUE(pool.held_by("slow", again[0]));
  pool.fill(again[0]);
  EXPECT_FALSE(pool.held_by("slow", again[0]));  // filled: a late answer is unassigned
  EXPECT_EQ(pool.filled(), 1u);
  EXPECT_FALSE(pool.complete());
  pool.fill({2, 0});
  EXPECT_TRUE(pool.complete());
  pool.fill({2, 0});  // twice counts once
  EXPECT_EQ(pool.filled(), 2u);
}

TEST(RlSlotPool, AWorkerHoldsAtMostItsCapOfSlotsThatAreNotOverdue) {
  SlotPool pool(options(4, 10, 3));
  pool.open({1});
  EXPECT_EQ(pool.hand_out("greedy", 100, 0).size(), 3u);
  EXPECT_TRUE(pool.hand_out("greedy", 100, 5).empty());  // at its cap
  EXPECT_EQ(pool.holding("greedy", 5), 3u);
  pool.answered("greedy", {1, 0});
  pool.answered("greedy", {1, 1});
  // Overdue slots stop counting (a restarted worker gets work): the free slot first, then the
  // overdue one it never answered (its answer was lost), never the two it answered.
  EXPECT_EQ(pool.holding("greedy", 10), 0u);
  EXPECT_EQ(pool.hand_out("greedy", 100, 10), (std::vector<SlotId>{{1, 3}, {1, 2}}));
  // b takes the two answered-but-unfilled slots; c finds nothing free or overdue.
  EXPECT_EQ(pool.hand_out("b", 100, 11), (std::vector<SlotId>{{1, 0}, {1, 1}}));
  EXPECT_TRUE(pool.hand_out("c", 100, 12).empty());
  // Later everything is overdue again, but max_handouts (2) is reached for all but slot 3.
  EXPECT_EQ(pool.hand_out("c", 100, 25), (std::vector<SlotId>{{1, 3}}));
  EXPECT_TRUE(pool.held_by("greedy", {1, 3}));  // a late answer from a first holder still counts
}

TEST(RlSlotPool, ReleasedAndForgottenSlotsGoBackToOthers) {
  SlotPool pool(options(2, 1000, 100));
  pool.open({5});
  ASSERT_EQ(pool.hand_out("cheat", 2, 0).size(), 2u);
  pool.answered("cheat", {5, 0});
  pool.release("cheat", {5, 0});  // its rollout failed re-scoring
  EXPECT_FALSE(pool.held_by("cheat", {5, 0}));
  // Not back to the worker that answered it (a resubmission would be struck as a duplicate).
  EXPECT_TRUE(pool.hand_out("cheat", 5, 1).empty());
  EXPECT_EQ(pool.hand_out("honest", 5, 1), (std::vector<SlotId>{{5, 0}}));
  pool.forget("cheat");  // banned
  EXPECT_EQ(pool.hand_out("honest", 5, 2), (std::vector<SlotId>{{5, 1}}));
  pool.open({6});  // the next step forgets the last
  EXPECT_FALSE(pool.held_by("honest", {5, 0}));
  EXPECT_EQ(pool.size(), 2u);
}

TEST(RlSlotPool, BadOptionsAreErrors) {
  EXPECT_THROW(SlotPool(options(0, 1, 1)), Error);
  SlotPoolOptions o;
  o.max_handouts = 0;
  EXPECT_THROW(SlotPool{o}, Error);
}

TEST(RlRolloutSigning, TheRunIdIsPartOfWhatIsSigned) {
  const std::string a = rollout_signing_bytes("run-a", "bytes");
  EXPECT_EQ(a, std::string("agora/rollout/v1") + std::string("\x05\x00", 2) + "run-a" + "bytes");
  EXPECT_NE(a, rollout_signing_bytes("run-b", "bytes"));
  // The length prefix: ("ab", "c...") and ("a", "bc...") sign different bytes.
  EXPECT_NE(rollout_signing_bytes("ab", "c"), rollout_signing_bytes("a", "bc"));
}

TEST(TokenBucket, AllowsTheBurstThenTheRate) {
  TokenBucket b;
  int taken = 0;
  for (int i = 0; i < 100; ++i) taken += b.take(10, 5, 100.0);
  EXPECT_EQ(taken, 5);
  EXPECT_FALSE(b.take(10, 5, 100.05));  // half a token
  EXPECT_TRUE(b.take(10, 5, 100.15));
  EXPECT_FALSE(b.take(10, 5, 99.0));  // a clock going backwards gives nothing
}

}  // namespace
}  // namespace agora
