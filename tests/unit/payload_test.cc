// The payload codec: the format byte for byte, round trips of every encoding, value type and
// rank, and bf16 rounding. Rejections are in payload_reject_test.cc.
#include "agora/optim/payload.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "payload_test_support.h"

namespace agora {
namespace {
using namespace payload_testing;

TEST(PayloadFormat, HandBuiltBytesAreExact) {
  const std::string expected = unhex(kHandBuiltHex);
  ASSERT_EQ(expected.size(), 115u);
  EXPECT_EQ(hex_encode(encode_payload(hand_built())), hex_encode(expected));
  expect_identical(decode_payload(expected), hand_built());
  EXPECT_EQ(round_trip(hand_built()), expected);
}

TEST(PayloadFormat, OneBitPacksLeastSignificantBitFirst) {
  Payload p;
  TensorPayload t;
  t.layout = dct({9}, 1, 9, 9, ValueType::kOneBit);
  t.positions = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  t.values = {-1, 1, 1, -1, 1, 1, 1, 1, -1};
  p.tensors = {t};
  const std::string bytes = round_trip(p);
  EXPECT_EQ(hex_encode(bytes.substr(bytes.size() - 2)), "0901");
}

TEST(PayloadFormat, OneBitKeepsOnlyTheSign) {
  Payload p;
  TensorPayload t;
  t.layout = dct({5}, 1, 5, 5, ValueType::kOneBit);
  t.positions = {0, 1, 2, 3, 4};
  t.values = {-0.0f, 0.0f, -3.5f, 2.5f, -1e-30f};
  p.tensors = {t};
  const Payload back = decode_payload(encode_payload(p));
  EXPECT_EQ(bits_of(back.tensors[0].values), bits_of({1.0f, 1.0f, -1.0f, 1.0f, -1.0f}));
}

TEST(PayloadFormat, PositionBitsFollowChunkAndTopK) {
  // What encoded_size adds for the positions: the bytes of a one-bit layout less its values.
  const auto position_bytes = [](const TensorLayout& l) {
    const size_t values = (static_cast<size_t>(l.value_count()) + 7) / 8;
    return encoded_size({PayloadKind::kDemo, {l}}) - 20 - 4 - 4 * l.shape.size() - 12 - values;
  };
  // Ranks: bit_length(C(n, k) - 1) bits per chunk, chunks packed back to back.
  EXPECT_EQ(position_bytes(dct({64, 64}, 64, 64, 4, ValueType::kOneBit)), 6u);    // 44 bits
  EXPECT_EQ(position_bytes(dct({128, 64}, 64, 64, 4, ValueType::kOneBit)), 11u);  // 88 bits
  EXPECT_EQ(position_bytes(dct({3, 64}, 1, 64, 4, ValueType::kOneBit)), 8u);      // 3 x 20
  EXPECT_EQ(position_bytes(dct({256}, 1, 256, 1, ValueType::kOneBit)), 1u);       // 8 bits
  EXPECT_EQ(position_bytes(dct({514}, 1, 257, 1, ValueType::kOneBit)), 3u);       // 2 x 9
  EXPECT_EQ(position_bytes(dct({2, 6, 8}, 3, 4, 12, ValueType::kOneBit)), 0u);    // k = n
  EXPECT_EQ(position_bytes(dct({5}, 1, 1, 1, ValueType::kOneBit)), 0u);           // n = 1
  // Elias-Fano once C(n, k) >= 2^64: 287 bits per chunk at top-k 32 of 4096, against 512 for
  // u16 positions.
  EXPECT_EQ(position_bytes(dct({64, 64}, 64, 64, 32, ValueType::kOneBit)), 36u);
  EXPECT_EQ(position_bytes(dct({64, 128}, 64, 64, 32, ValueType::kOneBit)), 72u);  // 574 bits
}

TEST(PayloadFormat, EncodedSizeIsExact) {
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {}}), 20u);
  EXPECT_EQ(encoded_size({PayloadKind::kDemo, {dct({64, 64}, 64, 64, 4, ValueType::kOneBit)}}),
            20u + 8 + 4 + 12 + 6 + 1);
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {dense({3, 5}, ValueType::kBF16)}}),
            20u + 12 + 30);
  EXPECT_EQ(encoded_size({PayloadKind::kPseudoGradient, {int8_rows({2, 3, 4})}}),
            20u + 16 + 6 * 4 + 24);
  // Near the element limit the arithmetic must not overflow.
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {dense({1 << 20, (1 << 20) - 1})}}),
            20u + 12 + 4 * ((uint64_t{1} << 40) - (uint64_t{1} << 20)));
  // DeMo's own layouts: [288, 768] has 72 chunks of 48 x 64, C(3072, 4) needs 42 bits.
  const TensorLayout demo = demo_tensor_layout({288, 768}, 64, 4, true);
  EXPECT_EQ(encoded_size({PayloadKind::kDemo, {demo}}), 20u + 12 + 12 + 72 * 42 / 8 + 72 * 4 / 8);
}

