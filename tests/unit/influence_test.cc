// Bounded influence (optim/influence.h): the bound is ratio x the lower median of the step's
// norms per tensor, a strict minority cannot move it out of the honest range, entries within it
// keep their bits, and nothing becomes non-finite, however large the values sent.
#include "agora/optim/influence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>

namespace agora {
namespace {

// A payload of one dct_topk tensor [1, n] (one chunk, topk n) with the given values.
Payload payload_of(const std::vector<float>& values) {
  Payload p;
  TensorPayload t;
  t.layout.shape = {1, static_cast<int64_t>(values.size())};
  t.layout.encoding = TensorEncoding::kDctTopK;
  t.layout.chunk_cols = static_cast<int64_t>(values.size());
  t.layout.topk = static_cast<int64_t>(values.size());
  for (size_t i = 0; i < values.size(); ++i) t.positions.push_back(static_cast<uint32_t>(i));
  t.values = values;
  p.tensors.push_back(std::move(t));
  return p;
}

double norm(const Payload& p) {
  double s = 0;
  for (float v : p.tensors[0].values) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

std::vector<Payload> honest(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Payload> out;
  for (int i = 0; i < count; ++i) {
    std::vector<float> v(16);
    for (float& x : v) x = normal(rng);
    out.push_back(payload_of(v));
  }
  return out;
}

TEST(Influence, ScalesOnlyWhatIsAboveTheBoundAndKeepsTheRestBitForBit) {
  std::vector<Payload> payloads = honest(4, 1);
  const std::vector<Payload> before = payloads;
  std::vector<float> huge(16, FLT_MAX);
  huge[3] = -FLT_MAX;
  payloads.push_back(payload_of(huge));
  std::vector<double> honest_norms;
  for (const Payload& p : before) honest_norms.push_back(norm(p));
  std::sort(honest_norms.begin(), honest_norms.end());
  // Five payloads: the lower median is the third smallest norm, an honest one.
  const double bound = 2.0 * honest_norms[2];

  int64_t expected_clips = 1;
  for (const Payload& p : before) expected_clips += norm(p) > bound ? 1 : 0;
  EXPECT_EQ(bound_influence(payloads, 2.0), expected_clips);
  for (size_t j = 0; j < before.size(); ++j) {
    if (norm(before[j]) <= bound) {
      EXPECT_EQ(payloads[j], before[j]) << j;
    }
  }
  for (const Payload& p : payloads) {
    for (float v : p.tensors[0].values) EXPECT_TRUE(std::isfinite(v));
    EXPECT_LE(norm(p), bound * (1 + 1e-6));
  }
  EXPECT_NEAR(norm(payloads.back()), bound, bound * 1e-6);
  EXPECT_LT(payloads.back().tensors[0].values[3], 0) << "scaling keeps signs";
}

// f attackers among P = 2f + 1 payloads, all sending huge values or all sending zeros: the
// bound stays within [ratio x smallest honest norm, ratio x largest honest norm].
TEST(Influence, AMinorityCannotMoveTheBoundOutOfTheHonestRange) {
  for (int f = 1; f <= 3; ++f) {
    for (const float attack : {0.0f, 1e30f}) {
      std::vector<Payload> payloads = honest(f + 1, 10 + f);
      double lo = INFINITY, hi = 0;
      for (const Payload& p : payloads) {
        lo = std::min(lo, norm(p));
        hi = std::max(hi, norm(p));
      }
      for (int a = 0; a < f; ++a) payloads.push_back(payload_of(std::vector<float>(16, attack)));
      bound_influence(payloads, 1.0);
      for (size_t j = payloads.size() - f; j < payloads.size(); ++j) {
        EXPECT_LE(norm(payloads[j]), hi * (1 + 1e-6)) << "f=" << f << " attack=" << attack;
      }
      // Zeros pull the median down, but never below the smallest honest norm.
      for (size_t j = 0; j < payloads.size() - f; ++j) {
        EXPECT_GE(norm(payloads[j]), lo * (1 - 1e-6)) << "f=" << f << " attack=" << attack;
      }
    }
  }
}

// Issue 38, finding 12: all-zero entries counted in the median. With half of a round zeros (a
// swarm stage of two with one hostile replica) the lower median was 0 and every honest entry
// was scaled to nothing. Zeros are left out now: the honest entries keep their bits.
TEST(Influence, AllZeroEntriesDoNotPullTheBoundToZero) {
  for (int honest_count : {1, 2, 3}) {
    std::vector<Payload> payloads = honest(honest_count, 40 + honest_count);
    const std::vector<Payload> before = payloads;
    for (int a = 0; a < honest_count; ++a)
      payloads.push_back(payload_of(std::vector<float>(16, 0.0f)));
    bound_influence(payloads, 1e9);  // a ratio no honest spread reaches: nothing may be scaled
    for (size_t j = 0; j < before.size(); ++j) {
      EXPECT_EQ(payloads[j], before[j]) << "honest " << j << " of " << honest_count;
    }
  }
  // A round of nothing but zeros is left as it is.
  std::vector<Payload> zeros(3, payload_of(std::vector<float>(16, 0.0f)));
  EXPECT_EQ(bound_influence(zeros, 1.0), 0);
}

TEST(Influence, RatioZeroTurnsItOffAndOneBitIsNeverScaled) {
  std::vector<Payload> payloads = honest(3, 7);
  payloads.push_back(payload_of(std::vector<float>(16, 1e20f)));
  const std::vector<Payload> before = payloads;
  EXPECT_EQ(bound_influence(payloads, 0.0), 0);
  EXPECT_EQ(payloads, before);

  std::vector<Payload> signs;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> v(16, 1.0f);
    v[static_cast<size_t>(i)] = -1.0f;
    signs.push_back(payload_of(v));
  }
  const std::vector<Payload> signs_before = signs;
  EXPECT_EQ(bound_influence(signs, 1.0), 0);
  EXPECT_EQ(signs, signs_before);
}

TEST(Influence, EveryTensorHasItsOwnBound) {
  // Two tensors: the attacker is extreme in the second only.
  std::vector<Payload> payloads = honest(3, 3);
  const std::vector<Payload> tails = honest(3, 4);
  for (size_t j = 0; j < payloads.size(); ++j) payloads[j].tensors.push_back(tails[j].tensors[0]);
  Payload attacker = honest(1, 5)[0];
  attacker.tensors.push_back(payload_of(std::vector<float>(16, 1e9f)).tensors[0]);
  payloads.push_back(attacker);
  const std::vector<Payload> before = payloads;
  bound_influence(payloads, 2.0);
  EXPECT_EQ(payloads.back().tensors[0], before.back().tensors[0]);
  EXPECT_NE(payloads.back().tensors[1], before.back().tensors[1]);
}

}  // namespace
}  // namespace agora
