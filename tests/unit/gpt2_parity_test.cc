// Gpt2Tokenizer against tiktoken itself, token for token: every document of the bundled corpus
// and several hundred KB of generated multilingual stress text are encoded by both, tiktoken
// through node (tests/parity/tiktoken_encode.mjs), and the ids must be identical.
//
// Needs node and deps/node_modules/tiktoken; without them the test fails (never skips), since
// parity is the tokenizer's main promise.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "agora/core/file.h"
#include "agora/data/gpt2_tokenizer.h"
#include "agora/data/utf8.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

// Seeded generator of valid UTF-8 that exercises every branch of the pre-tokenizer and long BPE
// merges. Code points are limited to those assigned in Unicode 13 or earlier: PCRE2's tables
// and the Rust regex crate's (inside tiktoken) are different Unicode versions, and a letter
// added later may be \p{L} on one side and unassigned on the other. Such a difference would be
// a table-version artefact, not a tokenizer bug.
class StressText {
 public:
  explicit StressText(uint32_t seed) : rng_(seed) {}

  std::string make(size_t bytes) {
    std::string s;
    while (s.size() < bytes) segment(s);
    return s;
  }

 private:
  struct Range {
    uint32_t lo, hi;
  };

  uint32_t pick(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }
  uint32_t in(const std::vector<Range>& ranges) {
    const Range& r = ranges[pick(static_cast<uint32_t>(ranges.size()))];
    return r.lo + pick(r.hi - r.lo + 1);
  }
  void run(std::string& s, const std::vector<Range>& ranges, uint32_t max_len) {
    for (uint32_t n = 1 + pick(max_len); n > 0; --n) append_utf8(s, in(ranges));
  }

