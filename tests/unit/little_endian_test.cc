// core/little_endian.h: the byte order on disk and on the wire, on any host.
#include "agora/core/little_endian.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

namespace agora {
namespace {

TEST(LittleEndianTest, LeastSignificantByteFirst) {
  uint8_t bytes[8];
  store_le32(0x01020304u, bytes);
  EXPECT_EQ(bytes[0], 0x04);
  EXPECT_EQ(bytes[3], 0x01);
  store_le64(0x0102030405060708ull, bytes);
  EXPECT_EQ(bytes[0], 0x08);
  EXPECT_EQ(bytes[7], 0x01);
  store_le16(0xabcd, bytes);
  EXPECT_EQ(bytes[0], 0xcd);
  EXPECT_EQ(bytes[1], 0xab);
  // The llm.c shard magic 20240520 as it stands in a shard's first four bytes.
  const uint8_t magic[4] = {0x88, 0xd8, 0x34, 0x01};
  EXPECT_EQ(load_le32(magic), 20240520u);
}

TEST(LittleEndianTest, RoundTrips) {
  std::mt19937_64 random(7);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = random();
    uint8_t bytes[9] = {};
    store_le16(static_cast<uint16_t>(v), bytes + 1);  // misaligned on purpose
    EXPECT_EQ(load_le16(bytes + 1), static_cast<uint16_t>(v));
    store_le32(static_cast<uint32_t>(v), bytes + 1);
    EXPECT_EQ(load_le32(bytes + 1), static_cast<uint32_t>(v));
    store_le64(v, bytes + 1);
    EXPECT_EQ(load_le64(bytes + 1), v);
    EXPECT_EQ(load_le(bytes + 1, 8), v);
    EXPECT_EQ(load_le(bytes + 1, 3), v & 0xffffff);
  }
  EXPECT_EQ(load_le(nullptr, 0), 0u);
}

TEST(LittleEndianTest, AppendMatchesStore) {
  std::string out;
  append_le(out, 0x0102, 2);
  append_le(out, std::numeric_limits<uint64_t>::max(), 8);
  append_le(out, 0x0a0b0c, 3);
  ASSERT_EQ(out.size(), 13u);
  const auto* p = reinterpret_cast<const uint8_t*>(out.data());
  EXPECT_EQ(load_le16(p), 0x0102);
  EXPECT_EQ(load_le64(p + 2), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(load_le(p + 10, 3), 0x0a0b0cu);
}

}  // namespace
}  // namespace agora
