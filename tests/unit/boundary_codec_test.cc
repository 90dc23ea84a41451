// The pipeline boundary codec: the format byte for byte, round trips of every codec in both
// directions with each codec's promise (f32, subspace and columns exact, bf16 rounded, int8
// within half a scale), the size formulas, and rejections, each naming its field.
// (The fuzz target's hand-made seeds: boundary_seeds_test.cc.)
#include "agora/pipeline/boundary_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "agora/core/file.h"
#include "agora/core/hex.h"
#include "agora/core/little_endian.h"
#include "agora/optim/payload.h"  // round_to_bf16, the reference rounding
#include "boundary_test_support.h"
#include "test_support.h"

namespace agora {
namespace {

using namespace boundary_test;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> bits;
  for (const float x : v) bits.push_back(std::bit_cast<uint32_t>(x));
  return bits;
}

// The int8 body's scales, read as the format lays them out.
std::vector<float> int8_scales(const std::string& bytes, const BoundaryHeader& h) {
  const uint64_t n = uint64_t{h.rows} * h.width;
  std::vector<float> scales;
  size_t offset = kBoundaryHeaderBytes;
  for (uint64_t begin = 0; begin < n; begin += h.block) {
    scales.push_back(
        std::bit_cast<float>(load_le32(reinterpret_cast<const uint8_t*>(bytes.data()) + offset)));
    offset += 4 + std::min<uint64_t>(h.block, n - begin);
  }
  EXPECT_EQ(offset, bytes.size());
  return scales;
}

// Each value within half its block's scale, up to the float rounding of q * scale.
void expect_int8_bound(const std::vector<float>& v, const std::string& bytes,
                       const BoundaryMessage& m) {
  const BoundaryHeader& h = m.header;
  const std::vector<float> scales = int8_scales(bytes, h);
  ASSERT_EQ(m.values.size(), v.size());
  for (size_t b = 0; b < scales.size(); ++b) {
    const size_t begin = b * h.block;
    const size_t end = std::min<size_t>(begin + h.block, v.size());
    float absmax = 0;
    for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(v[i]));
    const double scale = scales[b];
    // The scale is absmax / 127 rounded up to a float.
    // (Unless rounding up would make 127 * scale overflow: a block holding the largest floats.)
    if (std::isfinite(std::nextafter(scales[b], kInf) * 127.0f)) {
      EXPECT_GE(scale * 127, static_cast<double>(absmax)) << "block " << b;
    }
    EXPECT_LE(scale, std::nextafter(absmax / 127.0f, kInf)) << "block " << b;
    if (absmax == 0) {
      EXPECT_EQ(scale, 0.0) << "block " << b;
    }
    for (size_t i = begin; i < end; ++i) {
      const double rounding = std::fabs(m.values[i]) * 0x1p-24 + 0x1p-150;
      ASSERT_LE(std::fabs(static_cast<double>(m.values[i]) - v[i]), scale / 2 + rounding)
          << "value " << i << " (" << v[i] << ") in block " << b << " of scale " << scale;
    }
  }
}

// Encodes, checks the size and each codec's promise, and returns the bytes.
std::string round_trip(const BoundaryHeader& h, const std::vector<float>& v,
                       const std::vector<uint32_t>& tokens) {
  const std::vector<uint32_t> columns = column_ids(h);
  const std::string bytes = encode_boundary(h, v, tokens, columns);
  EXPECT_EQ(bytes.size(), boundary_encoded_size(h));
  const BoundaryMessage m = decode_boundary(bytes);
  EXPECT_EQ(m.header, h);
  EXPECT_EQ(m.tokens, tokens);
  EXPECT_EQ(m.columns, columns);
  switch (h.codec) {
    case BoundaryCodec::kF32:
    case BoundaryCodec::kSubspace:
    case BoundaryCodec::kColumns:
      EXPECT_EQ(bits_of(m.values), bits_of(v));
      EXPECT_EQ(encode_boundary(m.header, m.values, m.tokens, m.columns), bytes);
      break;
    case BoundaryCodec::kBF16: {
      std::vector<float> rounded;
      for (const float x : v) rounded.push_back(round_to_bf16(x));
      EXPECT_EQ(bits_of(m.values), bits_of(rounded));
      EXPECT_EQ(encode_boundary(m.header, m.values, m.tokens), bytes);
      break;
    }
    case BoundaryCodec::kInt8:
      expect_int8_bound(v, bytes, m);
      break;
  }
  return bytes;
}

