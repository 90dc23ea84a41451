// utf8.h: validation and U+FFFD repair, against the Unicode Standard's examples, Python's
// bytes.decode("utf-8", "replace"), and a brute-force reference built from the encoder side.
#include "agora/data/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace agora {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, ValidTextIsValidAndUnchanged) {
  for (const std::string& text : std::vector<std::string>{
           std::string(), std::string("plain ASCII, long enough to take the 8-byte path....."),
           std::string("\0nul inside", 11), std::string("Ünïcödé \u4e2d\u6587 \U0001F600 \u200D"),
           std::string("\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF"),
           std::string("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF")}) {
    EXPECT_TRUE(is_valid_utf8(text)) << text;
    EXPECT_EQ(repair_utf8(text), text);
  }
}

TEST(Utf8, RejectsEveryKindOfIllFormedSequence) {
  for (const std::string& text : std::vector<std::string>{
           "\x80", "\xBF", "\xC0\xAF", "\xC1\xBF",  // lone continuation, overlong 2-byte
           "\xC2", "\xE0\xA0", "\xF0\x90\x80",      // truncated
           "\xE0\x9F\xBF",                          // overlong 3-byte
           "\xED\xA0\x80", "\xED\xBF\xBF",          // surrogates
           "\xF0\x8F\xBF\xBF",                      // overlong 4-byte
           "\xF4\x90\x80\x80", "\xF5\x80\x80\x80",  // above U+10FFFF
           "\xFE", "\xFF", "abcdefgh\xC3(",         // not UTF-8 at all; bad after ASCII block
       }) {
    EXPECT_FALSE(is_valid_utf8(text)) << testing::PrintToString(text);
    EXPECT_TRUE(is_valid_utf8(repair_utf8(text)));
  }
}

// Expected strings from Python 3: bytes.decode("utf-8", errors="replace").
TEST(Utf8, RepairMatchesPython) {
  struct Case {
    std::string in, out;
  };
  const std::string r = kFffd;
  const std::vector<Case> cases = {
      {"\xC3(", r + "("},
      {"\xF0\x9F\x98 ", r + " "},
      {"\xED\xA0\x80z", r + r + r + "z"},
      {"\xE0\x80\x80", r + r + r},
      {"\xF4\x90\x80\x80", r + r + r + r},
      {"\xF0\x90\x80", r},
      {"\xC0\xAF", r + r},
      {"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", r + r + r + r + "A"},
      {"\xF8\x88\x80\x80\x80", r + r + r + r + r},
      // The Unicode Standard, table 3-8.
      {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64",
       "a" + r + r + r + "b" + r + "c" + r + r + "d"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(repair_utf8(c.in), c.out) << testing::PrintToString(c.in);
  }
}

// An independent definition of the best practice: at each position take the longest prefix of
// the rest that could still begin a well-formed sequence; a complete one is kept, anything else
// becomes one U+FFFD (at least one byte). Which prefixes can begin a well-formed sequence is
// found by encoding every scalar value, not from the decoder's table.
class Reference {
 public:
  Reference() : prefix2_(1 << 16), prefix3_(1 << 24) {
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const std::string e = encode(cp);
      lead_[static_cast<uint8_t>(e[0])] = true;
      if (e.size() >= 2) prefix2_[key(e, 2)] = true;
      if (e.size() >= 3) prefix3_[key(e, 3)] = true;
      complete_len_[static_cast<uint8_t>(e[0])] = static_cast<int>(e.size());
    }
  }

  std::string repair(const std::string& in) const {
    std::string out;
    size_t i = 0;
    while (i < in.size()) {
      size_t len = 0;
      for (size_t k = 1; k <= 4 && i + k <= in.size() && is_prefix(in.substr(i, k)); ++k) len = k;
      const int complete = len > 0 ? complete_len_[static_cast<uint8_t>(in[i])] : 0;
      if (len > 0 && static_cast<int>(len) >= complete) {
        out += in.substr(i, complete);
        i += complete;
      } else {
        out += kFffd;
        i += std::max<size_t>(len, 1);
      }
    }
    return out;
  }

 private:
  static std::string encode(uint32_t cp) {
    std::string s;
    append_utf8(s, cp);
    return s;
  }
  static uint32_t key(const std::string& s, size_t n) {
    uint32_t k = 0;
    for (size_t i = 0; i < n; ++i) k = (k << 8) | static_cast<uint8_t>(s[i]);
    return k;
  }
  bool is_prefix(const std::string& p) const {
    switch (p.size()) {
      case 1:
        return lead_[static_cast<uint8_t>(p[0])];
      case 2:
        return prefix2_[key(p, 2)];
      case 3:
        return prefix3_[key(p, 3)];
      default:  // the fourth byte of a sequence is any continuation byte
        return prefix3_[key(p, 3)] && complete_len_[static_cast<uint8_t>(p[0])] == 4 &&
               (static_cast<uint8_t>(p[3]) & 0xC0) == 0x80;
    }
  }

  bool lead_[256] = {};
  int complete_len_[256] = {};
  std::vector<bool> prefix2_, prefix3_;
};

TEST(Utf8, RepairAgreesWithBruteForceReferenceOnRandomBytes) {
  const Reference reference;
  std::mt19937 rng(20240520);
  // Bytes biased towards the interesting ones: leads, continuations, edges of the ranges.
  const std::vector<uint8_t> alphabet = {'a',  ' ',  0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF,
                                         0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE,
                                         0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFE, 0xFF};
  for (int round = 0; round < 20000; ++round) {
    std::string in(rng() % 24, '\0');
    for (char& c : in) {
      c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : alphabet[rng() % alphabet.size()]);
    }
    const std::string expected = reference.repair(in);
    ASSERT_EQ(repair_utf8(in), expected) << testing::PrintToString(in);
    ASSERT_EQ(is_valid_utf8(in), expected == in) << testing::PrintToString(in);
  }
}

TEST(Utf8, LargeInputsStayLinear) {
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "ok \xC3\xA9\xFF";
  const std::string repaired = repair_utf8(text);
  EXPECT_TRUE(is_valid_utf8(repaired));
  EXPECT_EQ(repaired.size(), text.size() + 2 * 200000);
}

}  // namespace
}  // namespace agora

namespace agora {
namespace {

TEST(Utf8, AppendEncodesEachLength) {
  std::string s;
  for (const char32_t cp : {U'\x24', U'\xA2', U'\x20AC', U'\x10348'}) append_utf8(s, cp);
  EXPECT_EQ(s, "\x24\xC2\xA2\xE2\x82\xAC\xF0\x90\x8D\x88");
  EXPECT_TRUE(is_valid_utf8(s));
}

}  // namespace
}  // namespace agora
