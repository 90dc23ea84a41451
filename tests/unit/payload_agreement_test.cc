// compare_payloads: the overlap, sign agreement and relative error a spot check decides on.
#include "agora/optim/payload_agreement.h"

#include <gtest/gtest.h>

#include <cmath>

#include "agora/core/error.h"

namespace agora {
namespace {

// One tensor of two chunks of 8 coefficients, top-2 per chunk; one-bit values unless `type` says.
Payload topk(std::vector<uint32_t> positions, std::vector<float> values, uint64_t step = 3,
             ValueType type = ValueType::kOneBit) {
  TensorPayload t;
  t.layout.shape = {16};
  t.layout.encoding = TensorEncoding::kDctTopK;
  t.layout.value_type = type;
  t.layout.chunk_cols = 8;
  t.layout.topk = 2;
  t.positions = std::move(positions);
  t.values = std::move(values);
  Payload p;
  p.step = step;
  p.tensors.push_back(t);
  return p;
}

Payload dense(std::vector<float> values) {
  TensorPayload t;
  t.layout.shape = {static_cast<int64_t>(values.size())};
  t.values = std::move(values);
  Payload p;
  p.kind = PayloadKind::kGradient;
  p.tensors.push_back(t);
  return p;
}

TEST(PayloadAgreement, IdenticalPayloadsAgreeFully) {
  const Payload p = topk({1, 5, 0, 7}, {0.5f, -1.0f, 2.0f, 0.25f}, 3, ValueType::kF32);
  const PayloadAgreement a = compare_payloads(p, p);
  EXPECT_TRUE(a.identical);
  EXPECT_EQ(a.selections, 4);
  EXPECT_EQ(a.shared, 4);
  EXPECT_DOUBLE_EQ(a.overlap(), 1.0);
  EXPECT_DOUBLE_EQ(a.sign_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(a.relative_error, 0.0);
  EXPECT_TRUE(agrees(a, {}));
  EXPECT_EQ(describe(a), "identical");
}

TEST(PayloadAgreement, CountsSharedPositionsPerChunkAndTheirSigns) {
  // Chunk 0: {1, 5} against {1, 6}: one shared. Chunk 1: {0, 7} against {0, 7}, one sign flipped.
  const Payload claimed = topk({1, 5, 0, 7}, {1.0f, 1.0f, 1.0f, -1.0f});
  const Payload recomputed = topk({1, 6, 0, 7}, {1.0f, 1.0f, 1.0f, 1.0f});
  const PayloadAgreement a = compare_payloads(claimed, recomputed);
  EXPECT_FALSE(a.identical);
  EXPECT_EQ(a.selections, 4);
  EXPECT_EQ(a.shared, 3);
  EXPECT_EQ(a.same_sign, 2);
  EXPECT_DOUBLE_EQ(a.overlap(), 0.75);
  EXPECT_NEAR(a.sign_agreement(), 2.0 / 3.0, 1e-12);
  EXPECT_FALSE(a.dense);
  EXPECT_TRUE(agrees(a, {.min_overlap = 0.75, .min_sign_agreement = 0.6}));
  EXPECT_FALSE(agrees(a, {.min_overlap = 0.8, .min_sign_agreement = 0.6}));
  EXPECT_FALSE(agrees(a, {.min_overlap = 0.75, .min_sign_agreement = 0.7}));
}

TEST(PayloadAgreement, APositionInAnotherChunkIsNotShared) {
  // The same position numbers, but chunk 0's are chunk 1's: nothing is shared.
  const Payload claimed = topk({0, 7, 2, 3}, {1, 1, 1, 1});
  const Payload recomputed = topk({2, 3, 0, 7}, {1, 1, 1, 1});
  const PayloadAgreement a = compare_payloads(claimed, recomputed);
  EXPECT_EQ(a.shared, 0);
  EXPECT_DOUBLE_EQ(a.worst_overlap, 0.0);
  EXPECT_DOUBLE_EQ(a.sign_agreement(), 1.0);  // nothing shared, nothing to disagree on
  EXPECT_FALSE(agrees(a, {}));
}

TEST(PayloadAgreement, DenseByRelativeError) {
  const PayloadAgreement close =
      compare_payloads(dense({1.0f, 2.0f, -2.0f}), dense({1.0f, 2.0f, -2.1f}));
  EXPECT_TRUE(close.dense);
  EXPECT_NEAR(close.relative_error, 0.1 / std::sqrt(1 + 4 + 2.1 * 2.1), 1e-6);
  EXPECT_TRUE(agrees(close, {.max_relative_error = 0.05}));
  const PayloadAgreement far =
      compare_payloads(dense({1.0f, 2.0f, 2.0f}), dense({1.0f, 2.0f, -2.0f}));
  EXPECT_EQ(far.same_sign, 2);
  EXPECT_FALSE(agrees(far, {.max_relative_error = 0.05}));
  // Against an all-zero recomputation, anything but zeros is infinitely far.
  EXPECT_TRUE(std::isinf(compare_payloads(dense({1.0f}), dense({0.0f})).relative_error));
  EXPECT_EQ(compare_payloads(dense({0.0f}), dense({0.0f})).relative_error, 0.0);
}

TEST(PayloadAgreement, RefusesPayloadsThatCannotBeCompared) {
  const Payload p = topk({1, 5, 0, 7}, {1, 1, 1, 1});
  EXPECT_THROW(compare_payloads(p, topk({1, 5, 0, 7}, {1, 1, 1, 1}, /*step=*/4)), Error);
  EXPECT_THROW(compare_payloads(p, dense({1, 2})), Error);  // another kind
  Payload dense_demo = dense({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  dense_demo.kind = PayloadKind::kDemo;
  dense_demo.step = 3;
  EXPECT_THROW(compare_payloads(p, dense_demo), Error);  // the same kind, another encoding
  Payload other = p;
  other.tensors[0].layout.topk = 1;
  other.tensors[0].positions = {1, 0};
  other.tensors[0].values = {1, 1};
  EXPECT_THROW(compare_payloads(p, other), Error);
  Payload more = p;
  more.tensors.push_back(p.tensors[0]);
  EXPECT_THROW(compare_payloads(p, more), Error);
}

TEST(PayloadAgreement, EveryTensorMustOverlapNotJustTheirSum) {
  // A large tensor recomputed exactly and a small one whose selections are all another's: the sum
  // over tensors (32 of 36) passes 0.75, the small tensor (0 of 4) does not.
  Payload claimed = topk({1, 5, 0, 7}, {1, 1, 1, 1});
  TensorPayload large = claimed.tensors[0];
  large.layout.shape = {128};  // 16 chunks of 8, top-2 each
  large.positions.clear();
  for (int c = 0; c < 16; ++c) large.positions.insert(large.positions.end(), {0, 1});
  large.values.assign(32, 1.0f);
  claimed.tensors.insert(claimed.tensors.begin(), large);
  Payload recomputed = claimed;
  recomputed.tensors[1].positions = {2, 3, 1, 2};
  const PayloadAgreement a = compare_payloads(claimed, recomputed);
  EXPECT_EQ(a.selections, 36);
  EXPECT_EQ(a.shared, 32);
  EXPECT_DOUBLE_EQ(a.worst_overlap, 0.0);
  EXPECT_FALSE(agrees(a, {.min_overlap = 0.75, .min_sign_agreement = 0.9}));
  recomputed.tensors[1].positions = {1, 5, 1, 7};  // now 2 + 1 of the small tensor's 4
  const PayloadAgreement b = compare_payloads(claimed, recomputed);
  EXPECT_DOUBLE_EQ(b.worst_overlap, 0.75);
  EXPECT_TRUE(agrees(b, {.min_overlap = 0.75, .min_sign_agreement = 0.9}));
}

TEST(PayloadAgreement, FloatValuesMustMatchNotOnlyPositionsAndSigns) {
  const Payload honest = topk({1, 5, 0, 7}, {0.5f, -1.0f, 2.0f, 0.25f}, 3, ValueType::kF32);
  Payload scaled = honest;
  for (float& v : scaled.tensors[0].values) v *= 10;
  const PayloadAgreement a = compare_payloads(scaled, honest);
  EXPECT_DOUBLE_EQ(a.overlap(), 1.0);
  EXPECT_DOUBLE_EQ(a.sign_agreement(), 1.0);
  EXPECT_TRUE(a.has_values);
  EXPECT_NEAR(a.relative_error, 9.0, 1e-6);
  EXPECT_FALSE(agrees(a, {}));
  Payload rounded = honest;
  rounded.tensors[0].values[2] = 2.0001f;
  EXPECT_TRUE(agrees(compare_payloads(rounded, honest), {}));
  // One-bit values carry signs only: no relative error is formed from them.
  EXPECT_FALSE(
      compare_payloads(topk({1, 5, 0, 7}, {1, -1, 1, 1}), topk({1, 5, 0, 7}, {1, -1, 1, 1}))
          .has_values);
}

TEST(PayloadAgreement, Int8RowsAreComparedDequantized) {
  // Rows of 2: row 0 scale 0.5, row 1 scale 1 against 1.01.
  TensorPayload t;
  t.layout.shape = {2, 2};
  t.layout.encoding = TensorEncoding::kInt8Rows;
  t.layout.value_type = ValueType::kInt8;
  t.quantized = {1, 2, -3, 4};
  t.scales = {0.5f, 1.0f};
  Payload claimed;
  claimed.kind = PayloadKind::kPseudoGradient;
  claimed.tensors.push_back(t);
  Payload recomputed = claimed;
  recomputed.tensors[0].scales[1] = 1.01f;
  const PayloadAgreement a = compare_payloads(claimed, recomputed);
  EXPECT_TRUE(a.dense);
  EXPECT_EQ(a.same_sign, 4);
  const double diff2 = 0.03 * 0.03 + 0.04 * 0.04;
  const double norm2 = 0.25 + 1.0 + 3.03 * 3.03 + 4.04 * 4.04;
  EXPECT_NEAR(a.relative_error, std::sqrt(diff2 / norm2), 1e-6);
  EXPECT_TRUE(agrees(a, {.max_relative_error = 0.01}));
  EXPECT_FALSE(agrees(a, {.max_relative_error = 0.009}));
}

TEST(PayloadAgreement, MomentumWithinTheBound) {
  EXPECT_TRUE(momentum_agrees(0.0, {}));
  EXPECT_TRUE(momentum_agrees(2e-7, {}));
  EXPECT_FALSE(momentum_agrees(0.012, {}));
  EXPECT_FALSE(momentum_agrees(std::nan(""), {}));
  EXPECT_FALSE(momentum_agrees(INFINITY, {}));
}

}  // namespace
}  // namespace agora