std::string valid(BoundaryCodec codec, BoundaryDirection direction = BoundaryDirection::kForward,
                  uint32_t rows = 2, uint32_t width = 3, uint32_t block = 0) {
  const BoundaryHeader h = header(codec, direction, rows, width, block);
  return encode_boundary(h, random_values(size_t{rows} * width, 1), token_ids(h), column_ids(h));
}

std::string patched(std::string bytes, size_t offset, uint64_t value, size_t n) {
  std::string replacement;
  append_le(replacement, value, n);
  bytes.replace(offset, n, replacement);
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Format

TEST(BoundaryFormat, HandBuiltBytesAreExact) {
  const BoundaryHeader h = header(BoundaryCodec::kSubspace, BoundaryDirection::kForward, 2, 1);
  const std::vector<float> v = {1.0f, -2.5f};
  const std::vector<uint32_t> t = {5, 0xfffffffeu};
  const std::string expected = hex_decode(
      "41475042"          // "AGPB"
      "0100"              // version 1
      "01"                // forward
      "04"                // subspace
      "efcdab8967452301"  // step
      "07000000"          // micro_batch
      "02000000"          // stage
      "02000000"          // rows
      "01000000"          // width
      "00000000"          // block
      "05000000"          // tokens
      "feffffff"
      "0000803f"  // 1.0f
      "000020c0"  // -2.5f
  );
  EXPECT_EQ(hex_encode(encode_boundary(h, v, t)), hex_encode(expected));
  const BoundaryMessage m = decode_boundary(expected);
  EXPECT_EQ(m.header, h);
  EXPECT_EQ(m.values, v);
  EXPECT_EQ(m.tokens, t);
}

TEST(BoundaryFormat, Int8BlocksAreScaleThenCodes) {
  // Block 0: absmax 127 gives scale 1 exactly; block 1 is all zero; block 2 is short.
  const BoundaryHeader h = header(BoundaryCodec::kInt8, BoundaryDirection::kBackward, 1, 5, 2);
  const std::string bytes = encode_boundary(h, std::vector<float>{127, -3.4f, 0, -0.0f, 2}, {});
  EXPECT_EQ(hex_encode(bytes.substr(kBoundaryHeaderBytes)),
            "0000803f"  // scale 1: 127 / 127
            "7ffd"      // 127, -3
            "00000000"  // scale 0
            "0000"      // codes 0
            "0502813c"  // 2 / 127 rounded up: 0x3c810205, one above the nearest
            "7f");      // 127
  EXPECT_EQ(bytes.size(), kBoundaryHeaderBytes + 3 * 4 + 5);
  const BoundaryMessage m = decode_boundary(bytes);
  EXPECT_EQ(m.values[0], 127.0f);
  EXPECT_EQ(m.values[1], -3.0f);
  EXPECT_EQ(bits_of({m.values[2], m.values[3]}), bits_of({0.0f, 0.0f}));
  EXPECT_NEAR(m.values[4], 2.0f, 1e-6);
}

TEST(BoundaryFormat, EncodedSizeIsExact) {
  using enum BoundaryCodec;
  const auto size = [](BoundaryCodec c, BoundaryDirection d, uint32_t rows, uint32_t width,
                       uint32_t block = 0) {
    return boundary_encoded_size(header(c, d, rows, width, block));
  };
  const auto fwd = BoundaryDirection::kForward;
  const auto bwd = BoundaryDirection::kBackward;
  EXPECT_EQ(kBoundaryHeaderBytes, 36u);
  EXPECT_EQ(size(kF32, fwd, 3, 5), 36u + 60);
  EXPECT_EQ(size(kF32, bwd, 3, 5), 36u + 60);
  EXPECT_EQ(size(kBF16, fwd, 3, 5), 36u + 30);
  EXPECT_EQ(size(kInt8, fwd, 3, 5, 5), 36u + 3 * 4 + 15);
  EXPECT_EQ(size(kInt8, bwd, 3, 5, 4), 36u + 4 * 4 + 15);  // a short last block of 3
  EXPECT_EQ(size(kInt8, fwd, 3, 5, 100), 36u + 4 + 15);    // one block, shorter than `block`
  EXPECT_EQ(size(kSubspace, fwd, 3, 5), 36u + 12 + 60);    // token ids
  EXPECT_EQ(size(kSubspace, bwd, 3, 5), 36u + 60);
  // The largest geometry does not overflow the arithmetic: 2^64 - 2^33 + 1 values.
  EXPECT_ERROR_WITH(size(kF32, fwd, 0xffffffffu, 0xffffffffu), "boundary message",
                    "4294967295 rows x 4294967295 values", "2^64 bytes");
  EXPECT_EQ(size(kInt8, fwd, 1u << 31, 1u << 31, 1u << 16),
            36u + (uint64_t{1} << 62) + 4 * (uint64_t{1} << 46));
}

TEST(BoundaryFormat, BytesPerTokenMatchTheEncodedSize) {
  using enum BoundaryCodec;
  EXPECT_EQ(boundary_bytes_per_token(kF32, 768, 0, true), 3072.0);
  EXPECT_EQ(boundary_bytes_per_token(kBF16, 768, 0, false), 1536.0);
  EXPECT_EQ(boundary_bytes_per_token(kInt8, 768, 64, true), 768.0 + 48);
  EXPECT_EQ(boundary_bytes_per_token(kSubspace, 32, 0, true), 132.0);
  EXPECT_EQ(boundary_bytes_per_token(kSubspace, 32, 0, false), 128.0);
  EXPECT_EQ(boundary_bytes_per_token(kF32, 768, 64, true), 3072.0);  // block ignored
  EXPECT_EQ(boundary_bytes_per_token(BoundaryCodec::kColumns, 192, 768, false), 768.0);
  EXPECT_ERROR_WITH(boundary_bytes_per_token(kInt8, 768, 0, true), "block is 0 with codec int8");
  EXPECT_ERROR_WITH(boundary_bytes_per_token(static_cast<BoundaryCodec>(9), 768, 0, true),
                    "codec 9 is unknown");
  // A GPT-2-small boundary of 8 x 1024 tokens from the layout alone, against the exact size.
  for (const BoundaryCodec c : {kF32, kBF16, kInt8, kSubspace, BoundaryCodec::kColumns}) {
    for (const bool forward : {true, false}) {
      const bool columns = c == BoundaryCodec::kColumns;
      const uint32_t width = c == kSubspace ? 64 : columns ? 192 : 768;
      const uint32_t block = c == kInt8 ? 64 : columns ? 768 : 0;
      const BoundaryHeader h =
          header(c, forward ? BoundaryDirection::kForward : BoundaryDirection::kBackward, 8192,
                 width, block);
      EXPECT_EQ(kBoundaryHeaderBytes + 8192 * boundary_bytes_per_token(c, width, block, forward) +
                    (columns ? 4 * width : 0),  // the indices, once per message
                static_cast<double>(boundary_encoded_size(h)))
          << to_string(c) << " " << forward;
    }
  }
  // With a short last block the message has the ceiling of it: 10 values in blocks of 4.
  EXPECT_EQ(boundary_encoded_size(header(kInt8, BoundaryDirection::kForward, 5, 2, 4)),
            kBoundaryHeaderBytes + 10 + 3 * 4);
  EXPECT_EQ(5 * boundary_bytes_per_token(kInt8, 2, 4, true), 10 + 2.5 * 4);
}

TEST(BoundaryFormat, NamesOfEnums) {
  EXPECT_STREQ(to_string(BoundaryCodec::kF32), "f32");
  EXPECT_STREQ(to_string(BoundaryCodec::kBF16), "bf16");
  EXPECT_STREQ(to_string(BoundaryCodec::kInt8), "int8");
  EXPECT_STREQ(to_string(BoundaryCodec::kSubspace), "subspace");
  EXPECT_STREQ(to_string(BoundaryCodec::kColumns), "columns");
  EXPECT_STREQ(to_string(static_cast<BoundaryCodec>(0)), "unknown");
  EXPECT_STREQ(to_string(BoundaryDirection::kForward), "forward");
  EXPECT_STREQ(to_string(BoundaryDirection::kBackward), "backward");
  EXPECT_STREQ(to_string(static_cast<BoundaryDirection>(3)), "unknown");
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(BoundaryRoundTrip, EveryCodecAndDirection) {
  uint32_t seed = 0;
  for (const BoundaryCodec c : {BoundaryCodec::kF32, BoundaryCodec::kBF16, BoundaryCodec::kInt8,
                                BoundaryCodec::kSubspace, BoundaryCodec::kColumns}) {
    for (const BoundaryDirection d : {BoundaryDirection::kForward, BoundaryDirection::kBackward}) {
      for (const auto& [rows, width] :
           std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {3, 7}, {16, 64}, {5, 1000}}) {
        for (const uint32_t block : {1u, 7u, 64u, 60000u}) {
          if (c != BoundaryCodec::kInt8 && c != BoundaryCodec::kColumns && block != 1) continue;
          if (c == BoundaryCodec::kColumns && block < width) continue;
          const BoundaryHeader h =
              header(c, d, rows, width,
                     c == BoundaryCodec::kInt8 || c == BoundaryCodec::kColumns ? block : 0);
          SCOPED_TRACE(::testing::Message() << to_string(c) << " " << to_string(d) << " " << rows
                                            << " x " << width << " block " << h.block);
          round_trip(h, random_values(size_t{rows} * width, ++seed), token_ids(h));
        }
      }
    }
  }
}

TEST(BoundaryRoundTrip, F32KeepsEveryFiniteBitPattern) {
  const std::vector<float> v = {-0.0f,
                                0.0f,
                                std::numeric_limits<float>::denorm_min(),
                                -std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                1.0f / 3};
  for (const BoundaryCodec c : {BoundaryCodec::kF32, BoundaryCodec::kSubspace}) {
    for (const BoundaryDirection d : {BoundaryDirection::kForward, BoundaryDirection::kBackward}) {
      const BoundaryHeader h = header(c, d, 1, static_cast<uint32_t>(v.size()));
      round_trip(h, v, token_ids(h));
    }
  }
}

TEST(BoundaryRoundTrip, Bf16RoundsToNearestEven) {
  const BoundaryHeader h = header(BoundaryCodec::kBF16, BoundaryDirection::kForward, 1, 6);
  const std::vector<float> v = {
      std::bit_cast<float>(0x3f808000u),  // tie, kept part even: down
      std::bit_cast<float>(0x3f818000u),  // tie, kept part odd: up
      std::bit_cast<float>(0xbf818000u),  // negative tie, odd: away from zero
      std::bit_cast<float>(0x3f7fffffu),  // carry into the exponent
      -0.0f,
      std::bit_cast<float>(0x7f7f0000u),  // the largest bf16
  };
  const BoundaryMessage m = decode_boundary(round_trip(h, v, {}));
  EXPECT_EQ(bits_of(m.values), (std::vector<uint32_t>{0x3f800000u, 0x3f820000u, 0xbf820000u,
                                                      0x3f800000u, 0x80000000u, 0x7f7f0000u}));
}

TEST(BoundaryRoundTrip, Int8ErrorBoundOverScales) {
  // Blocks of very different magnitudes, outliers, subnormals and the largest floats.
  std::vector<float> v = random_values(4096, 11);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] *= std::ldexp(1.0f, static_cast<int>(i / 256) * 9 - 70);
  v[300] = 1e6f;
  v[1000] = -std::numeric_limits<float>::max();
  v[1001] = std::numeric_limits<float>::max();
  for (size_t i = 0; i < 64; ++i) v[2048 + i] = std::numeric_limits<float>::denorm_min() * i;
  for (const uint32_t block : {1u, 3u, 64u, 256u, 4096u}) {
    SCOPED_TRACE(::testing::Message() << "block " << block);
    const BoundaryHeader h =
        header(BoundaryCodec::kInt8, BoundaryDirection::kForward, 64, 64, block);
    round_trip(h, v, {});
  }
}

