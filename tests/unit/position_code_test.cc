// The position code of payload version 2: sizes fixed by (n, k), ranks that count the sets in
// colex order with no gaps, Elias-Fano bits as documented, round trips over many (n, k), and a
// canonical code: any bit string decodes to a set that re-encodes to it, or is refused.
#include "agora/optim/position_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "test_support.h"

namespace agora {
namespace {

std::vector<uint32_t> decode(const PositionCode& code, const std::string& bytes, uint64_t chunks,
                             uint64_t k) {
  EXPECT_EQ(bytes.size(), code.bytes(chunks));
  std::vector<uint32_t> positions(chunks * k);
  code.decode(reinterpret_cast<const uint8_t*>(bytes.data()), chunks, positions.data(), "test");
  return positions;
}

std::string encode(const PositionCode& code, const std::vector<uint32_t>& positions,
                   uint64_t chunks) {
  std::string out;
  code.encode(positions.data(), chunks, out);
  EXPECT_EQ(out.size(), code.bytes(chunks));
  return out;
}

// `chunks` random sets of k of n, plus the first k and the last k positions.
std::vector<uint32_t> random_sets(uint64_t n, uint64_t k, uint64_t chunks, std::mt19937_64& rng) {
  std::vector<uint32_t> out;
  std::vector<uint32_t> set;
  for (uint64_t c = 0; c < chunks; ++c) {
    set.clear();
    if (c == 0 || c == 1) {
      for (uint64_t i = 0; i < k; ++i) set.push_back(static_cast<uint32_t>(c == 0 ? i : n - k + i));
    } else if (k * 4 <= n) {
      while (set.size() < k) {  // rejection sampling keeps large n cheap
        const auto p = static_cast<uint32_t>(rng() % n);
        if (std::find(set.begin(), set.end(), p) == set.end()) set.push_back(p);
      }
      std::sort(set.begin(), set.end());
    } else {
      for (uint64_t p = 0; p < n; ++p) {
        // Selection sampling: exactly k of n, each set equally likely.
        if (rng() % (n - p) < k - set.size()) set.push_back(static_cast<uint32_t>(p));
      }
    }
    out.insert(out.end(), set.begin(), set.end());
  }
  return out;
}

TEST(PositionCode, SizesFollowNAndK) {
  // Independently computed: bit_length(C(n, k) - 1) (Python's math.comb).
  EXPECT_EQ(PositionCode(4096, 4).chunk_bits(), 44u);
  EXPECT_EQ(PositionCode(3072, 4).chunk_bits(), 42u);
  EXPECT_EQ(PositionCode(1856, 4).chunk_bits(), 39u);
  EXPECT_EQ(PositionCode(64, 4).chunk_bits(), 20u);
  EXPECT_EQ(PositionCode(300, 1).chunk_bits(), 9u);
  EXPECT_EQ(PositionCode(256, 1).chunk_bits(), 8u);
  EXPECT_EQ(PositionCode(257, 1).chunk_bits(), 9u);
  EXPECT_EQ(PositionCode(1, 1).chunk_bits(), 0u);
  EXPECT_EQ(PositionCode(77, 77).chunk_bits(), 0u);
  EXPECT_EQ(PositionCode(77, 76).chunk_bits(), 7u);
  EXPECT_EQ(PositionCode(uint64_t{1} << 32, 1).chunk_bits(), 32u);
  EXPECT_EQ(PositionCode(uint64_t{1} << 32, 2).chunk_bits(), 63u);
  // C(67, 33) = 14226520737620288370 < 2^64 takes all 64 bits; C(68, 34) does not fit.
  EXPECT_EQ(PositionCode(67, 33).kind(), PositionCode::Kind::kRank);
  EXPECT_EQ(PositionCode(67, 33).chunk_bits(), 64u);
  EXPECT_EQ(PositionCode(67, 33).set_count(), 14226520737620288370ull);
  EXPECT_EQ(PositionCode(4096, 4).set_count(), 11710951848960ull);
  // Elias-Fano: L minimises k L + k + ((n - 1) >> L), the smallest L on a tie.
  const PositionCode ef68(68, 34);  // L 0: 0 + 34 + 67 = 101 = L 1: 34 + 34 + 33
  EXPECT_EQ(ef68.kind(), PositionCode::Kind::kEliasFano);
  EXPECT_EQ(ef68.low_bits(), 0u);
  EXPECT_EQ(ef68.chunk_bits(), 101u);
  const PositionCode ef4096(4096, 32);  // L 6: 192 + 32 + 63 = 287 = L 7: 224 + 32 + 31
  EXPECT_EQ(ef4096.low_bits(), 6u);
  EXPECT_EQ(ef4096.chunk_bits(), 287u);
  EXPECT_EQ(ef4096.bytes(3), (3 * 287 + 7) / 8u);
  EXPECT_EQ(PositionCode(4096, 2048).kind(), PositionCode::Kind::kEliasFano);
  EXPECT_EQ(PositionCode(4096, 2048).chunk_bits(), 2048u + 4095);  // L 0 (ties L 1)
}

TEST(PositionCode, BinomialSaturates) {
  EXPECT_EQ(static_cast<uint64_t>(binomial_saturated(4096, 4)), 11710951848960ull);
  EXPECT_EQ(static_cast<uint64_t>(binomial_saturated(5, 0)), 1u);
  EXPECT_EQ(static_cast<uint64_t>(binomial_saturated(5, 6)), 0u);
  EXPECT_EQ(static_cast<uint64_t>(binomial_saturated(1000, 998)), 499500u);
  const unsigned __int128 two64 = static_cast<unsigned __int128>(1) << 64;
  EXPECT_TRUE(binomial_saturated(68, 34) == two64);
  EXPECT_TRUE(binomial_saturated(uint64_t{1} << 32, uint64_t{1} << 31) == two64);
}

// Every rank below C(n, k) decodes to a set, the sets come in colex order (so no two ranks share
// one, and all C(n, k) sets appear), and each re-encodes to its rank.
TEST(PositionCode, RanksEnumerateEverySetInColexOrder) {
  for (uint64_t n = 1; n <= 12; ++n) {
    for (uint64_t k = 1; k <= n; ++k) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k);
      const PositionCode code(n, k);
      ASSERT_EQ(code.kind(), PositionCode::Kind::kRank);
      std::vector<uint32_t> previous;
      for (uint64_t r = 0; r < code.set_count(); ++r) {
        std::string bytes;
        for (uint64_t b = 0; b < code.bytes(1); ++b)
          bytes.push_back(static_cast<char>(r >> (8 * b)));
        const std::vector<uint32_t> set = decode(code, bytes, 1, k);
        ASSERT_TRUE(std::is_sorted(set.begin(), set.end()));
        ASSERT_EQ(std::adjacent_find(set.begin(), set.end()), set.end());
        ASSERT_LT(set.back(), n);
        if (r > 0) {
          ASSERT_TRUE(std::lexicographical_compare(previous.rbegin(), previous.rend(), set.rbegin(),
                                                   set.rend()))
              << "rank " << r;
        }
        ASSERT_EQ(encode(code, set, 1), bytes);
        previous = set;
      }
    }
  }
}

