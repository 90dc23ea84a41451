// agora tokenize's engine: documents -> train/val token shards.
#include "agora/data/corpus_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/shard.h"
#include "compress_for_test.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

std::vector<TokenId> read_split(const fs::path& dir, const std::string& prefix) {
  std::vector<TokenId> all;
  for (int i = 0;; ++i) {
    const fs::path file = dir / fmt::format("{}_{:06}.bin", prefix, i);
    if (!fs::exists(file)) break;
    const auto shard = ShardReader::open(file);
    const size_t start = all.size();
    all.resize(start + shard.num_tokens());
    shard.copy(0, shard.num_tokens(), all.data() + start);
  }
  return all;
}

class CorpusTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("agora_corpus_test_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "docs" / "sub");
    for (int i = 0; i < 40; ++i) {
      std::string text;
      for (int j = 0; j <= i % 7; ++j) {
        text += fmt::format("Document {} paragraph {}: the quick brown fox, naïve café 🎉.\n", i, j);
      }
      write_file_atomic(root_ / "docs" / (i % 3 ? "" : "sub") / fmt::format("d{:02}.txt", i), text);
    }
    write_file_atomic(root_ / "docs" / ".hidden", "never read");
    tokenizer_ = load_tokenizer("gpt2");
  }
  void TearDown() override { fs::remove_all(root_); }

  CorpusTokenizeOptions options(const std::string& out) const {
    CorpusTokenizeOptions o;
    o.inputs = {root_ / "docs"};
    o.out_dir = root_ / out;
    o.tokenizer_spec = "gpt2";
    o.val_fraction = 0.2;
    o.shard_tokens = 1024;
    o.progress = false;
    return o;
  }

  fs::path root_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(CorpusTokenizerTest, WritesEveryDocumentOnceInOrderPrecededByEndOfText) {
  const auto summary = tokenize_corpus(*tokenizer_, options("out"));
  const auto documents = list_documents({root_ / "docs"});
  ASSERT_EQ(documents.size(), 40u);  // the hidden file is skipped
  EXPECT_TRUE(std::is_sorted(documents.begin(), documents.end()));

  std::vector<TokenId> expected_train, expected_val;
  for (const auto& doc : documents) {
    const std::string text = read_file(doc);
    auto& split = is_validation_document(text, 0.2) ? expected_val : expected_train;
    split.push_back(tokenizer_->eot_id());
    tokenizer_->encode(text, split);
  }
  ASSERT_FALSE(expected_val.empty());
  EXPECT_EQ(read_split(root_ / "out", "train"), expected_train);
  EXPECT_EQ(read_split(root_ / "out", "val"), expected_val);
  EXPECT_EQ(summary.train.tokens, expected_train.size());
  EXPECT_EQ(summary.val.tokens, expected_val.size());
  EXPECT_EQ(summary.train.documents + summary.val.documents, 40u);
}

TEST_F(CorpusTokenizerTest, WithLineDocumentsEachNonEmptyLineIsADocument) {
  auto lines = options("lines");
  lines.line_documents = true;
  const auto summary = tokenize_corpus(*tokenizer_, lines);

  std::vector<TokenId> expected_train, expected_val;
  uint64_t count = 0;
  for (const auto& doc : list_documents({root_ / "docs"})) {
    const std::string text = read_file(doc) + "\n\n";  // empty lines are no documents
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      if (end == begin) continue;
      const std::string line = text.substr(begin, end - begin);
      auto& split = is_validation_document(line, 0.2) ? expected_val : expected_train;
      split.push_back(tokenizer_->eot_id());
      tokenizer_->encode(line, split);
      ++count;
    }
  }
  EXPECT_EQ(count, 155u);  // file i has i % 7 + 1 lines: 155 over the 40 files
  ASSERT_FALSE(expected_val.empty());
  EXPECT_EQ(read_split(root_ / "lines", "train"), expected_train);
  EXPECT_EQ(read_split(root_ / "lines", "val"), expected_val);
  EXPECT_EQ(summary.train.documents + summary.val.documents, count);
}

TEST_F(CorpusTokenizerTest, ShardsAreFullExceptTheLast) {
  const auto summary = tokenize_corpus(*tokenizer_, options("out"));
  ASSERT_GE(summary.train.shards.size(), 2u);
  for (size_t i = 0; i < summary.train.shards.size(); ++i) {
    const auto shard = ShardReader::open(root_ / "out" / summary.train.shards[i]);
    EXPECT_EQ(shard.version(), 1);  // GPT-2 ids fit in uint16
    if (i + 1 < summary.train.shards.size())
      EXPECT_EQ(shard.num_tokens(), 1024u);
    else
      EXPECT_LE(shard.num_tokens(), 1024u);
  }
}

TEST_F(CorpusTokenizerTest, SameBytesWhateverTheThreadCount) {
  auto one = options("one");
  one.threads = 1;
  auto four = options("four");
  four.threads = 4;
  tokenize_corpus(*tokenizer_, one);
  tokenize_corpus(*tokenizer_, four);
  for (const auto& entry : fs::directory_iterator(root_ / "one")) {
    EXPECT_EQ(read_file(entry.path()), read_file(root_ / "four" / entry.path().filename()))
        << entry.path();
  }
}