TEST(BoundaryRoundTrip, Int8AllZeroBlock) {
  const BoundaryHeader h = header(BoundaryCodec::kInt8, BoundaryDirection::kBackward, 2, 4, 4);
  const std::vector<float> v = {0, -0.0f, 0, 0, 1, 2, 3, 4};
  const std::string bytes = round_trip(h, v, {});
  EXPECT_EQ(int8_scales(bytes, h)[0], 0.0f);
  EXPECT_EQ(hex_encode(bytes.substr(kBoundaryHeaderBytes, 8)), "0000000000000000");
  const BoundaryMessage m = decode_boundary(bytes);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(m.values[i]), 0u) << i;
}

TEST(BoundaryRoundTrip, Int8ShortLastBlock) {
  // 10 values in blocks of 4: 4, 4 and 2; the last block has its own scale.
  const BoundaryHeader h = header(BoundaryCodec::kInt8, BoundaryDirection::kForward, 2, 5, 4);
  const std::vector<float> v = {1, 2, 3, 4, 100, 200, 300, 400, 0.5f, -0.25f};
  const std::string bytes = round_trip(h, v, {});
  const std::vector<float> scales = int8_scales(bytes, h);
  ASSERT_EQ(scales.size(), 3u);
  EXPECT_NEAR(scales[2], 0.5f / 127, 1e-9);
  const BoundaryMessage m = decode_boundary(bytes);
  EXPECT_NEAR(m.values[8], 0.5f, 1e-7);
  EXPECT_NEAR(m.values[9], -0.25f, scales[2] / 2 + 1e-7);
}