TEST(PayloadFormat, NamesOfEnums) {
  EXPECT_STREQ(to_string(PayloadKind::kDemo), "demo");
  EXPECT_STREQ(to_string(PayloadKind::kGradient), "gradient");
  EXPECT_STREQ(to_string(PayloadKind::kPseudoGradient), "pseudo_gradient");
  EXPECT_STREQ(to_string(TensorEncoding::kDctTopK), "dct_topk");
  EXPECT_STREQ(to_string(TensorEncoding::kDense), "dense");
  EXPECT_STREQ(to_string(TensorEncoding::kInt8Rows), "int8_rows");
  EXPECT_STREQ(to_string(ValueType::kF32), "f32");
  EXPECT_STREQ(to_string(ValueType::kBF16), "bf16");
  EXPECT_STREQ(to_string(ValueType::kOneBit), "one_bit");
  EXPECT_STREQ(to_string(ValueType::kInt8), "int8");
}

TEST(PayloadFormat, LayoutCounts) {
  const TensorLayout l = dct({2, 6, 8}, 3, 4, 5, ValueType::kF32);
  EXPECT_EQ(l.numel(), 96);
  EXPECT_EQ(l.chunk_size(), 12);
  EXPECT_EQ(l.num_chunks(), 8);
  EXPECT_EQ(l.value_count(), 40);
  EXPECT_EQ(l.rows(), 12);
  EXPECT_EQ(int8_rows({7}).rows(), 1);
  EXPECT_EQ(dense({3, 5}).value_count(), 15);
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(PayloadRoundTrip, EveryEncodingValueTypeAndRank) {
  std::vector<TensorLayout> layouts;
  for (const ValueType type : {ValueType::kF32, ValueType::kBF16, ValueType::kOneBit}) {
    layouts.push_back(dct({256}, 1, 64, 3, type));         // ranks (once u8 positions)
    layouts.push_back(dct({128, 64}, 64, 64, 100, type));  // Elias-Fano (once u16)
    layouts.push_back(dct({2, 6, 8}, 3, 4, 12, type));     // topk == chunk size: no bits
    layouts.push_back(dct({70000}, 1, 70000, 300, type));  // Elias-Fano (once u32)
    layouts.push_back(dct({5, 1, 7}, 1, 7, 1, type));
    layouts.push_back(dct({3, 128, 64}, 64, 64, 4, type));  // DeMo's 44-bit ranks
    layouts.push_back(dct({2, 70000}, 1, 70000, 2, type));  // ranks past u16, no table
    layouts.push_back(dct({4, 67}, 1, 67, 33, type));       // 64-bit ranks
    layouts.push_back(dct({3, 4}, 1, 1, 1, type));          // chunk size 1
  }
  for (const ValueType type : {ValueType::kF32, ValueType::kBF16}) {
    layouts.push_back(dense({7}, type));
    layouts.push_back(dense({3, 5}, type));
    layouts.push_back(dense({2, 3, 4}, type));
  }
  layouts.push_back(int8_rows({5}));
  layouts.push_back(int8_rows({3, 4}));
  layouts.push_back(int8_rows({2, 3, 4}));

  Payload all;
  all.kind = PayloadKind::kDemo;
  all.step = 0xfedcba9876543210ULL;
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "layout " << i);
    Payload one;
    one.kind = PayloadKind::kPseudoGradient;
    one.step = i;
    one.tensors = {random_tensor(layouts[i], static_cast<uint32_t>(i))};
    round_trip(one);
    all.tensors.push_back(one.tensors[0]);
  }
  round_trip(all);
  // The u32 layout really has positions beyond 16 bits.
  const std::vector<uint32_t>& wide = all.tensors[3].positions;
  EXPECT_GT(*std::max_element(wide.begin(), wide.end()), 65535u);
}

TEST(PayloadRoundTrip, EmptyPayloadAndSpecialFloats) {
  Payload empty;
  empty.kind = PayloadKind::kGradient;
  EXPECT_EQ(round_trip(empty).size(), 20u);

  Payload p;
  TensorPayload t;
  t.layout = dense({6});
  t.values = {-0.0f,
              0.0f,
              std::numeric_limits<float>::denorm_min(),
              std::numeric_limits<float>::max(),
              -std::numeric_limits<float>::max(),
              std::numeric_limits<float>::min()};
  p.tensors = {t};
  round_trip(p);
  p.tensors[0].layout.value_type = ValueType::kBF16;
  p.tensors[0].values = {-0.0f,
                         0.0f,
                         std::bit_cast<float>(0x00010000u),
                         std::bit_cast<float>(0x7f7f0000u),
                         std::bit_cast<float>(0xff7f0000u),
                         1.0f};
  round_trip(p);
}

