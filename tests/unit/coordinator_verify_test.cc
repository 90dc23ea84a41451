// Spot checks (coord/spot_checks.h): the draw, who verifies, how verdicts decide, and what the
// state machine does with it (the strategy commitment a commit must carry, SpotCheck messages,
// dropping a member that failed).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "agora/coord/spot_checks.h"
#include "coordinator_test_support.h"

namespace agora::coord {
namespace {

using testing_support::Body;
using testing_support::CoordinatorTest;
using testing_support::kT0;
using Outcome = wire::Verdict::Outcome;

std::string key_of(int i) {
  return std::string(32, static_cast<char>('A' + i));
}

VerifyConfig config(double rate, int64_t max_failures = 2) {
  return {.rate = rate, .seconds = 30, .max_failures = max_failures, .window = 4};
}

// A seed source that counts, so every draw is known and different.
std::function<std::string()> counting_seeds() {
  auto n = std::make_shared<int>(0);
  return [n] { return std::string(32, static_cast<char>(++*n)); };
}

// Members 0..n-1 committed `step`; every member is current unless in `gone`.
struct Round {
  explicit Round(SpotChecks& checks, int n, uint64_t step = 5) : checks(checks), step(step) {
    for (int i = 0; i < n; ++i) {
      checks.remember(step, key_of(i),
                      {std::string(32, 'p'), 4, 0.5, std::string(32, 'b'), std::string(32, 'a')});
      committed[key_of(i)].author.set_key(key_of(i));
      committed[key_of(i)].author.set_endpoint("tcp://h:1");
      committed[key_of(i)].ranges = {{static_cast<uint64_t>(10 * i), 3}};
    }
  }
  SpotChecks::Output close(double now = 0) {
    return checks.close(step, committed, others, current, now);
  }
  SpotChecks::Output verdict(const std::string& from, const std::string& author, Outcome o,
                             double now = 0) {
    wire::Verdict v;
    v.set_step(step);
    v.set_author(author);
    v.set_outcome(o);
    return checks.on_verdict(from, v, current, now);
  }