// ---------------------------------------------------------------------------------------------
// Rejections: decoding

TEST(BoundaryReject, EveryTruncationNamesWhatIsMissing) {
  for (const BoundaryCodec c : {BoundaryCodec::kF32, BoundaryCodec::kBF16, BoundaryCodec::kInt8,
                                BoundaryCodec::kSubspace, BoundaryCodec::kColumns}) {
    const std::string bytes = valid(c, BoundaryDirection::kForward, 2, 3,
                                    c == BoundaryCodec::kInt8      ? 4
                                    : c == BoundaryCodec::kColumns ? 8
                                                                   : 0);
    for (size_t n = 0; n < bytes.size(); ++n) {
      SCOPED_TRACE(::testing::Message() << to_string(c) << " prefix " << n);
      EXPECT_ERROR_WITH(decode_boundary(std::string_view(bytes).substr(0, n)), "boundary message",
                        "truncated");
    }
  }
  const std::string bytes = valid(BoundaryCodec::kF32);
  EXPECT_ERROR_WITH(decode_boundary(bytes.substr(0, 7)), "the codec needs 1 bytes at offset 7");
  EXPECT_ERROR_WITH(decode_boundary(bytes.substr(0, 30)), "width needs 4 bytes at offset 28");
  EXPECT_ERROR_WITH(decode_boundary(bytes.substr(0, bytes.size() - 1)),
                    "boundary message (forward, f32, step 81985529216486895, micro-batch 7, "
                    "stage 2, 2 x 3)",
                    "the body needs 24 bytes at offset 36, but only 23 remain");
}

