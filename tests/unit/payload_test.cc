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

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/optim/chunking.h"
#include "test_support.h"

namespace agora {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

TensorLayout dct(std::vector<int64_t> shape, int64_t rows, int64_t cols, int64_t topk,
                 ValueType type) {
  TensorLayout l;
  l.shape = std::move(shape);
  l.encoding = TensorEncoding::kDctTopK;
  l.value_type = type;
  l.chunk_rows = rows;
  l.chunk_cols = cols;
  l.topk = topk;
  return l;
}

TensorLayout plain(std::vector<int64_t> shape, TensorEncoding encoding, ValueType type) {
  TensorLayout l;
  l.shape = std::move(shape);
  l.encoding = encoding;
  l.value_type = type;
  return l;
}

TensorLayout dense(std::vector<int64_t> shape, ValueType type = ValueType::kF32) {
  return plain(std::move(shape), TensorEncoding::kDense, type);
}

TensorLayout int8_rows(std::vector<int64_t> shape) {
  return plain(std::move(shape), TensorEncoding::kInt8Rows, ValueType::kInt8);
}

// Valid random contents for `layout`: distinct ascending positions per chunk, values exact in the
// layout's value type.
TensorPayload random_tensor(const TensorLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  TensorPayload t;
  t.layout = layout;
  const int64_t n = layout.value_count();
  if (layout.encoding == TensorEncoding::kInt8Rows) {
    for (int64_t i = 0; i < n; ++i) t.quantized.push_back(static_cast<int8_t>(rng()));
    for (int64_t r = 0; r < layout.rows(); ++r) t.scales.push_back(std::abs(normal(rng)));
    return t;
  }
  if (layout.encoding == TensorEncoding::kDctTopK) {
    std::vector<uint32_t> all(layout.chunk_size());
    for (int64_t c = 0; c < layout.num_chunks(); ++c) {
      std::iota(all.begin(), all.end(), 0u);
      for (int64_t j = 0; j < layout.topk; ++j) {
        std::swap(all[j], all[j + rng() % (all.size() - j)]);
      }
      std::sort(all.begin(), all.begin() + layout.topk);
      t.positions.insert(t.positions.end(), all.begin(), all.begin() + layout.topk);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    if (layout.value_type == ValueType::kOneBit) {
      t.values.push_back(v < 0 ? -1.0f : 1.0f);
    } else if (layout.value_type == ValueType::kBF16) {
      t.values.push_back(round_to_bf16(v));
    } else {
      t.values.push_back(v);
    }
  }
  return t;
}

std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (const float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

// Equality down to the bits of every float (Payload's == would take -0 for +0).
void expect_identical(const Payload& a, const Payload& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.step, b.step);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorPayload& x = a.tensors[i];
    const TensorPayload& y = b.tensors[i];
    EXPECT_EQ(x.layout, y.layout) << "tensor " << i;
    EXPECT_EQ(x.positions, y.positions) << "tensor " << i;
    EXPECT_EQ(bits_of(x.values), bits_of(y.values)) << "tensor " << i;
    EXPECT_EQ(x.quantized, y.quantized) << "tensor " << i;
    EXPECT_EQ(bits_of(x.scales), bits_of(y.scales)) << "tensor " << i;
  }
}

PayloadLayout layout_of(const Payload& p) {
  PayloadLayout layout{p.kind, {}};
  for (const TensorPayload& t : p.tensors) layout.tensors.push_back(t.layout);
  return layout;
}

// Encodes, checks the size against encoded_size(), decodes (with and without the layout) and
// re-encodes; returns the bytes.
std::string round_trip(const Payload& p) {
  const std::string bytes = encode_payload(p);
  EXPECT_EQ(bytes.size(), encoded_size(layout_of(p)));
  const Payload back = decode_payload(bytes);
  expect_identical(back, p);
  expect_identical(decode_payload(bytes, layout_of(p)), p);
  EXPECT_EQ(encode_payload(back), bytes);
  return bytes;
}

std::string hex(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x}", static_cast<uint8_t>(c));
  return out;
}