  SpotChecks& checks;
  uint64_t step;
  std::map<PublicKey, Contribution> committed;
  std::set<PublicKey> others;  // active members that did not commit
  std::set<PublicKey> gone;
  std::function<bool(const PublicKey&)> current = [this](const PublicKey& k) {
    return !gone.contains(k);
  };
};

std::vector<std::string> kinds(const SpotChecks::Output& out) {
  std::vector<std::string> k;
  for (const auto& e : out.events) k.push_back(e.kind);
  return k;
}

// The verifier each author's check was sent to.
std::map<PublicKey, PublicKey> assignments(const SpotChecks::Output& out) {
  std::map<PublicKey, PublicKey> a;
  for (const auto& [to, m] : out.send) a[m.spot_check().author().key()] = to;
  return a;
}

TEST(SpotChecksTest, TheDrawFollowsTheRateAndTheSeed) {
  const std::string seed_a(32, 'x'), seed_b(32, 'y');
  int drawn = 0, differ = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const std::string author = key_of(i % 50);
    const uint64_t step = static_cast<uint64_t>(i / 50);
    const bool a = SpotChecks::drawn(seed_a, step, author, 0.25);
    drawn += a;
    differ += a != SpotChecks::drawn(seed_b, step, author, 0.25);
    EXPECT_FALSE(SpotChecks::drawn(seed_a, step, author, 0.0));
    EXPECT_TRUE(SpotChecks::drawn(seed_a, step, author, 1.0));
  }
  // Binomial(4000, 0.25): sd 27; 5 sd either side.
  EXPECT_NEAR(drawn, n / 4, 140);
  EXPECT_GT(differ, n / 5);  // another seed draws other contributions
}

TEST(SpotChecksTest, ALargerShareIsDrawnInProportion) {
  EXPECT_DOUBLE_EQ(SpotChecks::share_rate(0.05, 25, 100, 4), 0.05);  // the mean share
  EXPECT_DOUBLE_EQ(SpotChecks::share_rate(0.05, 90, 100, 4), 0.18);
  EXPECT_DOUBLE_EQ(SpotChecks::share_rate(0.5, 90, 100, 4), 1.0);
  EXPECT_DOUBLE_EQ(SpotChecks::share_rate(0.05, 5, 100, 4), 0.05);  // smaller: at the rate
  // Through the draw: author 0 holds 90 of 100 sequences, the others 5, 3 and 2.
  auto n = std::make_shared<uint64_t>(0);
  SpotChecks checks(config(0.05), [n] { return blake2b256_bytes(std::to_string(++*n)); });
  std::map<PublicKey, int> drawn;
  const int rounds = 3000;
  for (int r = 0; r < rounds; ++r) {
    Round round(checks, 4, static_cast<uint64_t>(r + 1));
    const uint64_t shares[] = {90, 5, 3, 2};
    for (int i = 0; i < 4; ++i) round.committed[key_of(i)].ranges = {{0, shares[i]}};
    for (const auto& [author, verifier] : assignments(round.close())) ++drawn[author];
    checks.forget_open();
  }
  // Binomial(3000, 0.18): sd 21; Binomial(3000, 0.05): sd 12.
  EXPECT_NEAR(drawn[key_of(0)], 0.18 * rounds, 105);
  EXPECT_NEAR(drawn[key_of(1)], 0.05 * rounds, 60);
}

TEST(SpotChecksTest, EveryContributionGoesToAnotherCommitterAndTheWorkIsSpread) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 4);
  const auto out = round.close();
  ASSERT_EQ(out.send.size(), 4u);
  std::map<PublicKey, int> load;
  std::set<std::string> samples;
  for (const auto& [to, m] : out.send) {
    const wire::SpotCheck& c = m.spot_check();
    EXPECT_EQ(c.sample().size(), 32u);
    samples.insert(c.sample());
    EXPECT_NE(to, c.author().key());
    EXPECT_EQ(c.step(), 5u);
    EXPECT_EQ(c.apply_through(), 4u);
    EXPECT_EQ(c.attempt(), 1u);
    EXPECT_EQ(c.strategy_before(), std::string(32, 'b'));
    EXPECT_EQ(c.strategy_after(), std::string(32, 'a'));
    ASSERT_EQ(c.ranges_size(), 1);
    EXPECT_EQ(c.ranges(0).first(), round.committed.at(c.author().key()).ranges[0].first);
    ++load[to];
  }
  for (const auto& [verifier, n] : load) EXPECT_EQ(n, 1) << "fewest open checks first";
  EXPECT_EQ(samples.size(), 4u) << "each check samples its own tensors";
  EXPECT_EQ(out.events.front().kind, "drawn");
  EXPECT_EQ(out.events.front().checks, 4u);
  EXPECT_EQ(checks.open_checks(), 4u);
}

TEST(SpotChecksTest, NothingIsDrawnWithoutACommitmentOrAnotherMember) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round alone(checks, 1);
  EXPECT_TRUE(alone.close().send.empty());
  EXPECT_EQ(checks.open_checks(), 0u);
  Round round(checks, 3, 6);
  round.committed[key_of(7)].author.set_key(key_of(7));  // committed, but no commitment known
  const auto out = round.close();
  EXPECT_EQ(out.send.size(), 3u);
  EXPECT_FALSE(assignments(out).contains(key_of(7)));
}

TEST(SpotChecksTest, AMemberThatTookTheWholeBatchIsCheckedByTheOthers) {
  // Only member 0 committed (it was handed every sequence); 1 and 2 had empty shares.
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 1);
  round.others = {key_of(1), key_of(2)};
  const auto a = assignments(round.close());
  ASSERT_EQ(a.size(), 1u);
  EXPECT_TRUE(a.at(key_of(0)) == key_of(1) || a.at(key_of(0)) == key_of(2));
  // Its share is three times the mean over the three members: drawn at three times the rate.
  auto n = std::make_shared<uint64_t>(0);
  SpotChecks often(config(0.2), [n] { return blake2b256_bytes(std::to_string(++*n)); });
  int drawn = 0;
  for (int r = 0; r < 2000; ++r) {
    Round one(often, 1, static_cast<uint64_t>(r + 1));
    one.others = {key_of(1), key_of(2)};
    drawn += static_cast<int>(assignments(one.close()).size());
    often.forget_open();
  }
  EXPECT_NEAR(drawn, 0.6 * 2000, 110);  // Binomial(2000, 0.6): sd 22
  // Nobody else current: nothing to ask.
  Round late(checks, 1, 9);
  late.others = {key_of(1)};
  late.gone = {key_of(1)};
  const auto out = late.close();
  EXPECT_TRUE(out.send.empty());
}