TEST(BoundaryReject, TrailingBytes) {
  EXPECT_ERROR_WITH(decode_boundary(valid(BoundaryCodec::kBF16) + '\0'),
                    "1 trailing bytes after the body, which ends at offset 48");
  // Tokens where none are allowed: a subspace backward message with ids appended.
  const BoundaryHeader h = header(BoundaryCodec::kSubspace, BoundaryDirection::kBackward, 2, 3);
  std::string bytes = encode_boundary(h, random_values(6, 2), {});
  bytes += std::string(8, '\x01');
  EXPECT_ERROR_WITH(decode_boundary(bytes), "backward, subspace", "8 trailing bytes");
}

TEST(BoundaryReject, HeaderFields) {
  const std::string bytes = valid(BoundaryCodec::kF32);
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 3, 'L', 1)),
                    "magic is 41 47 50 4c, expected 41 47 50 42 (\"AGPB\")");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 4, 2, 2)),
                    "version 2 is not supported (allowed: 1)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 6, 0, 1)),
                    "direction 0 is unknown (allowed: 1 forward, 2 backward)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 7, 6, 1)),
                    "codec 6 is unknown (allowed: 1 f32, 2 bf16, 3 int8, 4 subspace, 5 columns)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 24, 0, 4)), "rows is 0 (allowed: 1 or more)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 28, 0, 4)), "width is 0 (allowed: 1 or more)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 32, 4, 4)),
                    "block is 4 with codec f32 (allowed: 0; only int8 and columns use it)");
  const std::string int8 = valid(BoundaryCodec::kInt8, BoundaryDirection::kForward, 2, 3, 4);
  EXPECT_ERROR_WITH(decode_boundary(patched(int8, 32, 0, 4)),
                    "block is 0 with codec int8 (allowed: 1 or more)");
}