std::string unhex(std::string_view text) {
  std::string digits;
  for (const char c : text) {
    if (c != ' ') digits += c;
  }
  std::string out;
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string patched(std::string bytes, size_t offset, std::string_view replacement) {
  bytes.replace(offset, replacement.size(), replacement);
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// The format, byte for byte

// A hand-built payload with one tensor of each encoding, 119 bytes. Offsets for the rejection
// tests: tensor 0 at 20 (ndim 20, encoding 21, value_type 22, reserved 23, dims 24, chunk_rows 28,
// chunk_cols 32, topk 36, positions 40..43, the one-bit byte 44); tensor 1 at 45 (chunk_rows 57,
// positions 69, values 73); tensor 2 at 81 (values 89); tensor 3 at 95 (scales 107).
const char* const kHandBuiltHex =
    "4147504c 0100 01 00 0700000000000000 04000000"    // header: AGPL v1 demo step 7, 4 tensors
    "01 01 03 00 08000000 01000000 04000000 02000000"  // [8] dct_topk one_bit, chunk 1x4, topk 2
    "01 03 00 02 09"                                   // u8 positions; -1 +1 +1 -1 = 0b1001
    "02 01 01 00 02000000 2c010000 01000000 2c010000 01000000"  // [2, 300] dct_topk f32 1x300 k1
    "2b01 0500 0000c03f 000000c0"          // u16 positions 299, 5; values 1.5, -2
    "01 02 02 00 03000000 803f 00bf 4040"  // [3] dense bf16: 1, -0.5, 3
    "02 03 04 00 02000000 02000000"        // [2, 2] int8_rows
    "0000003f 00000000 01 ff 7f 80";       // scales 0.5, 0; values 1, -1, 127, -128

Payload hand_built() {
  Payload p;
  p.kind = PayloadKind::kDemo;
  p.step = 7;
  TensorPayload a;
  a.layout = dct({8}, 1, 4, 2, ValueType::kOneBit);
  a.positions = {1, 3, 0, 2};
  a.values = {-1, 1, 1, -1};
  TensorPayload b;
  b.layout = dct({2, 300}, 1, 300, 1, ValueType::kF32);
  b.positions = {299, 5};
  b.values = {1.5f, -2.0f};
  TensorPayload c;
  c.layout = dense({3}, ValueType::kBF16);
  c.values = {1.0f, -0.5f, 3.0f};
  TensorPayload d;
  d.layout = int8_rows({2, 2});
  d.scales = {0.5f, 0.0f};
  d.quantized = {1, -1, 127, -128};
  p.tensors = {a, b, c, d};
  return p;
}

TEST(PayloadFormat, HandBuiltBytesAreExact) {
  const std::string expected = unhex(kHandBuiltHex);
  ASSERT_EQ(expected.size(), 119u);
  EXPECT_EQ(hex(encode_payload(hand_built())), hex(expected));
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
  EXPECT_EQ(hex(bytes.substr(bytes.size() - 2)), "0901");
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

TEST(PayloadFormat, PositionWidthFollowsChunkSize) {
  // The position bytes per value are what encoded_size adds beyond the one-bit values.
  const auto position_bytes = [](const TensorLayout& l) {
    const size_t base = encoded_size({PayloadKind::kDemo, {l}});
    TensorLayout one = l;
    one.topk = 1;
    const size_t single = encoded_size({PayloadKind::kDemo, {one}});
    return (base - single) / static_cast<size_t>(l.value_count() - one.value_count());
  };
  EXPECT_EQ(position_bytes(dct({256}, 1, 256, 9, ValueType::kBF16)), 1u + 2u);
  EXPECT_EQ(position_bytes(dct({514}, 1, 257, 9, ValueType::kBF16)), 2u + 2u);
  EXPECT_EQ(position_bytes(dct({256, 256}, 256, 256, 9, ValueType::kBF16)), 2u + 2u);
  EXPECT_EQ(position_bytes(dct({65537}, 1, 65537, 9, ValueType::kBF16)), 4u + 2u);
}

TEST(PayloadFormat, EncodedSizeIsExact) {
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {}}), 20u);
  EXPECT_EQ(encoded_size({PayloadKind::kDemo, {dct({64, 64}, 64, 64, 4, ValueType::kOneBit)}}),
            20u + 8 + 4 + 12 + 4 * 2 + 1);
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {dense({3, 5}, ValueType::kBF16)}}),
            20u + 12 + 30);
  EXPECT_EQ(encoded_size({PayloadKind::kPseudoGradient, {int8_rows({2, 3, 4})}}),
            20u + 16 + 6 * 4 + 24);
  // Near the element limit the arithmetic must not overflow.
  EXPECT_EQ(encoded_size({PayloadKind::kGradient, {dense({1 << 20, (1 << 20) - 1})}}),
            20u + 12 + 4 * ((uint64_t{1} << 40) - (uint64_t{1} << 20)));
  // DeMo's own layouts.
  const TensorLayout demo = demo_tensor_layout({288, 768}, 64, 4, true);
  EXPECT_EQ(encoded_size({PayloadKind::kDemo, {demo}}), 20u + 12 + 12 + 72 * 4 * 2 + 72 * 4 / 8);
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
    layouts.push_back(dct({256}, 1, 64, 3, type));         // u8 positions
    layouts.push_back(dct({128, 64}, 64, 64, 100, type));  // u16 positions
    layouts.push_back(dct({2, 6, 8}, 3, 4, 12, type));     // topk == chunk size
    layouts.push_back(dct({70000}, 1, 70000, 300, type));  // u32 positions
    layouts.push_back(dct({5, 1, 7}, 1, 7, 1, type));
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

