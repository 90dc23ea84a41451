// SentencePiece training and the tokenizer over the bridge module.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/sentencepiece_tokenizer.h"
#include "agora/data/sentencepiece_trainer.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("agora_spm_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    std::ofstream text(*dir_ / "text.txt");
    // Enough varied text for a 400-piece vocabulary.
    for (int i = 0; i < 300; ++i) {
      text << "The quick brown fox " << i << " jumps over the lazy dog number " << (i * 7) % 13
           << ".\nA journey of a thousand miles begins with a single step, said the sage.\n"
           << "Über café naïve résumé — 東京 and Москва are cities.\n";
    }
    text.close();
    SentencePieceTrainOptions options;
    options.inputs = {*dir_ / "text.txt"};
    options.vocab_size = 400;
    options.threads = 1;
    train_sentencepiece(options, *dir_ / "m.model");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path model_path() { return *dir_ / "m.model"; }
  static fs::path* dir_;
};
fs::path* SentencePieceTest::dir_ = nullptr;

TEST_F(SentencePieceTest, LoadsTrainedModel) {
  const auto tokenizer = SentencePieceTokenizer::load(model_path());
  EXPECT_EQ(tokenizer->vocab_size(), 400u);
  EXPECT_EQ(tokenizer->eot_id(), 2u);  // </s>, as the trainer promises
  EXPECT_EQ(tokenizer->name(), "m.model");
}

TEST_F(SentencePieceTest, RoundTripsText) {
  const auto tokenizer = SentencePieceTokenizer::load(model_path());
  for (const std::string text :
       {"The quick brown fox", "Hello, world!\nSecond line\n\n  indented\ttab",
        "Emoji 🎉 and unseen script ᚠᚢᚦ fall back to bytes", "123456 7.5e-3"}) {
    const auto ids = tokenizer->encode(text);
    ASSERT_FALSE(ids.empty());
    for (const TokenId id : ids) EXPECT_LT(id, tokenizer->vocab_size());
    EXPECT_EQ(tokenizer->decode(ids), text);
  }
}

TEST_F(SentencePieceTest, EncodesAppendingToOutput) {
  const auto tokenizer = SentencePieceTokenizer::load(model_path());
  std::vector<TokenId> out{tokenizer->eot_id()};
  tokenizer->encode("the dog", out);
  EXPECT_EQ(out.front(), tokenizer->eot_id());
  EXPECT_EQ(std::vector<TokenId>(out.begin() + 1, out.end()), tokenizer->encode("the dog"));
}

TEST_F(SentencePieceTest, InvalidUtf8BecomesReplacementCharacter) {
  const auto tokenizer = SentencePieceTokenizer::load(model_path());
  const std::string bad = "ab\xff\xc3(cd";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(bad)), "ab\xEF\xBF\xBD\xEF\xBF\xBD(cd");
}

TEST_F(SentencePieceTest, DecodeRejectsOutOfRangeIds) {
  const auto tokenizer = SentencePieceTokenizer::load(model_path());
  const std::vector<TokenId> ids = {5, 400};
  try {
    tokenizer->decode(ids);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 400 is out of range (vocabulary size 400)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SentencePieceTest, TrainingIsDeterministic) {
  SentencePieceTrainOptions options;
  options.inputs = {*dir_ / "text.txt"};
  options.vocab_size = 400;
  options.threads = 1;
  train_sentencepiece(options, *dir_ / "again.model");
  EXPECT_EQ(read_file(*dir_ / "again.model"), read_file(model_path()));
}

// Digits split one by one and two signs leave BPE almost nothing to merge: training stops short
// of the asked size (it used to crash on SentencePiece's warning) and says how many pieces it made.
TEST_F(SentencePieceTest, ASmallAlphabetGivesASmallerVocabulary) {
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    text += fmt::format("{}+{}={}\n", i * 7 % 1000, i % 89, i * 7 % 1000 + i % 89);
  }
  write_file_atomic(*dir_ / "sums.txt", text);
  SentencePieceTrainOptions options;
  options.inputs = {*dir_ / "sums.txt"};
  options.vocab_size = 400;
  options.threads = 1;
  const auto summary = train_sentencepiece(options, *dir_ / "sums.model");
  EXPECT_LT(summary.pieces, 300u);
  EXPECT_GE(summary.pieces, 256u + 3 + 12);  // bytes, specials, digits and + = and the space mark
  const auto tokenizer = SentencePieceTokenizer::load(*dir_ / "sums.model");
  EXPECT_EQ(tokenizer->vocab_size(), summary.pieces);
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("372+49=421")), "372+49=421");
}

TEST_F(SentencePieceTest, RejectsBadFilesAndOptions) {
  EXPECT_THROW(SentencePieceTokenizer::load(*dir_ / "missing.model"), Error);
  write_file_atomic(*dir_ / "garbage.model", "this is not a protobuf");
  try {
    SentencePieceTokenizer::load(*dir_ / "garbage.model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a SentencePiece model"), std::string::npos);
  }
  SentencePieceTrainOptions options;
  options.inputs = {*dir_ / "text.txt"};
  options.vocab_size = 10;
  EXPECT_THROW(train_sentencepiece(options, *dir_ / "x.model"), Error);
  options.vocab_size = 400;
  options.inputs = {*dir_ / "nope.txt"};
  EXPECT_THROW(train_sentencepiece(options, *dir_ / "x.model"), Error);
  EXPECT_FALSE(fs::exists(*dir_ / "x.model"));
}

}  // namespace
}  // namespace agora