TEST(SpotChecksTest, AnAgreeingVerdictPasses) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 3);
  const auto a = assignments(round.close());
  const auto out = round.verdict(a.at(key_of(0)), key_of(0), wire::Verdict::AGREES);
  EXPECT_EQ(kinds(out), (std::vector<std::string>{"verdict", "passed"}));
  EXPECT_EQ(checks.open_checks(), 2u);
  EXPECT_EQ(out.events.back().claimed_seconds, 0.5);  // what the author's commit said
  EXPECT_EQ(checks.failures(key_of(0)), 0);
}

TEST(SpotChecksTest, TwoDisagreeingVerdictsFailTheAuthorAndEnoughFailuresDropIt) {
  SpotChecks checks(config(1.0, /*max_failures=*/1), counting_seeds());
  Round round(checks, 3);
  const auto closed = round.close();
  const auto a = assignments(closed);
  const PublicKey first = a.at(key_of(0));
  std::string first_sample;
  for (const auto& [to, m] : closed.send) {
    if (m.spot_check().author().key() == key_of(0)) first_sample = m.spot_check().sample();
  }
  const auto second_ask = round.verdict(first, key_of(0), wire::Verdict::DISAGREES);
  EXPECT_EQ(kinds(second_ask), (std::vector<std::string>{"verdict", "assigned"}));
  ASSERT_EQ(second_ask.send.size(), 1u);
  const PublicKey second = second_ask.send[0].first;
  EXPECT_NE(second, first);
  EXPECT_NE(second, key_of(0));
  EXPECT_EQ(second_ask.send[0].second.spot_check().attempt(), 2u);
  // A second opinion compares the same tensors as the first (else two honest verifiers could
  // split over a member that bent one tensor).
  EXPECT_EQ(second_ask.send[0].second.spot_check().sample(), first_sample);
  const auto out = round.verdict(second, key_of(0), wire::Verdict::DISAGREES);
  EXPECT_EQ(kinds(out), (std::vector<std::string>{"verdict", "author_failed"}));
  EXPECT_EQ(out.drop, std::vector<PublicKey>{key_of(0)});
  EXPECT_EQ(checks.failures(key_of(0)), 1);
  EXPECT_EQ(checks.failures(first), 0);
}

TEST(SpotChecksTest, AFalseAccusationIsOverruledAndCostsTheAccuser) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 4);
  const auto a = assignments(round.close());
  const PublicKey liar = a.at(key_of(0));
  const auto ask = round.verdict(liar, key_of(0), wire::Verdict::DISAGREES);
  const PublicKey second = ask.send.at(0).first;
  const auto out = round.verdict(second, key_of(0), wire::Verdict::AGREES);
  // One against one: a third decides.
  ASSERT_EQ(kinds(out), (std::vector<std::string>{"verdict", "assigned"}));
  const PublicKey third = out.send.at(0).first;
  EXPECT_EQ(out.send.at(0).second.spot_check().attempt(), 3u);
  const auto decided = round.verdict(third, key_of(0), wire::Verdict::AGREES);
  EXPECT_EQ(kinds(decided), (std::vector<std::string>{"verdict", "passed", "verifier_failed"}));
  EXPECT_EQ(decided.events.back().verifier, liar);
  EXPECT_EQ(checks.failures(liar), 1);
  EXPECT_EQ(checks.failures(key_of(0)), 0);
  EXPECT_TRUE(decided.drop.empty());  // max_failures is 2
}

