// core/hex.h: encoding, strict decoding with errors that name the input, and the log forms.
#include "agora/core/hex.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>

#include "test_support.h"

namespace agora {
namespace {

std::string all_bytes() {
  std::string out;
  for (int b = 0; b < 256; ++b) out.push_back(static_cast<char>(b));
  return out;
}

TEST(HexTest, EncodesTwoLowerCaseDigitsPerByte) {
  EXPECT_EQ(hex_encode(std::string_view("")), "");
  EXPECT_EQ(hex_encode(std::string("\x00\x01\xab\xff", 4)), "0001abff");
  const std::array<uint8_t, 3> digest = {0xde, 0xad, 0x0f};
  EXPECT_EQ(hex_encode(digest), "dead0f");
}

TEST(HexTest, EveryByteRoundTrips) {
  const std::string bytes = all_bytes();
  const std::string text = hex_encode(bytes);
  EXPECT_EQ(text.size(), 512u);
  EXPECT_EQ(text.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(hex_decode(text), bytes);
  EXPECT_EQ(hex_decode(text, 256, "all bytes"), bytes);
}

TEST(HexTest, DecodesUpperCaseToo) {
  EXPECT_EQ(hex_decode("ABcd"), "\xab\xcd");
}

TEST(HexTest, RejectsBadInputNamingIt) {
  EXPECT_ERROR_WITH(hex_decode("abc", "the seed"), "the seed", "odd number", "'abc'");
  EXPECT_ERROR_WITH(hex_decode("zz", "the seed"), "the seed is not hexadecimal: 'zz'");
  EXPECT_ERROR_WITH(hex_decode("0x12"), "not hexadecimal", "'0x12'");
  EXPECT_ERROR_WITH(hex_decode("ab cd"), "'ab cd'");
  EXPECT_ERROR_WITH(hex_decode("abcd", 3, "key file k.json: public key"),
                    "key file k.json: public key has 4 characters; expected 6 hexadecimal");
}

TEST(HexTest, LogFormsNeverPrintNothing) {
  EXPECT_EQ(hex_for_log(""), "<empty>");
  EXPECT_EQ(hex_for_log("\x01\x02\x03\x04\x05"), "0102030405");
  EXPECT_EQ(short_hex(""), "<empty>");
  EXPECT_EQ(short_hex("\x01\x02"), "0102");
  EXPECT_EQ(short_hex(all_bytes()), "00010203");
}

}  // namespace
}  // namespace agora