TEST(BoundaryReject, ColumnIndices) {
  // 2 rows, 3 of 8 columns: indices 0, 2, 5 at offsets 36, 40, 44.
  const std::string bytes = valid(BoundaryCodec::kColumns, BoundaryDirection::kBackward, 2, 3, 8);
  EXPECT_EQ(decode_boundary(bytes).columns, (std::vector<uint32_t>{0, 2, 5}));
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 44, 8, 4)),
                    "column index 2 is 8 (allowed: increasing, below the full width 8)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 40, 0, 4)),
                    "column index 1 is 0 (allowed: increasing");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 32, 2, 4)),
                    "block is 2 with codec columns and width 3 (allowed: the row's full width");
  BoundaryLimits narrow;
  narrow.max_width = 4;
  EXPECT_ERROR_WITH(decode_boundary(bytes, narrow),
                    "the full width (block) 8 is too large (allowed: width to 4)");
  // The writer holds to the same rules.
  const BoundaryHeader h = header(BoundaryCodec::kColumns, BoundaryDirection::kForward, 2, 3, 8);
  const std::vector<float> v = random_values(6, 3);
  EXPECT_ERROR_WITH(encode_boundary(h, v, {}, std::vector<uint32_t>{1, 1, 2}),
                    "column index 1 is 1 (allowed: increasing");
  EXPECT_ERROR_WITH(encode_boundary(h, v, {}, std::vector<uint32_t>{1, 2}),
                    "2 column indices given, expected 3 (one per kept column)");
  EXPECT_ERROR_WITH(encode_boundary(header(BoundaryCodec::kF32, BoundaryDirection::kForward, 2, 3),
                                    v, {}, std::vector<uint32_t>{0, 1, 2}),
                    "3 column indices given, expected 0 (only columns messages carry them)");
}