TEST(SpotChecksTest, VerdictsNobodyAskedForChangeNothing) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 3);
  const auto a = assignments(round.close());
  const PublicKey verifier = a.at(key_of(0));
  PublicKey other;
  for (int i = 1; i < 3; ++i)
    if (key_of(i) != verifier) other = key_of(i);
  for (int n = 0; n < 100; ++n) {
    const auto out = round.verdict(other, key_of(0), wire::Verdict::DISAGREES);
    EXPECT_EQ(kinds(out), std::vector<std::string>{"ignored"});
    EXPECT_TRUE(out.send.empty());
  }
  EXPECT_EQ(kinds(round.verdict(verifier, key_of(9), wire::Verdict::DISAGREES)),
            std::vector<std::string>{"ignored"});
  EXPECT_EQ(checks.failures(key_of(0)), 0);
  EXPECT_EQ(kinds(round.verdict(verifier, key_of(0), wire::Verdict::AGREES)),
            (std::vector<std::string>{"verdict", "passed"}));
  // Once decided, a repeat is nobody's business either.
  EXPECT_EQ(kinds(round.verdict(verifier, key_of(0), wire::Verdict::DISAGREES)),
            std::vector<std::string>{"ignored"});
}

TEST(SpotChecksTest, AbstentionsTimeoutsAndDeparturesAskTheNextCandidate) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 4);
  const auto a = assignments(round.close(100));
  const PublicKey first = a.at(key_of(0));
  const auto abstained = round.verdict(first, key_of(0), wire::Verdict::ABSTAINS, 101);
  ASSERT_EQ(abstained.send.size(), 1u);
  const PublicKey second = abstained.send[0].first;
  EXPECT_EQ(abstained.send[0].second.spot_check().attempt(), 1u) << "an abstention is no verdict";
  // The second never answers: after verify.seconds the third is asked.
  EXPECT_TRUE(assignments(checks.tick(5, round.current, 120)).empty());
  auto late = checks.tick(5, round.current, 132);
  ASSERT_EQ(late.send.size(), 4u) << "every check's verifier timed out";
  PublicKey third;
  for (const auto& [to, m] : late.send)
    if (m.spot_check().author().key() == key_of(0)) third = to;
  EXPECT_NE(third, first);
  EXPECT_NE(third, second);
  // It leaves: nobody is left.
  round.gone.insert(third);
  const auto out = checks.tick(5, round.current, 133);
  bool unresolved = false;
  for (const auto& e : out.events) unresolved |= e.kind == "unresolved" && e.author == key_of(0);
  EXPECT_TRUE(unresolved);
}

TEST(SpotChecksTest, ChecksEndWithTheWindowAndWithTheirAuthor) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 3);
  round.close();
  round.gone.insert(key_of(1));
  auto out = checks.tick(5, round.current, 1);
  EXPECT_EQ(out.events.size(), 1u + 1u) << "author 1 left, and a check it was asked went on";
  out = checks.tick(5 + 4, round.current, 2);  // verify.window = 4 rounds later
  EXPECT_EQ(checks.open_checks(), 0u);
  for (const auto& e : out.events) EXPECT_EQ(e.kind, "unresolved");
}

TEST(SpotChecksTest, ARestartedMembersChecksEndOrMoveOn) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 3);
  const auto a = assignments(round.close());
  const PublicKey verifier = a.at(key_of(0));
  const auto out = checks.restarted(
      verifier, [&](const PublicKey& k) { return k != verifier; }, 1);
  // Its own check ends; the check it was asked goes to the next candidate.
  bool ended = false, moved = false;
  for (const auto& e : out.events) {
    ended |= e.kind == "unresolved" && e.author == verifier;
    moved |= e.kind == "assigned" && e.author == key_of(0) && e.verifier != verifier;
  }
  EXPECT_TRUE(ended);
  EXPECT_TRUE(moved);
  EXPECT_EQ(checks.open_checks(), 2u);
}

