// The payload codec refuses every malformed input with an Error that names what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agora/optim/payload.h"
#include "payload_test_support.h"

namespace agora {
namespace {
using namespace payload_testing;

// ---------------------------------------------------------------------------------------------
// Rejections: decoding

class PayloadReject : public ::testing::Test {
 protected:
  const std::string valid_ = unhex(kHandBuiltHex);
};

TEST_F(PayloadReject, HeaderFields) {
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 0, "XGPL")), "payload: magic is 58 47 50 4c",
                    "expected 41 47 50 4c");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 4, unhex("0300"))),
                    "payload: version 3 is not supported (allowed: 2)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 4, unhex("0100"))),
                    "payload: version 1 is not supported (allowed: 2; version 1, with fixed-width "
                    "positions, is no longer read)");
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
                    "ends at offset 115");
}

TEST_F(PayloadReject, RanksOutOfRangeAndPadding) {
  // Tensor 0: 3-bit ranks below C(4, 2) = 6 in bits 0..2 and 3..5 of byte 40, bits 6..7 padding.
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("0e"))), "payload tensor 0 [8]",
                    "the position rank of chunk 0 is 6 (allowed: < C(4, 2) = 6)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("3c"))),
                    "the position rank of chunk 1 is 7 (allowed: < C(4, 2) = 6)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("4c"))), "payload tensor 0 [8]",
                    "the padding bits after the last chunk's positions are not 0 (byte 0x4c, 6 "
                    "bits used)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 40, unhex("8c"))), "padding bits");
  // Tensor 1: 9-bit ranks below 300 in bytes 66..68; 300 | 5 << 9 = 0x0b2c.
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 66, unhex("2c0b00"))),
                    "payload tensor 1 [2, 300]: the position rank of chunk 0 is 300 (allowed: < "
                    "C(300, 1) = 300)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 66, unhex("2bff03"))),
                    "the position rank of chunk 1 is 511");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 68, unhex("04"))), "payload tensor 1 [2, 300]",
                    "padding bits", "2 bits used");
}

TEST_F(PayloadReject, NonFiniteValuesAndBadScales) {
  const size_t f32_at = 69, bf16_at = 85, scale_at = 103;
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
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 41, unhex("19"))), "payload tensor 0 [8]",
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
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 54, unhex("03"))),
                    "chunk_rows 3 does not divide dimension 0 (2)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 54, unhex("00"))), "chunk_rows 0");
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
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 78, unhex("0203"))),
                    "payload tensor 2 [3]: value_type one_bit is not allowed with encoding dense "
                    "(allowed: f32 or bf16)");
  EXPECT_ERROR_WITH(decode_payload(patched(valid_, 93, unhex("01"))),
                    "value_type f32 is not allowed with encoding int8_rows (allowed: int8)");
}

TEST_F(PayloadReject, HugeSizesFailBeforeAllocating) {
  const std::string header = unhex("4147504c 0200 02 00 0000000000000000 01000000");
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
  // Positions are u32: a chunk of 2^33 coefficients is refused, one of 2^32 is fine.
  EXPECT_ERROR_WITH(size_of(dct({1 << 17, 1 << 17}, 1 << 16, 1 << 17, 1, ValueType::kOneBit)),
                    "payload tensor 0 [131072, 131072]: a 65536 x 131072 chunk has 8589934592 "
                    "coefficients, too many (allowed: <= 2^32)");
  EXPECT_EQ(size_of(dct({1 << 16, 1 << 16}, 1 << 16, 1 << 16, 1, ValueType::kOneBit)),
            20u + 4 + 8 + 12 + 4 + 1);
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