TEST(BoundaryReject, SizesAboveTheLimitsBeforeAllocating) {
  // Headers alone (36 bytes) that claim huge bodies: refused by the limits, not by a failed
  // allocation; then, within raised limits, by the length.
  std::string bytes = valid(BoundaryCodec::kF32).substr(0, kBoundaryHeaderBytes);
  bytes = patched(patched(bytes, 24, 0xffffffffu, 4), 28, 0xffffffffu, 4);
  EXPECT_ERROR_WITH(decode_boundary(bytes),
                    "width 4294967295 is too large (allowed: 1 to 1048576)");
  bytes = patched(bytes, 28, 1u << 20, 4);
  EXPECT_ERROR_WITH(decode_boundary(bytes),
                    "rows x width = 4294967295 x 1048576 = 4503599626321920 values, too many "
                    "(allowed: at most 268435456)");
  const BoundaryLimits unlimited{std::numeric_limits<uint64_t>::max(), 0xffffffffu, 0xffffffffu};
  EXPECT_ERROR_WITH(decode_boundary(bytes, unlimited), "truncated: the body needs",
                    "but only 0 remain");
  bytes = patched(bytes, 28, 0xffffffffu, 4);
  EXPECT_ERROR_WITH(decode_boundary(bytes, unlimited), "take 2^64 bytes or more");
  // A receiver's own limits.
  const std::string small = valid(BoundaryCodec::kBF16, BoundaryDirection::kForward, 4, 3);
  EXPECT_ERROR_WITH(decode_boundary(small, BoundaryLimits{11, 3, 1}),
                    "4 x 3 = 12 values, too many (allowed: at most 11)");
  EXPECT_ERROR_WITH(decode_boundary(small, BoundaryLimits{12, 2, 1}),
                    "width 3 is too large (allowed: 1 to 2)");
  EXPECT_NO_THROW(decode_boundary(small, BoundaryLimits{12, 3, 1}));
  const std::string int8 = valid(BoundaryCodec::kInt8, BoundaryDirection::kForward, 2, 3, 5);
  EXPECT_ERROR_WITH(decode_boundary(int8, BoundaryLimits{6, 3, 4}),
                    "block 5 is too large (allowed: 1 to 4)");
}

TEST(BoundaryReject, NonFiniteValues) {
  const size_t body = kBoundaryHeaderBytes;
  const std::string f32 = valid(BoundaryCodec::kF32);
  EXPECT_ERROR_WITH(decode_boundary(patched(f32, body + 4 * 4, 0x7fc00000u, 4)), "forward, f32",
                    "value 4 (row 1, column 1) is nan (allowed: finite numbers)");
  EXPECT_ERROR_WITH(decode_boundary(patched(f32, body, 0xff800000u, 4)),
                    "value 0 (row 0, column 0) is -inf");
  const std::string bf16 = valid(BoundaryCodec::kBF16, BoundaryDirection::kBackward);
  EXPECT_ERROR_WITH(decode_boundary(patched(bf16, body + 2 * 5, 0x7f80u, 2)), "backward, bf16",
                    "value 5 (row 1, column 2) is inf");
  EXPECT_ERROR_WITH(decode_boundary(patched(bf16, body, 0xffc1u, 2)), "value 0", "nan (allowed");
  // Subspace forward: the coefficients follow the 2 token ids.
  const std::string sub = valid(BoundaryCodec::kSubspace);
  EXPECT_ERROR_WITH(decode_boundary(patched(sub, body + 8 + 4 * 2, 0x7f800001u, 4)),
                    "forward, subspace", "value 2 (row 0, column 2) is nan");
}