// ---------------------------------------------------------------------------------------------
// Rejections: decoding

class PayloadReject : public ::testing::Test {
 protected:
  const std::string valid_ = unhex(kHandBuiltHex);
};

TEST_F(PayloadReject, HeaderFields) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 0, "XGPL")), "payload: magic is 58 47 50 4c",
                    "expected 41 47 50 4c");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 4, unhex("0200"))), "payload: version 2",
                    "allowed: 1");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 6, unhex("09"))), "payload: kind 9 is unknown",
                    "pseudo_gradient");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 6, unhex("00"))), "kind 0 is unknown");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 7, unhex("01"))), "payload: flags is 1",
                    "allowed: 0");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 23, unhex("05"))),
                    "payload tensor 0: reserved byte is 5", "allowed: 0");
  EXPECT_ERROR_WITH(decode_payload(""), "payload: truncated", "magic");
}

TEST_F(PayloadReject, EveryTruncationAndTrailingBytes) {
  for (size_t n = 0; n < valid_.size(); ++n) {
    EXPECT_ERROR_WITH(decode_payload(valid_.substr(0, n)), "payload");
  }
  EXPECT_ERROR_WITH(decode_payload(valid_ + '\0'), "payload: 1 trailing bytes",
                    "ends at offset 119");
}

TEST_F(PayloadReject, PositionsOutOfRangeOrNotAscending) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("0104"))), "payload tensor 0 [8]",
                    "position 4 in chunk 0 is out of range (allowed: < 4)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 42, unhex("ff"))),
                    "position 255 in chunk 1 is out of range (allowed: < 4)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("0101"))),
                    "positions in chunk 0 are not strictly ascending (1 follows 1)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 42, unhex("0200"))),
                    "positions in chunk 1 are not strictly ascending (0 follows 2)");
  // u16 positions of the second tensor: 300 is out of a 300-wide chunk.
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 69, unhex("2c01"))),
                    "payload tensor 1 [2, 300]: position 300 in chunk 0 is out of range");
}

TEST_F(PayloadReject, NonFiniteValuesAndBadScales) {
  const size_t f32_at = 73, bf16_at = 89, scale_at = 107;
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, f32_at, unhex("0000c07f"))),
                    "payload tensor 1 [2, 300]: value 0 is nan (allowed: finite numbers)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, f32_at + 4, unhex("000080ff"))),
                    "value 1 is -inf");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, bf16_at + 2, unhex("c07f"))),
                    "payload tensor 2 [3]: value 1 is nan");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, bf16_at + 4, unhex("807f"))), "value 2 is inf");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, scale_at, unhex("000080bf"))),
                    "payload tensor 3 [2, 2]: scale 0 is -1 (allowed: finite and >= 0)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, scale_at + 4, unhex("0000c07f"))),
                    "scale 1 is nan");
}