TEST(PositionCode, BitsAreExact) {
  // Ranks of C(4096, 4) in 44 bits: {0, 1, 2, 3} is 0, {4092..4095} is C(4096, 4) - 1, back to
  // back.
  const PositionCode rank(4096, 4);
  const std::string two = encode(rank, {0, 1, 2, 3, 4092, 4093, 4094, 4095}, 2);
  const uint64_t last = 11710951848960ull - 1;
  std::string want(11, '\0');
  for (int b = 0; b < 64; ++b) {
    if ((last >> b) & 1) want[(44 + b) / 8] |= static_cast<char>(1 << ((44 + b) % 8));
  }
  EXPECT_EQ(hex_encode(two), hex_encode(want));
  // Elias-Fano of 68 with k 34, L 0: positions 0..32 set bits 0, 2, ..., 64; 67 sets 67 + 33.
  std::vector<uint32_t> set(34);
  std::iota(set.begin(), set.end(), 0u);
  set.back() = 67;
  EXPECT_EQ(hex_encode(encode(PositionCode(68, 34), set, 1)), "55555555555555550100000010");
}

TEST(PositionCode, RoundTripsOverManyNAndK) {
  std::mt19937_64 rng(7);
  const uint64_t ns[] = {
      1,  2,   3,   4,   5,   7,    8,    16,   33,   63,    64,    65,       67,
      68, 100, 255, 256, 257, 1856, 3072, 4000, 4096, 65536, 65537, 1u << 20, uint64_t{1} << 32};
  const uint64_t ks[] = {1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 33, 34, 100, 2048};
  for (const uint64_t n : ns) {
    std::vector<uint64_t> all_k(std::begin(ks), std::end(ks));
    all_k.insert(all_k.end(), {n - 1, n, n / 2});
    for (const uint64_t k : all_k) {
      if (k < 1 || k > n || (n > 70000 && k > 8)) continue;  // keep the test fast
      SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k);
      const uint64_t chunks = n * k > 1000000 ? 2 : 9;
      const std::vector<uint32_t> sets = random_sets(n, k, chunks, rng);
      const PositionCode code(n, k);
      const std::string bytes = encode(code, sets, chunks);
      ASSERT_EQ(decode(code, bytes, chunks, k), sets);
    }
  }
}