TEST_F(CorpusTokenizerTest, WritesMetadata) {
  tokenize_corpus(*tokenizer_, options("out"));
  const auto meta = nlohmann::json::parse(read_file(root_ / "out" / "meta.json"));
  EXPECT_EQ(meta["tokenizer"], "gpt2");
  EXPECT_EQ(meta["vocab_size"], 50257);
  EXPECT_EQ(meta["eot_id"], 50256);
  EXPECT_EQ(meta["shard_version"], 1);
  EXPECT_EQ(meta["train"]["documents"].get<int>() + meta["val"]["documents"].get<int>(), 40);
}

TEST_F(CorpusTokenizerTest, RefusesToOverwriteWithoutForce) {
  tokenize_corpus(*tokenizer_, options("out"));
  write_file_atomic(root_ / "out" / "stale.bin", "old");
  try {
    tokenize_corpus(*tokenizer_, options("out"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists; pass --force"), std::string::npos);
  }
  auto forced = options("out");
  forced.force = true;
  tokenize_corpus(*tokenizer_, forced);
  EXPECT_FALSE(fs::exists(root_ / "out" / "stale.bin"));  // replaced whole
  EXPECT_FALSE(fs::exists(root_ / "out.tmp"));
}

TEST_F(CorpusTokenizerTest, BothSplitsGetADocumentWhenTheFractionIsTiny) {
  auto tiny = options("out");
  tiny.val_fraction = 1e-9;
  const auto summary = tokenize_corpus(*tokenizer_, tiny);
  EXPECT_EQ(summary.val.documents, 1u);
  EXPECT_EQ(summary.train.documents, 39u);
  auto almost_all = options("almost_all");
  almost_all.val_fraction = 1 - 1e-12;
  const auto most = tokenize_corpus(*tokenizer_, almost_all);
  EXPECT_EQ(most.train.documents, 1u);
  EXPECT_EQ(most.val.documents, 39u);
  auto none = options("none");
  none.val_fraction = 0;
  EXPECT_EQ(tokenize_corpus(*tokenizer_, none).val.documents, 0u);
  EXPECT_FALSE(fs::exists(root_ / "none" / "val_000000.bin"));
}

TEST_F(CorpusTokenizerTest, RejectsBadOptions) {
  auto bad = options("out");
  bad.val_fraction = 1.5;
  EXPECT_THROW(tokenize_corpus(*tokenizer_, bad), Error);
  bad = options("out");
  bad.shard_tokens = 10;
  EXPECT_THROW(tokenize_corpus(*tokenizer_, bad), Error);
  bad = options("out");
  bad.inputs = {root_ / "missing"};
  EXPECT_THROW(tokenize_corpus(*tokenizer_, bad), Error);
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

// The fixture's 40 documents as JSON Lines, in list_documents order, with `field` as the key.
std::string as_json_lines(const std::vector<fs::path>& documents, const std::string& field) {
  std::string out;
  for (const auto& doc : documents) {
    out += nlohmann::json{{"id", doc.filename().string()}, {field, read_file(doc)}}.dump() + "\n";
  }
  return out;
}

std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename() != "meta.json") {
      files[entry.path().filename().string()] = read_file(entry.path());
    }
  }
  return files;
}

TEST_F(CorpusTokenizerTest, JsonLinesGiveTheSameShardsAsTheSameTextsAsFiles) {
  tokenize_corpus(*tokenizer_, options("files"));
  const std::string jsonl = as_json_lines(list_documents({root_ / "docs"}), "text");
  fs::create_directories(root_ / "jsonl");
  write_file_atomic(root_ / "jsonl" / "corpus.jsonl", jsonl);
  write_file_atomic(root_ / "jsonl" / "corpus.jsonl.gz", testing_compress::gzip(jsonl));
  write_file_atomic(root_ / "jsonl" / "corpus.jsonl.zst", testing_compress::zstd(jsonl));
  const auto expected = folder_bytes(root_ / "files");
  ASSERT_GE(expected.size(), 3u);
  for (const char* name : {"corpus.jsonl", "corpus.jsonl.gz", "corpus.jsonl.zst"}) {
    auto o = options(std::string("out-") + name);
    o.inputs = {root_ / "jsonl" / name};
    const auto summary = tokenize_corpus(*tokenizer_, o);
    EXPECT_EQ(summary.json_lines_documents, 40u) << name;
    EXPECT_EQ(summary.skipped.total(), 0u) << name;
    EXPECT_EQ(folder_bytes(root_ / (std::string("out-") + name)), expected) << name;
    const auto meta = nlohmann::json::parse(read_file(o.out_dir / "meta.json"));
    EXPECT_EQ(meta["json_lines"]["field"], "text");
    EXPECT_EQ(meta["json_lines"]["documents"], 40);
  }
}