TEST_F(PayloadReject, OneBitPaddingMustBeZero) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 44, unhex("19"))), "payload tensor 0 [8]",
                    "padding bits");
}

TEST_F(PayloadReject, ChunksAndTopK) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 32, unhex("03"))),
                    "chunk_cols 3 does not divide dimension 0 (8)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 32, unhex("00"))), "chunk_cols 0");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 28, unhex("02"))),
                    "chunk_rows 2 is invalid for a 1-D tensor (allowed: 1)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 36, unhex("00"))),
                    "payload tensor 0 [8]: topk 0 is out of range (allowed: 1 to 4");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 36, unhex("05"))), "topk 5 is out of range");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 57, unhex("03"))),
                    "chunk_rows 3 does not divide dimension 0 (2)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 57, unhex("00"))), "chunk_rows 0");
}

TEST_F(PayloadReject, DimensionsAndTypes) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 20, unhex("00"))),
                    "payload tensor 0: ndim 0 is invalid (allowed: 1 to 8)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 20, unhex("09"))), "ndim 9 is invalid");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 24, unhex("00"))),
                    "payload tensor 0 [0]: dimension 0 is 0 (allowed: 1 to 4294967295)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 21, unhex("07"))), "encoding 7 is unknown");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 22, unhex("09"))), "value_type 9 is unknown");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 22, unhex("04"))),
                    "value_type int8 is not allowed with encoding dct_topk");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 82, unhex("0203"))),
                    "payload tensor 2 [3]: value_type one_bit is not allowed with encoding dense "
                    "(allowed: f32 or bf16)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 97, unhex("01"))),
                    "value_type f32 is not allowed with encoding int8_rows (allowed: int8)");
}

TEST_F(PayloadReject, HugeSizesFailBeforeAllocating) {
  const std::string header = unhex("4147504c 0100 02 00 0000000000000000 01000000");
  // Eight dimensions of 2^32 - 1: the product overflows 64 bits.
  std::string huge = header + unhex("08 02 01 00");
  for (int i = 0; i < 8; ++i) huge += unhex("ffffffff");
  EXPECT_ERROR_WITH(decode_payload(huge), "the element count is too large (allowed: < 2^40)");
  // 2^40 exactly is one too many.
  EXPECT_ERROR_WITH(decode_payload(header + unhex("02 02 01 00 00001000 00001000")),
                    "element count is too large");
  // 2^39 elements is a valid layout; its data is missing, and nothing is allocated for it.
  EXPECT_ERROR_WITH(decode_payload(header + unhex("02 02 01 00 00000800 00001000") + "junk"),
                    "payload tensor 0 [524288, 1048576]: truncated: the data needs 2199023255552",
                    "only 4 remain");
  // A tensor count of 2^32 - 1 with 30 bytes to describe them.
  std::string many = patched(header, 16, unhex("ffffffff")) + std::string(30, '\0');
  EXPECT_ERROR_WITH(decode_payload(many), "payload: tensor count 4294967295 cannot fit",
                    "allowed: <= 3");
}

// ---------------------------------------------------------------------------------------------
// Rejections: encoding