  void segment(std::string& s) {
    // Letters of many scripts (all assigned by Unicode 13).
    static const std::vector<std::vector<Range>> kScripts = {
        {{'a', 'z'}, {'A', 'Z'}},
        {{'a', 'z'}, {0xE0, 0xF6}, {0xF8, 0xFF}, {0xC0, 0xD6}, {0x100, 0x17F}},  // diacritics
        {{0x410, 0x44F}, {0x401, 0x401}, {0x451, 0x451}},                        // Cyrillic
        {{0x391, 0x3A1}, {0x3A3, 0x3A9}, {0x3B1, 0x3C9}, {0x3AC, 0x3AF}},        // Greek
        {{0x621, 0x63A}, {0x641, 0x64A}},                                        // Arabic
        {{0x5D0, 0x5EA}},                                                        // Hebrew
        {{0x905, 0x939}, {0x93E, 0x94D}},  // Devanagari, with its (non-letter) vowel signs
        {{0xE01, 0xE2E}, {0xE31, 0xE31}, {0xE34, 0xE3A}},  // Thai, with combining vowels
        {{0x4E00, 0x9FA5}},                                // CJK
        {{0x3041, 0x3096}, {0x30A1, 0x30FA}},              // kana
        {{0xAC00, 0xD7A3}},                                // Hangul
    };
    static const std::vector<Range> kMarks = {{0x300, 0x36F}};
    static const std::vector<Range> kDigits = {
        {'0', '9'},     {0x660, 0x669},   {0x966, 0x96F},
        {0xE50, 0xE59}, {0xFF10, 0xFF19}, {0x2160, 0x216B},  // Roman numerals (Nl)
        {0xB2, 0xB3},   {0xBC, 0xBE},                        // superscripts and fractions (No)
    };
    // Every White_Space code point, plus look-alikes that are not White_Space.
    static const std::vector<uint32_t> kSpaces = {
        0x9,    0xA,    0xB,    0xC,    0xD,    0x20,   0x85,   0xA0,   0x1680,
        0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
        0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
    static const std::vector<uint32_t> kNotSpaces = {0x180E, 0x200B, 0x200C, 0x2060, 0xFEFF};
    static const std::vector<Range> kPunct = {
        {'!', '/'},       {':', '@'},       {'[', '`'},       {'{', '~'},       {0xA1, 0xA1},
        {0xAB, 0xAB},     {0xBB, 0xBB},     {0xBF, 0xBF},     {0x2013, 0x2014}, {0x2018, 0x201D},
        {0x2026, 0x2026}, {0x3001, 0x3002}, {0x300C, 0x300D},
    };
    static const std::vector<Range> kEmoji = {
        {0x1F600, 0x1F64F}, {0x1F300, 0x1F5FF}, {0x2600, 0x26FF}, {0x1F680, 0x1F6C5}};
    static const std::vector<std::string> kContractions = {"'s", "'t", "'re", "'ve", "'m", "'ll",
                                                           "'d", "'S", "'LL", "'",   "''", "'x"};

    switch (pick(14)) {
      case 0:
      case 1:
      case 2:
        if (pick(3) != 0) s += ' ';
        run(s, kScripts[pick(static_cast<uint32_t>(kScripts.size()))], 12);
        break;
      case 3:  // a word with combining marks
        run(s, kScripts[1], 5);
        run(s, kMarks, 3);
        run(s, kScripts[pick(2)], 4);
        break;
      case 4:
        if (pick(2) != 0) s += ' ';
        run(s, kDigits, 8);
        break;
      case 5:  // a run of one White_Space character, or a mix
        for (uint32_t n = 1 + pick(6); n > 0; --n) {
          append_utf8(s, kSpaces[pick(static_cast<uint32_t>(kSpaces.size()))]);
        }
        break;
      case 6:
        s += std::string(1 + pick(40), " \t\n"[pick(3)]);
        break;
      case 7:
        s += pick(2) != 0 ? "\r\n" : "\n\n";
        break;
      case 8:  // contractions, after a word or alone
        run(s, kScripts[pick(2)], 6);
        s += kContractions[pick(static_cast<uint32_t>(kContractions.size()))];
        break;
      case 9:
        if (pick(2) != 0) s += ' ';
        run(s, kPunct, 6);
        break;
      case 10:
        append_utf8(s, kNotSpaces[pick(static_cast<uint32_t>(kNotSpaces.size()))]);
        break;
      case 11: {  // emoji: plain, with a skin tone, a ZWJ family, a heart with VS16
        const uint32_t kind = pick(4);
        if (kind == 0) run(s, kEmoji, 3);
        if (kind == 1) append_utf8(s, 0x1F44B), append_utf8(s, 0x1F3FB + pick(5));
        if (kind == 2) {
          s += "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466";
        }
        if (kind == 3) s += "\u2764\uFE0F";
        break;
      }
      case 12:  // a long run of one symbol: exercises long BPE merges
        s += std::string(50 + pick(400), "a=-_*#.0 "[pick(9)]);
        break;
      default:
        s += ' ';
        run(s, kScripts[0], 8);
        break;
    }
  }

  std::mt19937 rng_;
};

fs::path node_script() {
  return fs::path(AGORA_SOURCE_DIR) / "tests/parity/tiktoken_encode.mjs";
}

// Runs tiktoken over `files` and returns one id list per file. Failures are test failures.
std::vector<std::vector<TokenId>> tiktoken_ids(const std::vector<fs::path>& files,
                                               const fs::path& work) {
  const fs::path list = work / "files.txt";
  const fs::path out = work / "ids.txt";
  {
    std::ofstream list_out(list);
    for (const fs::path& f : files) list_out << f.string() << '\n';
  }
  const char* node = std::getenv("AGORA_NODE");
  const std::string command = std::string(node != nullptr ? node : "node") + " '" +
                              node_script().string() +
                              "' --tiktoken '" AGORA_DEPS_DIR "/node_modules/tiktoken' --list '" +
                              list.string() + "' --out '" + out.string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return {};
  }
  std::string messages;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) messages.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    ADD_FAILURE() << "tiktoken reference failed (exit status " << status << "): " << command << "\n"
                  << messages << "\nnode and deps/node_modules/tiktoken are required: run "
                  << "scripts/setup.sh";
    return {};
  }
  std::vector<std::vector<TokenId>> ids;
  std::istringstream lines(read_file(out));
  for (std::string line; std::getline(lines, line);) {
    auto& row = ids.emplace_back();
    const char* p = line.c_str();
    char* end;
    for (unsigned long v = std::strtoul(p, &end, 10); end != p; v = std::strtoul(p, &end, 10)) {
      row.push_back(static_cast<TokenId>(v));
      p = end;
    }
  }
  if (ids.size() != files.size()) {
    ADD_FAILURE() << "tiktoken reference gave " << ids.size() << " lines for " << files.size()
                  << " files";
    return {};
  }
  return ids;
}

