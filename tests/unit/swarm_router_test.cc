// swarm/router.h: SWARM's routing by measured throughput, on a hand-driven clock.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "agora/core/error.h"
#include "agora/swarm/router.h"

namespace agora {
namespace {

std::vector<uint64_t> picks(SwarmRouter& r, int n, double now, int64_t samples = 1) {
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(*r.pick(samples, now));
  return out;
}

TEST(SwarmRouter, SharesFollowThroughputInterleaved) {
  // The sender's own pace does not matter: the picks below are a second apart, slower than
  // either replica, and still interleave by throughput.
  SwarmRouter r;
  r.add(1);
  r.add(2);
  r.answered(1, 4, 0.4);  // 0.1 s per sample
  r.answered(2, 4, 1.2);  // 0.3 s per sample: a third of replica 1's throughput
  std::vector<uint64_t> p;
  for (int i = 0; i < 400; ++i) p.push_back(*r.pick(1, i));
  std::map<uint64_t, int> count;
  int run = 0, longest = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    ++count[p[i]];
    run = (i > 0 && p[i] == p[i - 1]) ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  EXPECT_NEAR(count[1], 300, 2);
  EXPECT_NEAR(count[2], 100, 2);
  EXPECT_LE(longest, 4);  // weighted round-robin, not bursts
}

TEST(SwarmRouter, EstimateIsBiasCorrected) {
  SwarmRouter r;
  r.add(7);
  r.answered(7, 4, 2.0);
  EXPECT_DOUBLE_EQ(r.seconds_per_sample(7), 0.5);  // not alpha * 0.5
  r.answered(7, 4, 4.0);
  // (0.9 * 0.05 + 0.1 * 1.0) / (1 - 0.81)
  EXPECT_NEAR(r.seconds_per_sample(7), (0.9 * 0.05 + 0.1) / 0.19, 1e-12);
  r.answered(7, 4, 0);    // ignored
  r.answered(7, 0, 1.0);  // ignored
  r.answered(9, 1, 1.0);  // unknown: ignored
  EXPECT_NEAR(r.seconds_per_sample(7), (0.9 * 0.05 + 0.1) / 0.19, 1e-12);
  EXPECT_EQ(r.seconds_per_sample(9), 0);
}

TEST(SwarmRouter, NewReplicaIsProbedAndChargedTheMean) {
  SwarmRouter r;
  r.add(1);
  r.add(2);
  r.answered(1, 1, 1.0);
  r.answered(2, 1, 3.0);
  picks(r, 20, 0);  // both busy into the future
  r.add(3);
  EXPECT_DOUBLE_EQ(r.seconds_per_sample(3), 2.0);
  EXPECT_EQ(*r.pick(1, 0), 3u);
}

TEST(SwarmRouter, FailedReplicaIsSkippedThenTriedAgain) {
  SwarmRouterOptions o;
  o.skip_seconds = 10;
  SwarmRouter r(o);
  r.add(1);
  r.add(2);
  r.answered(1, 1, 1.0);
  r.answered(2, 1, 1.0);
  r.failed(1, 0);
  for (double t = 0; t < 10; t += 0.5) EXPECT_EQ(*r.pick(1, t), 2u) << "t " << t;
  EXPECT_EQ(*r.pick(1, 10), 1u);  // back, and idle
  r.failed(1, 20);
  r.failed(2, 20);
  EXPECT_FALSE(r.pick(1, 25).has_value());
  r.remove(1);
  r.remove(2);
  EXPECT_FALSE(r.pick(1, 100).has_value());
  EXPECT_EQ(r.size(), 0u);
}

TEST(SwarmRouter, ANewReplicaEntersAtTheMinimumAndEarnsNoBurst) {
  SwarmRouter r;
  r.add(1);
  r.answered(1, 1, 1.0);
  picks(r, 20, 0);  // replica 1's key is 20
  r.answered(1, 20, 20.0);
  r.add(2);
  r.answered(2, 1, 1.0);
  // Replica 2 enters at 20, not 0: the two alternate, instead of replica 2 taking the next 20.
  const std::vector<uint64_t> p = picks(r, 10, 100);
  EXPECT_EQ(std::count(p.begin(), p.end(), 1u), 5);
  EXPECT_EQ(std::count(p.begin(), p.end(), 2u), 5);
}

TEST(SwarmRouter, AnUnmeasuredReplicaGetsOneProbeUntilItAnswers) {
  SwarmRouter r;
  r.add(1);
  r.answered(1, 1, 1.0);
  r.add(2);
  EXPECT_EQ(*r.pick(1, 0), 2u);  // the probe
  // Round-robin alone would alternate; replica 2 has not answered, so replica 1 takes the rest.
  EXPECT_EQ(picks(r, 6, 0), (std::vector<uint64_t>(6, 1)));
  r.answered(2, 1, 3.0);  // three times slower
  const std::vector<uint64_t> p = picks(r, 40, 0);
  EXPECT_NEAR(std::count(p.begin(), p.end(), 2u), 10, 2);
  // Alone, an unanswered replica still gets work: there is nowhere else to send it.
  SwarmRouter alone;
  alone.add(5);
  EXPECT_EQ(picks(alone, 3, 0), (std::vector<uint64_t>(3, 5)));
}

TEST(SwarmRouter, AReplicaBehindOnItsAnswersWaits) {
  SwarmRouter r;
  r.add(1);
  r.add(2);
  r.answered(1, 1, 1.0);
  r.answered(2, 1, 1.0);
  picks(r, 10, 0);        // 5 samples each, keys equal
  r.answered(1, 5, 5.0);  // replica 1 answered all of its; replica 2 none
  // Round-robin alone would alternate; replica 2 is 5 seconds of work behind, so replica 1 takes
  // the next picks until its own unanswered work catches up.
  EXPECT_EQ(picks(r, 3, 0), (std::vector<uint64_t>{1, 1, 1}));
}

TEST(SwarmRouter, UniformIgnoresThroughputAndIsDeterministic) {
  SwarmRouterOptions o;
  o.uniform = true;
  o.seed = 42;
  SwarmRouter a(o), b(o);
  for (SwarmRouter* r : {&a, &b}) {
    r->add(1);
    r->add(2);
    r->answered(1, 1, 0.1);
    r->answered(2, 1, 10.0);
  }
  const std::vector<uint64_t> pa = picks(a, 1000, 0), pb = picks(b, 1000, 0);
  EXPECT_EQ(pa, pb);
  EXPECT_NEAR(std::count(pa.begin(), pa.end(), 2u), 500, 60);
}

TEST(SwarmRouter, RefusesBadOptions) {
  for (double alpha : {0.0, -0.1, 1.5}) {
    SwarmRouterOptions o;
    o.alpha = alpha;
    EXPECT_THROW(SwarmRouter{o}, Error) << alpha;
  }
  SwarmRouterOptions o;
  o.prior_seconds_per_sample = 0;
  EXPECT_THROW(SwarmRouter{o}, Error);
  o = {};
  o.skip_seconds = -1;
  EXPECT_THROW(SwarmRouter{o}, Error);
}

// Issue 38, finding 3: a replica's reported compute time was taken as it came, so one claiming
// 1e-30 s became the router's choice for every pick. A sender now counts it within what it
// measured itself: at least the round trip's share of the stages crossed, at most the trip.
TEST(SwarmRouter, CountedSecondsAreBoundedByTheSendersOwnRoundTrip) {
  EXPECT_DOUBLE_EQ(counted_seconds(1e-30, 2.0, 2), 1.0);  // floor: the trip over 2 stages
  EXPECT_DOUBLE_EQ(counted_seconds(50.0, 2.0, 2), 2.0);   // ceiling: the trip itself
  EXPECT_DOUBLE_EQ(counted_seconds(1.5, 2.0, 2), 1.5);    // honest: as reported
  EXPECT_DOUBLE_EQ(counted_seconds(-1.0, 2.0, 1), 2.0);
  EXPECT_DOUBLE_EQ(counted_seconds(std::nan(""), 2.0, 4), 0.5);
  // With the bound, a liar whose answers come back as slowly as an honest replica's does not
  // win the picks: they split by the measured trips.
  SwarmRouter r;
  r.add(1);  // honest: reports 0.4 s, its answers take 0.5 s
  r.add(2);  // liar: reports 1e-30 s, its answers take 0.5 s as well
  for (int i = 0; i < 20; ++i) {
    r.pick(4, i);
    r.pick(4, i);
    r.answered(1, 4, counted_seconds(0.4, 0.5, 1));
    r.answered(2, 4, counted_seconds(1e-30, 0.5, 1));
  }
  std::map<uint64_t, int> count;
  for (uint64_t id : picks(r, 100, 100, 4)) ++count[id];
  EXPECT_GE(count[1], 40) << "the liar took " << count[2] << " of 100";
}

}  // namespace
}  // namespace agora