// A decoder of a chunk or two computes binomials instead of building a table; both give the
// same positions. (3001, 5) is used by no other test, so its table is not cached before.
TEST(PositionCode, ComputedAndTabulatedBinomialsAgree) {
  const uint64_t n = 3001, k = 5, chunks = 60;
  const PositionCode code(n, k);
  ASSERT_EQ(code.chunk_bits(), 51u);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> ranks;
  for (uint64_t c = 0; c < chunks; ++c) ranks.push_back(rng() % code.set_count());
  ranks[1] = code.set_count() - 1;
  ranks[2] = 0;
  const auto pack = [&](const std::vector<uint64_t>& rs) {
    std::string bytes((rs.size() * 51 + 7) / 8, '\0');
    for (size_t c = 0; c < rs.size(); ++c) {
      for (uint64_t b = 0; b < 51; ++b) {
        if ((rs[c] >> b) & 1) bytes[(c * 51 + b) / 8] |= static_cast<char>(1 << ((c * 51 + b) % 8));
      }
    }
    return bytes;
  };
  std::vector<std::vector<uint32_t>> alone;
  for (uint64_t c = 0; c < chunks; ++c) alone.push_back(decode(code, pack({ranks[c]}), 1, k));
  const std::vector<uint32_t> together = decode(code, pack(ranks), chunks, k);  // builds the table
  for (uint64_t c = 0; c < chunks; ++c) {
    ASSERT_EQ(alone[c],
              std::vector<uint32_t>(together.begin() + c * k, together.begin() + (c + 1) * k))
        << "chunk " << c;
    ASSERT_EQ(decode(code, pack({ranks[c]}), 1, k), alone[c]);  // now from the table
  }
  EXPECT_EQ(alone[1], (std::vector<uint32_t>{2996, 2997, 2998, 2999, 3000}));
  EXPECT_EQ(alone[2], (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

// Canonical: a decoded bit string re-encodes to itself, so no set has two encodings. Random
// strings and single-bit flips of valid ones, for both codes, a 64-bit rank and one with padding.
TEST(PositionCode, AnyAcceptedBitsReEncodeToThemselves) {
  std::mt19937_64 rng(11);
  int accepted = 0, refused = 0;
  const std::pair<uint64_t, uint64_t> cases[] = {{4096, 4}, {67, 33},   {300, 1},  {4, 2},
                                                 {68, 34},  {4000, 32}, {100, 90}, {257, 200}};
  for (const auto& [n, k] : cases) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k);
    const PositionCode code(n, k);
    const uint64_t chunks = 3;
    const std::string valid = encode(code, random_sets(n, k, chunks, rng), chunks);
    std::vector<std::string> inputs;
    for (size_t bit = 0; bit < 8 * valid.size(); ++bit) {
      std::string flipped = valid;
      flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
      inputs.push_back(flipped);
    }
    for (int i = 0; i < 200; ++i) {
      std::string noise(valid.size(), '\0');
      for (char& c : noise) c = static_cast<char>(rng());
      inputs.push_back(noise);
    }
    for (const std::string& input : inputs) {
      std::vector<uint32_t> positions(chunks * k);
      try {
        code.decode(reinterpret_cast<const uint8_t*>(input.data()), chunks, positions.data(),
                    "test");
      } catch (const Error&) {
        ++refused;
        continue;
      }
      ++accepted;
      ASSERT_EQ(hex_encode(encode(code, positions, chunks)), hex_encode(input));
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

class EliasFanoReject : public ::testing::Test {
 protected:
  // n 4000, k 32: L 6, max high part 3999 >> 6 = 62; low parts at bits 6i, the bitmap of
  // 32 + 62 bits at 192.
  const PositionCode code_{4000, 32};
  std::vector<uint32_t> set_ = [] {
    std::vector<uint32_t> s(32);
    for (uint32_t i = 0; i < 32; ++i) s[i] = 64 * i + 7;  // high part i, low part 7
    return s;
  }();
  std::string valid_ = encode(code_, set_, 1);

  static void flip(std::string& bytes, uint64_t bit) {
    bytes[bit / 8] = static_cast<char>(bytes[bit / 8] ^ (1 << (bit % 8)));
  }
  void expect_refused(const std::string& bytes, const std::string& part) const {
    std::vector<uint32_t> out(32);
    EXPECT_ERROR_WITH(code_.decode(reinterpret_cast<const uint8_t*>(bytes.data()), 1, out.data(),
                                   "payload tensor 9 [4000]"),
                      "payload tensor 9 [4000]: ", part);
  }
  uint64_t bitmap_bit(uint64_t i) const { return 192 + (set_[i] >> 6) + i; }
};

TEST_F(EliasFanoReject, EveryDeviation) {
  ASSERT_EQ(code_.low_bits(), 6u);
  ASSERT_EQ(code_.chunk_bits(), 286u);
  ASSERT_EQ(decode(code_, valid_, 1, 32), set_);
  std::string bytes = valid_;
  flip(bytes, bitmap_bit(31));  // one bit short
  expect_refused(bytes, "the Elias-Fano bitmap of chunk 0 has 31 bits set (allowed: exactly 32");
  bytes = valid_;
  flip(bytes, 192 + 32 + 61);  // the last bitmap bit: one too many
  expect_refused(bytes, "has more than 32 bits set (allowed: exactly 32");
  // Moving the last position's bitmap bit to the end: high part 62 with low part 7 is 3975, still
  // valid; low part 63 makes 4031, past the chunk.
  bytes = valid_;
  flip(bytes, bitmap_bit(31));
  flip(bytes, 192 + 32 + 62 - 1);
  EXPECT_EQ(decode(code_, bytes, 1, 32).back(), 62u * 64 + 7);
  for (uint64_t b = 0; b < 6; ++b) {
    if (!((set_[31] & 63) >> b & 1)) flip(bytes, 31 * 6 + b);
  }
  expect_refused(bytes,
                 "position 31 of chunk 0 is out of range (high part 62, low part 63; "
                 "allowed: < 4000)");
  // Two positions with the same high part: the second's low part must be larger.
  bytes = valid_;
  flip(bytes, bitmap_bit(1));             // position 1 (71: high part 1, low part 7)
  flip(bytes, 192 + (set_[0] >> 6) + 1);  // high part 0 like position 0
  expect_refused(bytes, "positions in chunk 0 are not strictly ascending (7 follows 7)");
  // Padding: 286 bits leave 2 in the last byte.
  bytes = valid_;
  flip(bytes, 287);
  expect_refused(bytes, "the padding bits after the last chunk's positions are not 0");
}

TEST(PositionCodeReject, RankOutOfRangeNamesTheBound) {
  const PositionCode code(4096, 4);
  std::string bytes(11, '\0');
  bytes[5] = 0x0b;  // chunk 0 = 0xb << 40, above C(4096, 4) - 1
  std::vector<uint32_t> out(8);
  EXPECT_ERROR_WITH(
      code.decode(reinterpret_cast<const uint8_t*>(bytes.data()), 2, out.data(), "here"),
      "here: the position rank of chunk 0 is 12094627905536 (allowed: < C(4096, 4) = "
      "11710951848960)");
}

}  // namespace
}  // namespace agora