// Compares, and on a difference names the file, the first differing index and the text there.
void expect_same(const Gpt2Tokenizer& gpt2, const fs::path& file,
                 const std::vector<TokenId>& expected, int& failures) {
  const std::vector<TokenId> actual = gpt2.encode(read_file(file));
  if (actual == expected) return;
  if (++failures > 20) return;  // the first few say enough
  size_t i = 0;
  while (i < actual.size() && i < expected.size() && actual[i] == expected[i]) ++i;
  auto context = [&](const std::vector<TokenId>& ids) {
    const size_t from = i >= 8 ? i - 8 : 0;
    const size_t to = std::min(ids.size(), i + 8);
    std::ostringstream s;
    s << testing::PrintToString(
             gpt2.decode(std::span<const TokenId>(ids.data() + from, ids.data() + to)))
      << " ids";
    for (size_t k = from; k < to; ++k) s << (k == i ? " [" : " ") << ids[k] << (k == i ? "]" : "");
    return s.str();
  };
  ADD_FAILURE() << file.string() << ": agora gives " << actual.size() << " tokens, tiktoken "
                << expected.size() << "; first difference at index " << i
                << "\n  agora:    " << context(actual) << "\n  tiktoken: " << context(expected);
}

class Gpt2Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = fs::temp_directory_path() / ("agora_gpt2_parity_" + std::to_string(::getpid()));
    fs::create_directories(work_);
  }
  // AGORA_KEEP_PARITY_FILES=1 keeps the generated texts, to look at a mismatch.
  void TearDown() override {
    if (std::getenv("AGORA_KEEP_PARITY_FILES") == nullptr) fs::remove_all(work_);
  }

  void check(const std::vector<fs::path>& files) {
    const auto gpt2 = Gpt2Tokenizer::load(default_gpt2_dir());
    const auto expected = tiktoken_ids(files, work_);
    if (expected.empty()) return;
    int failures = 0;
    for (size_t i = 0; i < files.size(); ++i) expect_same(*gpt2, files[i], expected[i], failures);
    EXPECT_EQ(failures, 0) << "of " << files.size() << " files";
  }

  fs::path work_;
};

TEST_F(Gpt2Parity, CorpusDocuments) {
  const fs::path corpus = fs::path(AGORA_DATA_DIR) / "corpus";
  ASSERT_TRUE(fs::is_directory(corpus))
      << corpus.string() << " is missing: run scripts/setup.sh to assemble the corpus";
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(corpus)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") {
      files.push_back(entry.path());
    }
  }
  ASSERT_FALSE(files.empty()) << corpus.string() << " has no .txt documents: run scripts/setup.sh";
  std::sort(files.begin(), files.end());
  check(files);
}

TEST_F(Gpt2Parity, GeneratedStressText) {
  std::vector<fs::path> files;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    files.push_back(work_ / ("stress_" + std::to_string(seed) + ".txt"));
    std::ofstream(files.back(), std::ios::binary) << StressText(seed).make(48 * 1024);
  }
  // Invalid UTF-8: node's decoder (WHATWG) and repair_utf8 must replace the same bytes.
  for (uint32_t seed = 100; seed <= 101; ++seed) {
    std::string text = StressText(seed).make(16 * 1024);
    std::mt19937 rng(seed);
    for (int k = 0; k < 300; ++k) text[rng() % text.size()] = static_cast<char>(0x80 + rng() % 128);
    files.push_back(work_ / ("invalid_" + std::to_string(seed) + ".txt"));
    std::ofstream(files.back(), std::ios::binary) << text;
  }
  // A few hand-made edge cases: edges of whitespace runs, contractions at the very end.
  const std::vector<std::string> edges = {"",
                                          " ",
                                          "  ",
                                          "\n",
                                          " \n ",
                                          "a ",
                                          "a  ",
                                          "a \u00A0b",
                                          "x'",
                                          "x's",
                                          "'s",
                                          "''s",
                                          "\u3000a",
                                          "   \u0085",
                                          "\u2028\u2029",
                                          "1 2  3   4",
                                          "¹²³ ½",
                                          "a\u0301\u0302\u0303",
                                          "\t\n\v\f\r a"};
  for (size_t i = 0; i < edges.size(); ++i) {
    files.push_back(work_ / ("edge_" + std::to_string(i) + ".txt"));
    std::ofstream(files.back(), std::ios::binary) << edges[i];
  }
  check(files);
}

}  // namespace
}  // namespace agora