TEST(SpotChecksTest, AVerifiersOpenWorkIsCountedUntilItAnswers) {
  SpotChecks checks(config(1.0), counting_seeds());
  Round round(checks, 3);
  const auto to = assignments(round.close());
  ASSERT_EQ(to.size(), 3u);
  for (int v = 0; v < 3; ++v) EXPECT_EQ(checks.sequences_newly_asked_of(key_of(v)), 3u);
  EXPECT_EQ(checks.sequences_newly_asked_of(key_of(4)), 0u);
  round.verdict(to.at(key_of(0)), key_of(0), wire::Verdict::AGREES);
  EXPECT_EQ(checks.sequences_newly_asked_of(to.at(key_of(0))), 0u);  // answered
  // Counted once: after a round opened, the open ones no longer weigh on the next.
  checks.round_opened();
  for (int v = 0; v < 3; ++v) EXPECT_EQ(checks.sequences_newly_asked_of(key_of(v)), 0u);
}

// ---- through the state machine -------------------------------------------------------------

std::string strategy_hash(int i) {
  return std::string(32, static_cast<char>('0' + i));
}

class VerifyingCoordinatorTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    options_.verify = config(1.0, 1);
    options_.random_seed = counting_seeds();
  }
  wire::Envelope committed(int i, uint64_t step, const std::string& hash, bool sign = true,
                           uint64_t trained_from = 0) {
    wire::Envelope e = testing_support::commit_msg(ids_[i], options_.run_id, step, hash);
    auto* c = e.mutable_commit();
    c->set_trained_from(trained_from);
    c->set_strategy_before(strategy_hash(i));
    c->set_strategy_after(strategy_hash(i + 5));
    c->set_strategy_signature(ids_[sign ? i : (i + 1) % 5].sign(
        net::strategy_signing_bytes(options_.run_id, step, hash, c->trained_from(),
                                    c->strategy_before(), c->strategy_after())));
    return e;
  }
  wire::Envelope verdict(int author, uint64_t step, Outcome o) {
    wire::Envelope e;
    e.mutable_verdict()->set_step(step);
    e.mutable_verdict()->set_author(key(author));
    e.mutable_verdict()->set_outcome(o);
    return e;
  }
};

TEST_F(VerifyingCoordinatorTest, ACommitMustCarryASignedStrategyCommitment) {
  start(3);
  using testing_support::hash_of;
  handle(0, testing_support::commit_msg(ids_[0], options_.run_id, 0, hash_of(0)), kT0 + 3);
  handle(1, committed(1, 0, hash_of(1), /*sign=*/false), kT0 + 3);
  // Parameters after a step that is not final.
  handle(2, committed(2, 0, hash_of(2), true, /*trained_from=*/1), kT0 + 3);
  EXPECT_EQ(state().counters.commits_rejected, 3u);
  EXPECT_TRUE(state().round->commits.empty());
  handle(0, committed(0, 0, hash_of(0)), kT0 + 3);
  EXPECT_EQ(state().round->commits.size(), 1u);
}