TEST(PayloadEncodeReject, InconsistentContents) {
  Payload p = hand_built();
  p.tensors[0].values.push_back(1.0f);
  EXPECT_ERROR_WITH(encode_payload(p), "payload tensor 0 [8]: values has 5 entries, expected 4");
  p = hand_built();
  p.tensors[0].positions = {1, 3, 2, 2};
  EXPECT_ERROR_WITH(encode_payload(p), "positions in chunk 1 are not strictly ascending");
  p = hand_built();
  p.tensors[0].positions = {1, 4, 0, 2};
  EXPECT_ERROR_WITH(encode_payload(p), "position 4 in chunk 0 is out of range (allowed: < 4)");
  p = hand_built();
  p.tensors[2].positions = {0};
  EXPECT_ERROR_WITH(encode_payload(p), "payload tensor 2 [3]: positions has 1 entries, expected 0");
  p = hand_built();
  p.tensors[3].scales.pop_back();
  EXPECT_ERROR_WITH(encode_payload(p), "scales has 1 entries, expected 2");
  p = hand_built();
  p.tensors[3].scales[1] = -0.5f;
  EXPECT_ERROR_WITH(encode_payload(p),
                    "payload tensor 3 [2, 2]: scale 1 is -0.5 (allowed: finite and >= 0)");
  p = hand_built();
  p.tensors[3].scales[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_ERROR_WITH(encode_payload(p), "scale 0 is nan");
  p = hand_built();
  p.kind = static_cast<PayloadKind>(0);
  EXPECT_ERROR_WITH(encode_payload(p), "payload: kind 0 is unknown");
}

TEST(PayloadEncodeReject, NonFiniteValues) {
  for (const ValueType type : {ValueType::kF32, ValueType::kBF16, ValueType::kOneBit}) {
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Payload p;
      TensorPayload t;
      t.layout = dct({4}, 1, 4, 2, type);
      t.positions = {0, 3};
      t.values = {1.0f, bad};
      p.tensors = {t};
      EXPECT_ERROR_WITH(encode_payload(p), "payload tensor 0 [4]: value 1 is",
                        "(allowed: finite numbers)");
    }
  }
  Payload p;
  TensorPayload t;
  t.layout = dense({1}, ValueType::kBF16);
  t.values = {std::numeric_limits<float>::max()};
  p.tensors = {t};
  EXPECT_ERROR_WITH(encode_payload(p), "value 0 is", "overflows bf16");
}

TEST(PayloadEncodeReject, BadLayouts) {
  const auto encode_layout = [](const TensorLayout& l) {
    Payload p;
    TensorPayload t;
    t.layout = l;
    p.tensors = {t};
    return encode_payload(p);
  };
  const auto size_of = [](const TensorLayout& l) {
    return encoded_size({PayloadKind::kDemo, {l}});
  };
  EXPECT_ERROR_WITH(encode_layout(dct({8}, 1, 3, 1, ValueType::kF32)),
                    "chunk_cols 3 does not divide dimension 0 (8)");
  EXPECT_ERROR_WITH(size_of(dct({6, 8}, 4, 8, 1, ValueType::kF32)),
                    "payload tensor 0 [6, 8]: chunk_rows 4 does not divide dimension 0 (6)");
  EXPECT_ERROR_WITH(size_of(dct({6, 8}, 3, 8, 25, ValueType::kF32)),
                    "topk 25 is out of range (allowed: 1 to 24, the size of a 3 x 8 chunk)");
  EXPECT_ERROR_WITH(size_of(dct({6, 8}, 3, 8, 0, ValueType::kF32)), "topk 0 is out of range");
  EXPECT_ERROR_WITH(size_of(dense({})), "payload tensor 0 []: ndim 0 is invalid");
  EXPECT_ERROR_WITH(size_of(dense({1, 1, 1, 1, 1, 1, 1, 1, 1})), "ndim 9 is invalid");
  EXPECT_ERROR_WITH(size_of(dense({3, 0})), "dimension 1 is 0");
  EXPECT_ERROR_WITH(size_of(dense({-2})), "dimension 0 is -2");
  EXPECT_ERROR_WITH(size_of(dense({int64_t{1} << 32})), "dimension 0 is 4294967296");
  EXPECT_ERROR_WITH(size_of(dense({1 << 20, 1 << 20})), "element count is too large");
  EXPECT_ERROR_WITH(size_of(dense({3}, ValueType::kOneBit)),
                    "value_type one_bit is not allowed with encoding dense");
  TensorLayout chunked = dense({4});
  chunked.topk = 1;
  EXPECT_ERROR_WITH(size_of(chunked),
                    "encoding dense has no chunks, but chunk is 1 x 1 and topk 1");
  chunked = int8_rows({4});
  chunked.chunk_cols = 2;
  EXPECT_ERROR_WITH(size_of(chunked),
                    "encoding int8_rows has no chunks, but chunk is 1 x 2 and topk 0");
}

}  // namespace
}  // namespace agora