TEST(BoundaryReject, Int8ScalesAndCodes) {
  // 6 values in blocks of 4: scale 0 at 36, codes at 40..43, scale 1 at 44, codes at 48..49.
  const std::string bytes = valid(BoundaryCodec::kInt8, BoundaryDirection::kForward, 2, 3, 4);
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 44, 0x7f800000u, 4)), "forward, int8",
                    "block 1 has scale inf", "allowed: finite and >= 0");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 36, 0x7fc00000u, 4)), "block 0 has scale nan");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 36, std::bit_cast<uint32_t>(-1.0f), 4)),
                    "block 0 has scale -1");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 36, 0x7f7fffffu, 4)),
                    "block 0 has scale 3.4028235e+38", "with 127 * scale finite");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 49, 0x80, 1)),
                    "block 1 code 1 (value 5) is -128 (allowed: -127 to 127)");
  EXPECT_ERROR_WITH(decode_boundary(patched(bytes, 36, 0, 4)), "block 0 has scale 0 but code");
  // The largest scale accepted decodes to finite values only.
  float top = std::numeric_limits<float>::max() / 127.0f;
  while (!std::isfinite(top * 127.0f)) top = std::nextafter(top, 0.0f);
  const BoundaryMessage m =
      decode_boundary(patched(patched(bytes, 36, std::bit_cast<uint32_t>(top), 4), 40, 0x81, 1));
  EXPECT_TRUE(std::isfinite(m.values[0]));
  EXPECT_LT(m.values[0], 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Rejections: encoding

TEST(BoundaryReject, EncodeChecksSizesTokensAndValues) {
  const BoundaryHeader f32 = header(BoundaryCodec::kF32, BoundaryDirection::kForward, 2, 3);
  const std::vector<float> six = random_values(6, 3);
  const std::vector<uint32_t> two = {1, 2};
  EXPECT_ERROR_WITH(encode_boundary(f32, random_values(5, 3), {}),
                    "5 values given, expected rows x width = 6");
  EXPECT_ERROR_WITH(encode_boundary(f32, six, two),
                    "2 tokens given, expected 0 (only subspace forward messages carry tokens)");
  const BoundaryHeader back = header(BoundaryCodec::kSubspace, BoundaryDirection::kBackward, 2, 3);
  EXPECT_ERROR_WITH(encode_boundary(back, six, two), "backward, subspace", "2 tokens given");
  const BoundaryHeader fwd = header(BoundaryCodec::kSubspace, BoundaryDirection::kForward, 2, 3);
  EXPECT_ERROR_WITH(encode_boundary(fwd, six, {}),
                    "0 tokens given, expected 2 (one per row for subspace forward)");
  std::vector<float> bad = six;
  bad[4] = kNaN;
  EXPECT_ERROR_WITH(encode_boundary(f32, bad, {}), "value 4 (row 1, column 1) is nan");
  bad[4] = -kInf;
  const BoundaryHeader int8 = header(BoundaryCodec::kInt8, BoundaryDirection::kForward, 2, 3, 4);
  EXPECT_ERROR_WITH(encode_boundary(int8, bad, {}), "forward, int8", "value 4", "is -inf");
  bad[4] = std::numeric_limits<float>::max();
  const BoundaryHeader bf16 = header(BoundaryCodec::kBF16, BoundaryDirection::kForward, 2, 3);
  EXPECT_ERROR_WITH(encode_boundary(bf16, bad, {}), "value 4", "which bf16 holds");
  BoundaryHeader wrong = f32;
  wrong.block = 1;
  EXPECT_ERROR_WITH(encode_boundary(wrong, six, {}), "block is 1 with codec f32");
  wrong = int8;
  wrong.block = 0;
  EXPECT_ERROR_WITH(encode_boundary(wrong, six, {}), "block is 0 with codec int8");
  wrong.codec = static_cast<BoundaryCodec>(0);
  EXPECT_ERROR_WITH(encode_boundary(wrong, six, {}), "codec 0 is unknown");
  wrong = f32;
  wrong.direction = static_cast<BoundaryDirection>(7);
  EXPECT_ERROR_WITH(boundary_encoded_size(wrong), "direction 7 is unknown");
}

}  // namespace
}  // namespace agora