TEST_F(VerifyingCoordinatorTest, ACheatIsCheckedByTwoAndDroppedForGood) {
  start(3);
  using testing_support::hash_of;
  Actions closed;
  for (int i = 0; i < 3; ++i) closed = handle(i, committed(i, 0, hash_of(i)), kT0 + 3);
  // Each contribution went to another committer, with the author's commitment.
  std::map<int, int> verifier_of;
  for (int v = 0; v < 3; ++v) {
    for (const auto& m : testing_support::sent(closed, key(v), Body::kSpotCheck)) {
      const auto& c = m.spot_check();
      const int author = static_cast<int>(
          std::find_if(ids_.begin(), ids_.end(),
                       [&](auto& id) { return id.public_key() == c.author().key(); }) -
          ids_.begin());
      EXPECT_NE(author, v);
      EXPECT_EQ(c.strategy_before(), strategy_hash(author));
      EXPECT_EQ(c.payload_hash(), hash_of(author));
      EXPECT_EQ(c.author().endpoint(), testing_support::endpoint_of(ids_[author]));
      verifier_of[author] = v;
    }
  }
  ASSERT_EQ(verifier_of.size(), 3u);
  EXPECT_EQ(testing_support::logged_field(closed, EventKind::kVerify, "check"),
            std::optional<obs::LogValue>(std::string("drawn")));
  // Author 2 cheated: its verifier disagrees, so does the second one.
  const Actions second = handle(verifier_of[2], verdict(2, 0, wire::Verdict::DISAGREES), kT0 + 4);
  int second_verifier = -1;
  for (int v = 0; v < 3; ++v) {
    if (!testing_support::sent(second, key(v), Body::kSpotCheck).empty()) second_verifier = v;
  }
  ASSERT_GE(second_verifier, 0);
  EXPECT_NE(second_verifier, verifier_of[2]);
  EXPECT_NE(second_verifier, 2);
  const Actions failed = handle(second_verifier, verdict(2, 0, wire::Verdict::DISAGREES), kT0 + 5);
  EXPECT_EQ(member(2).state, MemberState::kDropped);
  EXPECT_EQ(member(2).drop_reason, DropReason::kFailedVerification);
  EXPECT_EQ(testing_support::logged_field(failed, EventKind::kDrop, "reason"),
            std::optional<obs::LogValue>(std::string("failed_verification")));
  EXPECT_EQ(testing_support::sent(failed, key(2), Body::kRefused).size(), 1u);
  // It may not come back.
  const Actions again = handle(2, testing_support::join_msg(ids_[2]), kT0 + 6);
  ASSERT_EQ(testing_support::sent(again, key(2), Body::kRefused).size(), 1u);
  EXPECT_EQ(member(2).state, MemberState::kDropped);
  // The honest ones pass.
  handle(verifier_of[0], verdict(0, 0, wire::Verdict::AGREES), kT0 + 6);
  EXPECT_EQ(member(0).state, MemberState::kActive);
}

TEST_F(VerifyingCoordinatorTest, AVerifiersNextShareShrinksByTheWorkOfItsCheck) {
  using testing_support::hash_of;
  options_.batch_size = 70;
  make();
  const std::vector<double> speeds = {30, 30, 10};
  for (int i = 0; i < 3; ++i) handle(i, testing_support::join_msg(ids_[i], speeds[i]), kT0);
  Actions opened = sm_->tick(kT0 + options_.network.warmup_seconds);
  std::map<PublicKey, uint64_t> share;
  for (int i = 0; i < 3; ++i) {
    share[key(i)] = testing_support::count_of(
        testing_support::sent(opened, key(i), Body::kRoundStart).at(0).round_start());
  }
  ASSERT_EQ(share[key(0)], 30u);
  ASSERT_EQ(share[key(2)], 10u);
  // All commit one second in (30, 30 and 10 per second again); every contribution is checked.
  Actions closed;
  for (int i = 0; i < 3; ++i) closed = handle(i, committed(i, 0, hash_of(i)), kT0 + 3);
  std::vector<uint64_t> checking(3, 0);
  for (int v = 0; v < 3; ++v) {
    for (const auto& m : testing_support::sent(closed, key(v), Body::kSpotCheck)) {
      checking[v] += share[m.spot_check().author().key()];
    }
  }
  Actions next;
  const std::vector<std::string> all = {hash_of(0), hash_of(1), hash_of(2)};
  for (int i = 0; i < 3; ++i) next = handle(i, testing_support::witness_msg(0, all), kT0 + 3);
  ASSERT_EQ(state().round->step, 1u);
  std::vector<uint64_t> shares;
  for (int i = 0; i < 3; ++i) {
    shares.push_back(testing_support::count_of(
        testing_support::sent(next, key(i), Body::kRoundStart).at(0).round_start()));
  }
  EXPECT_EQ(shares, fastest_shares(70, weights_after_checks(speeds, 70, checking)));
  // Whoever checks the slow member's 10 trains more than whoever checks a fast one's 30.
  EXPECT_NE(shares, (std::vector<uint64_t>{30, 30, 10}));
}

}  // namespace
}  // namespace agora::coord