TEST(PayloadRoundTrip, Bf16EncodeRounds) {
  Payload p;
  TensorPayload t;
  t.layout = dense({2}, ValueType::kBF16);
  t.values = {1.00390625f, 0.1f};  // 1 + 2^-8 ties to 1
  p.tensors = {t};
  const Payload back = decode_payload(encode_payload(p));
  EXPECT_EQ(back.tensors[0].values[0], 1.0f);
  EXPECT_EQ(back.tensors[0].values[1], round_to_bf16(0.1f));
}

TEST(PayloadRoundTrip, DecodeChecksAgainstExpectedLayout) {
  const std::string bytes = encode_payload(hand_built());
  PayloadLayout expected = layout_of(hand_built());
  decode_payload(bytes, expected);

  PayloadLayout wrong = expected;
  wrong.kind = PayloadKind::kGradient;
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "payload: kind is demo, expected gradient");
  wrong = expected;
  wrong.tensors.pop_back();
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "tensor count is 4, expected 3");
  wrong = expected;
  wrong.tensors[1].shape = {300, 2};
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "payload tensor 1 [2, 300]",
                    "shape is [2, 300], expected [300, 2]");
  wrong = expected;
  wrong.tensors[0].topk = 3;
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "payload tensor 0 [8]", "topk is 2, expected 3");
  wrong = expected;
  wrong.tensors[0].chunk_cols = 8;
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "chunk is 1 x 4, expected 1 x 8");
  wrong = expected;
  wrong.tensors[2].value_type = ValueType::kF32;
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "payload tensor 2 [3]",
                    "value_type is bf16, expected f32");
  wrong = expected;
  wrong.tensors[3].encoding = TensorEncoding::kDense;
  EXPECT_ERROR_WITH(decode_payload(bytes, wrong), "encoding is int8_rows, expected dense");
}

TEST(PayloadRoundTrip, CommittedFuzzSeedsStayValid) {
  const std::filesystem::path dir =
      std::filesystem::path(AGORA_SOURCE_DIR) / "tests/fuzz/corpus/payload_fuzz";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    const std::string bytes = read_file(entry.path());
    const std::string name = entry.path().filename().string();
    // Inputs a fuzz campaign kept (scripts/fuzz_campaign.py names them by their SHA-1) are any
    // bytes: each is refused with an Error or round-trips. The hand-made ones must stay valid.
    if (name.size() == 40 && name.find_first_not_of("0123456789abcdef") == std::string::npos) {
      try {
        const Payload decoded = decode_payload(bytes);
        EXPECT_EQ(encode_payload(decoded), bytes);
      } catch (const Error&) {
      }
      continue;
    }
    EXPECT_EQ(encode_payload(decode_payload(bytes)), bytes);
    ++seeds;
  }
  EXPECT_GE(seeds, 4);
}

// ---------------------------------------------------------------------------------------------
// round_to_bf16

TEST(PayloadBf16, RoundsToNearestEven) {
  const auto round_bits = [](uint32_t bits) {
    return std::bit_cast<uint32_t>(round_to_bf16(std::bit_cast<float>(bits)));
  };
  EXPECT_EQ(round_bits(0x3f808000u), 0x3f800000u);  // tie, kept part even: down
  EXPECT_EQ(round_bits(0x3f818000u), 0x3f820000u);  // tie, kept part odd: up
  EXPECT_EQ(round_bits(0x3f808001u), 0x3f810000u);  // above the tie: up
  EXPECT_EQ(round_bits(0x3f807fffu), 0x3f800000u);  // below the tie: down
  EXPECT_EQ(round_bits(0xbf818000u), 0xbf820000u);  // negative tie, odd: away from zero
  EXPECT_EQ(round_bits(0x3f7fffffu), 0x3f800000u);  // carry into the exponent
  EXPECT_EQ(round_bits(0x7f7fffffu), 0x7f800000u);  // the largest float overflows to inf
  EXPECT_EQ(round_bits(0x00000001u), 0x00000000u);  // the smallest subnormal underflows
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::bit_cast<float>(0x7f800001u))));  // low-bit NaN
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
}

TEST(PayloadBf16, ExactOnEveryBf16Value) {
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    const float v = std::bit_cast<float>(high << 16);
    if (std::isnan(v)) continue;
    ASSERT_EQ(std::bit_cast<uint32_t>(round_to_bf16(v)), high << 16) << high;
  }
}

}  // namespace
}  // namespace agora
