// Shared by the payload codec's tests: layout builders, random valid contents, bit-exact
// comparison, a round trip that checks every promise at once, unhex for grouped digits, and a
// hand-built payload with one tensor of each encoding whose bytes are written out in full.
#pragma once

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
#include "agora/core/hex.h"
#include "agora/optim/chunking.h"
#include "agora/optim/payload.h"
#include "test_support.h"

namespace agora::payload_testing {
// ---------------------------------------------------------------------------------------------
// Helpers

inline TensorLayout dct(std::vector<int64_t> shape, int64_t rows, int64_t cols, int64_t topk,
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

inline TensorLayout plain(std::vector<int64_t> shape, TensorEncoding encoding, ValueType type) {
  TensorLayout l;
  l.shape = std::move(shape);
  l.encoding = encoding;
  l.value_type = type;
  return l;
}

inline TensorLayout dense(std::vector<int64_t> shape, ValueType type = ValueType::kF32) {
  return plain(std::move(shape), TensorEncoding::kDense, type);
}

TensorLayout int8_rows(std::vector<int64_t> shape) {
  return plain(std::move(shape), TensorEncoding::kInt8Rows, ValueType::kInt8);
}

// Valid random contents for `layout`: distinct ascending positions per chunk, values exact in the
// layout's value type.
inline TensorPayload random_tensor(const TensorLayout& layout, uint32_t seed) {
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

inline std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (const float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

// Equality down to the bits of every float (Payload's == would take -0 for +0).
inline void expect_identical(const Payload& a, const Payload& b) {
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

inline PayloadLayout layout_of(const Payload& p) {
  PayloadLayout layout{p.kind, {}};
  for (const TensorPayload& t : p.tensors) layout.tensors.push_back(t.layout);
  return layout;
}

// Encodes, checks the size against encoded_size(), decodes (with and without the layout) and
// re-encodes; returns the bytes.
inline std::string round_trip(const Payload& p) {
  const std::string bytes = encode_payload(p);
  EXPECT_EQ(bytes.size(), encoded_size(layout_of(p)));
  const Payload back = decode_payload(bytes);
  expect_identical(back, p);
  expect_identical(decode_payload(bytes, layout_of(p)), p);
  EXPECT_EQ(encode_payload(back), bytes);
  return bytes;
}

// The bytes of hex text written in groups ("4147504c 0100"), as the format is laid out below.
inline std::string unhex(std::string_view text) {
  std::string digits;
  for (const char c : text) {
    if (c != ' ') digits += c;
  }
  return hex_decode(digits);
}

inline std::string patched(std::string bytes, size_t offset, std::string_view replacement) {
  bytes.replace(offset, replacement.size(), replacement);
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// The format, byte for byte

// A hand-built payload with one tensor of each encoding, 115 bytes. Offsets for the rejection
// tests: tensor 0 at 20 (ndim 20, encoding 21, value_type 22, reserved 23, dims 24, chunk_rows 28,
// chunk_cols 32, topk 36, positions 40, the one-bit byte 41); tensor 1 at 42 (chunk_rows 54,
// positions 66..68, values 69); tensor 2 at 77 (encoding 78, values 85); tensor 3 at 91
// (value_type 93, scales 103).
//
// Positions are ranks: chunk {1, 3} of 4 is C(1, 1) + C(3, 2) = 4 and {0, 2} is C(2, 2) = 1, 3
// bits each (C(4, 2) = 6 sets), so bits 0..2 = 4 and 3..5 = 1: 0b00001100. With one position of
// 300 the rank is the position, in 9 bits: 299 | 5 << 9 = 0x000b2b.
inline const char* const kHandBuiltHex =
    "4147504c 0200 01 00 0700000000000000 04000000"    // header: AGPL v2 demo step 7, 4 tensors
    "01 01 03 00 08000000 01000000 04000000 02000000"  // [8] dct_topk one_bit, chunk 1x4, topk 2
    "0c 09"                                            // ranks 4, 1; -1 +1 +1 -1 = 0b1001
    "02 01 01 00 02000000 2c010000 01000000 2c010000 01000000"  // [2, 300] dct_topk f32 1x300 k1
    "2b0b00 0000c03f 000000c0"                                  // ranks 299, 5; values 1.5, -2
    "01 02 02 00 03000000 803f 00bf 4040"                       // [3] dense bf16: 1, -0.5, 3
    "02 03 04 00 02000000 02000000"                             // [2, 2] int8_rows
    "0000003f 00000000 01 ff 7f 80";  // scales 0.5, 0; values 1, -1, 127, -128

inline Payload hand_built() {
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

}  // namespace agora::payload_testing
