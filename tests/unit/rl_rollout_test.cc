// Rollouts on the wire and the learner's intake: every field a worker sends, checked.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "agora/core/error.h"
#include "agora/core/little_endian.h"
#include "agora/rl/rollout.h"
#include "agora/rl/rollout_intake.h"
#include "agora/rl/task.h"

namespace agora {
namespace {

Rollout sample_rollout() {
  Rollout r;
  r.task = "arithmetic";
  r.task_seed = 1;
  r.problem_id = 42;
  r.policy_version = 7;
  r.sample = 3;
  r.tokens = {264, 262, 261, 2};
  r.logprobs = {-0.5f, -0.0f, -2.25f, -1e-7f};
  return r;
}

TEST(Rollout, RoundTripsExactly) {
  const Rollout r = sample_rollout();
  const std::string bytes = encode_rollout(r);
  EXPECT_EQ(bytes.size(), kRolloutHeaderBytes + 8 * r.tokens.size());
  EXPECT_EQ(decode_rollout(bytes, RolloutLimits{}), r);
  for (const std::string& task : task_names()) {
    Rollout c = r;
    c.task = task;
    EXPECT_EQ(decode_rollout(encode_rollout(c), RolloutLimits{}), c) << task;
  }
}

TEST(Rollout, EveryBadFieldIsAnError) {
  const std::string good = encode_rollout(sample_rollout());
  auto expect_error = [](const std::string& bytes, const std::string& says, RolloutLimits l = {}) {
    try {
      decode_rollout(bytes, l);
      ADD_FAILURE() << "accepted; expected an error saying " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error(good.substr(0, 10), "shorter than the 40-byte header");
  std::string b = good;
  b[0] = 'X';
  expect_error(b, "bad magic");
  b = good;
  b[4] = 2;
  expect_error(b, "version 2");
  b = good;
  b[6] = 9;
  expect_error(b, "task code 9");
  b = good;
  b[7] = 1;
  expect_error(b, "reserved byte");
  b = good;
  store_le32(0, reinterpret_cast<uint8_t*>(b.data()) + 36);
  expect_error(b, "0 tokens");
  b = good;
  store_le32(0xFFFFFFFFu, reinterpret_cast<uint8_t*>(b.data()) + 36);  // no allocation follows
  expect_error(b, "4294967295 tokens");
  expect_error(good + "x", "expected exactly");
  expect_error(good.substr(0, good.size() - 1), "expected exactly");
  RolloutLimits small;
  small.max_tokens = 3;
  expect_error(good, "4 tokens (allowed: 1 to 3)", small);
  RolloutLimits vocab;
  vocab.vocab_size = 263;
  expect_error(good, "token 0 is id 264", vocab);
  for (float bad :
       {0.5f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    Rollout r = sample_rollout();
    r.logprobs[1] = bad;
    expect_error(encode_rollout(r), "log-probability 1");
  }
  Rollout r = sample_rollout();
  r.logprobs.pop_back();
  EXPECT_THROW(encode_rollout(r), Error);
  r = sample_rollout();
  r.task = "chess";
  EXPECT_THROW(encode_rollout(r), Error);
}

IntakeOptions intake_options() {
  IntakeOptions o;
  o.task = "arithmetic";
  o.task_seed = 1;
  o.max_off_policy_steps = 2;
  o.group_size = 4;
  o.strikes_to_ban = 3;
  return o;
}

// A claim far below any sampled token's log-probability would make GRPO's ratio overflow.
TEST(Rollout, LogProbabilitiesBelowTheFloorAreRefused) {
  Rollout r = sample_rollout();
  r.logprobs[0] = -60.0f;
  const std::string bytes = encode_rollout(r);
  RolloutLimits limits;
  EXPECT_EQ(decode_rollout(bytes, limits), r);  // the default floor accepts any finite value
  limits.min_logprob = kMinRolloutLogprob;
  EXPECT_THROW(decode_rollout(bytes, limits), Error);
  r.logprobs[0] = kMinRolloutLogprob;
  EXPECT_EQ(decode_rollout(encode_rollout(r), limits), r);
}

TEST(RolloutIntake, AcceptsAFreshRolloutOfAnOpenProblemOnce) {
  RolloutIntake intake(intake_options());
  intake.open(42);
  intake.set_version(8);
  const std::string bytes = encode_rollout(sample_rollout());  // version 7: one behind
  const auto first = intake.submit("alice", bytes);
  EXPECT_EQ(first.verdict, IntakeVerdict::kAccepted) << first.reason;
  ASSERT_TRUE(first.rollout);
  EXPECT_EQ(*first.rollout, sample_rollout());
  // The same identity again, from the same worker: a resubmission, struck.
  EXPECT_EQ(intake.submit("alice", bytes).verdict, IntakeVerdict::kDuplicate);
  EXPECT_EQ(intake.strikes("alice"), 1);
  // Another worker's sample 3 of the same problem is its own.
  EXPECT_EQ(intake.submit("bob", bytes).verdict, IntakeVerdict::kAccepted);
  // Once the problem is trained on and closed, a replay is unknown (no strike: honest workers
  // can be late too).
  intake.close(42);
  EXPECT_EQ(intake.submit("carol", bytes).verdict, IntakeVerdict::kUnknown);
  EXPECT_EQ(intake.strikes("carol"), 0);
  EXPECT_EQ(intake.count(IntakeVerdict::kAccepted), 2);
}

TEST(RolloutIntake, RefusesWhatTheRunDidNotAskFor) {
  RolloutIntake intake(intake_options());
  intake.open(42);
  intake.set_version(10);
  Rollout r = sample_rollout();
  EXPECT_EQ(intake.submit("w", encode_rollout(r)).verdict, IntakeVerdict::kStale);  // 3 behind
  r.policy_version = 11;
  EXPECT_EQ(intake.submit("w", encode_rollout(r)).verdict, IntakeVerdict::kFuture);
  r.policy_version = 10;
  r.task_seed = 2;
  EXPECT_EQ(intake.submit("w", encode_rollout(r)).verdict, IntakeVerdict::kWrongTask);
  r = sample_rollout();
  r.policy_version = 10;
  r.problem_id = 43;
  EXPECT_EQ(intake.submit("w", encode_rollout(r)).verdict, IntakeVerdict::kUnknown);
  r.problem_id = 42;
  r.sample = 4;  // the group has samples 0..3
  EXPECT_EQ(intake.submit("w", encode_rollout(r)).verdict, IntakeVerdict::kMalformed);
  EXPECT_EQ(intake.strikes("w"), 1);
}

TEST(RolloutIntake, StrikesBanAWorker) {
  RolloutIntake intake(intake_options());
  intake.open(42);
  intake.set_version(7);
  EXPECT_EQ(intake.submit("mallory", "garbage").verdict, IntakeVerdict::kMalformed);
  intake.strike("mallory", IntakeVerdict::kMismatch);  // the learner's re-scoring disagreed
  EXPECT_FALSE(intake.banned("mallory"));
  intake.strike("mallory", IntakeVerdict::kMismatch);
  EXPECT_TRUE(intake.banned("mallory"));
  EXPECT_EQ(intake.submit("mallory", encode_rollout(sample_rollout())).verdict,
            IntakeVerdict::kBanned);
  EXPECT_EQ(intake.count(IntakeVerdict::kMismatch), 2);
  EXPECT_EQ(intake.submit("honest", encode_rollout(sample_rollout())).verdict,
            IntakeVerdict::kAccepted);
}

}  // namespace
}  // namespace agora