TEST_F(CorpusTokenizerTest, JsonLinesReadTheFieldTheyAreTold) {
  fs::create_directories(root_ / "jsonl");
  write_file_atomic(root_ / "jsonl" / "c.ndjson",
                    as_json_lines(list_documents({root_ / "docs"}), "content"));
  auto o = options("content");
  o.inputs = {root_ / "jsonl"};
  o.field = "content";
  tokenize_corpus(*tokenizer_, o);
  tokenize_corpus(*tokenizer_, options("files"));
  EXPECT_EQ(folder_bytes(root_ / "content"), folder_bytes(root_ / "files"));
  // Told the default, every line lacks it: no documents, and the error says why.
  o.field = "text";
  o.out_dir = root_ / "text";
  try {
    tokenize_corpus(*tokenizer_, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no \"text\" field"), std::string::npos) << e.what();
  }
}

TEST_F(CorpusTokenizerTest, JsonLinesWithoutADocumentAreCountedByReason) {
  fs::create_directories(root_ / "jsonl");
  const std::string lines =
      "{\"text\": \"one\"}\n"
      "not json\n"
      "[1, 2]\n"
      "{\"other\": \"x\"}\n"
      "{\"text\": 7}\n"
      "{\"text\": \"\"}\n"
      "   \n"
      "{\"text\": \"two\"}\n"
      "{\"text\": \"unterminated\n"
      "{\"text\": \"three\"}";  // no final newline: still a line
  write_file_atomic(root_ / "jsonl" / "mixed.jsonl", lines);
  auto o = options("mixed");
  o.inputs = {root_ / "jsonl" / "mixed.jsonl"};
  const auto summary = tokenize_corpus(*tokenizer_, o);
  EXPECT_EQ(summary.train.documents + summary.val.documents, 3u);
  const SkippedLines& skipped = summary.skipped;
  EXPECT_EQ(skipped.not_json, 2u);
  EXPECT_EQ(skipped.not_object, 1u);
  EXPECT_EQ(skipped.no_field, 1u);
  EXPECT_EQ(skipped.not_string, 1u);
  EXPECT_EQ(skipped.empty, 1u);
  EXPECT_EQ(skipped.blank, 1u);
  EXPECT_EQ(skipped.total(), 7u);
  ASSERT_EQ(skipped.examples.size(), SkippedLines::kExamples);
  EXPECT_EQ(skipped.examples[0], (root_ / "jsonl" / "mixed.jsonl").string() + ":2: not JSON");
  EXPECT_EQ(skipped.examples[3],
            (root_ / "jsonl" / "mixed.jsonl").string() + ":5: \"text\" is not a string");
  const auto meta = nlohmann::json::parse(read_file(o.out_dir / "meta.json"));
  EXPECT_EQ(meta["json_lines"]["skipped_lines"]["not_json"], 2);
  EXPECT_EQ(meta["json_lines"]["skipped_lines"]["blank"], 1);
}

TEST_F(CorpusTokenizerTest, ADamagedCompressedInputLeavesNoFolder) {
  fs::create_directories(root_ / "jsonl");
  const std::string gz =
      testing_compress::gzip(as_json_lines(list_documents({root_ / "docs"}), "text"));
  write_file_atomic(root_ / "jsonl" / "cut.jsonl.gz", gz.substr(0, gz.size() - 20));
  auto o = options("cut");
  o.inputs = {root_ / "jsonl" / "cut.jsonl.gz"};
  try {
    tokenize_corpus(*tokenizer_, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jsonl.gz"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ / "cut"));
  EXPECT_FALSE(fs::exists(root_ / "cut.tmp"));
}

TEST_F(CorpusTokenizerTest, CompressedTextFilesAreDocumentsToo) {
  fs::create_directories(root_ / "gz");
  for (const auto& doc : list_documents({root_ / "docs"})) {
    write_file_atomic(root_ / "gz" / (doc.filename().string() + ".zst"),
                      testing_compress::zstd(read_file(doc)));
  }
  // Sorted by name the same way (the fixture's names differ only before the suffix), except
  // that the "sub" folder's files now sit beside the others: compare with one list of files.
  auto files = options("files");
  files.inputs.clear();
  for (const auto& doc : list_documents({root_ / "docs"})) files.inputs.push_back(doc);
  std::sort(files.inputs.begin(), files.inputs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  tokenize_corpus(*tokenizer_, files);
  auto zst = options("zst");
  zst.inputs = {root_ / "gz"};
  tokenize_corpus(*tokenizer_, zst);
  EXPECT_EQ(folder_bytes(root_ / "zst"), folder_bytes(root_ / "files"));
}

TEST(ValidationSplit, FollowsTheFractionAndDependsOnContentOnly) {
  int val = 0;
  for (int i = 0; i < 10000; ++i) val += is_validation_document(fmt::format("doc {}", i), 0.1);
  EXPECT_GT(val, 850);  // binomial(10000, 0.1): mean 1000, sd 30
  EXPECT_LT(val, 1150);
  EXPECT_EQ(is_validation_document("same text", 0.5), is_validation_document("same text", 0.5));
  EXPECT_FALSE(is_validation_document("anything", 0.0));
}

}  // namespace
}  // namespace agora
