// Corpus files as streams: plain, gzip and Zstandard, whole or damaged.
#include "agora/data/text_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agora/core/error.h"
#include "compress_for_test.h"

namespace agora {
namespace {

using testing_compress::gzip;
using testing_compress::zstd;

std::vector<std::string> lines_of(TextStream stream, size_t max_line = 1 << 20) {
  std::vector<std::string> lines;
  std::string line;
  for (;;) {
    const auto got = stream.next_line(line, max_line);
    if (got == TextStream::Line::kEnd) return lines;
    lines.push_back(got == TextStream::Line::kTooLong ? "<too long>" : line);
  }
}

// Several MB over many lines of uneven length, so lines cross every chunk boundary.
std::string big_text() {
  std::string text;
  for (int i = 0; text.size() < (3u << 20); ++i) {
    text += "line " + std::to_string(i) + ": " + std::string(i % 977, 'a' + i % 26) + "\n";
  }
  return text;
}

TEST(TextStream, SplitsLinesAtNewlinesKeepingCarriageReturns) {
  EXPECT_EQ(lines_of(TextStream::from_bytes("a\nb\r\n\nc", "t")),
            (std::vector<std::string>{"a", "b\r", "", "c"}));
  EXPECT_EQ(lines_of(TextStream::from_bytes("a\n", "t")), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(lines_of(TextStream::from_bytes("", "t")).empty());
}

TEST(TextStream, GzipAndZstdReadAsTheTextTheyHold) {
  const std::string text = big_text();
  const auto plain = lines_of(TextStream::from_bytes(text, "plain"));
  auto gz = TextStream::from_bytes(gzip(text), "t.gz");
  EXPECT_EQ(gz.compression(), Compression::kGzip);
  EXPECT_EQ(lines_of(std::move(gz)), plain);
  auto zs = TextStream::from_bytes(zstd(text), "t.zst");
  EXPECT_EQ(zs.compression(), Compression::kZstd);
  EXPECT_EQ(lines_of(std::move(zs)), plain);
  EXPECT_EQ(TextStream::from_bytes(zstd(text), "t").read_all(text.size()), text);
  EXPECT_EQ(TextStream::from_bytes(gzip(text), "t").read_all(text.size()), text);
}

TEST(TextStream, HighlyCompressibleTextFillsEveryOutputChunk) {
  // Megabytes from a few kilobytes: every decompression call fills its output chunk.
  const std::string text(5u << 20, 'x');
  EXPECT_EQ(TextStream::from_bytes(gzip(text, 9), "t.gz").read_all(text.size()), text);
  EXPECT_EQ(TextStream::from_bytes(zstd(text, 19), "t.zst").read_all(text.size()), text);
}

TEST(TextStream, ConcatenatedMembersAndFramesReadOneAfterAnother) {
  EXPECT_EQ(TextStream::from_bytes(gzip("one\n") + gzip("two\n"), "t").read_all(100), "one\ntwo\n");
  EXPECT_EQ(TextStream::from_bytes(zstd("one\n") + zstd("two\n"), "t").read_all(100), "one\ntwo\n");
  // Uneven pieces put the ends of members and frames anywhere in an output chunk.
  const std::string text = big_text();
  std::string gz, zs;
  for (size_t begin = 0, size = 100'003; begin < text.size(); begin += size, size = size * 3 / 2) {
    gz += gzip(text.substr(begin, size));
    zs += zstd(text.substr(begin, size));
  }
  EXPECT_EQ(TextStream::from_bytes(gz, "t.gz").read_all(text.size()), text);
  EXPECT_EQ(TextStream::from_bytes(zs, "t.zst").read_all(text.size()), text);
  EXPECT_EQ(lines_of(TextStream::from_bytes(zs, "t.zst")),
            lines_of(TextStream::from_bytes(text, "t")));
}

TEST(TextStream, TruncatedStreamsAreErrorsNamingTheFile) {
  const std::string text = big_text();
  for (const auto& [name, bytes] : {std::pair{"cut.gz", gzip(text)}, {"cut.zst", zstd(text)}}) {
    for (const size_t keep : {size_t{5}, bytes.size() / 2, bytes.size() - 1}) {
      try {
        lines_of(TextStream::from_bytes(bytes.substr(0, keep), name));
        ADD_FAILURE() << name << " cut to " << keep << " bytes read without an error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
  try {
    TextStream::from_bytes(gzip(text).substr(0, 1000), "half.gz").read_all(text.size());
    ADD_FAILURE() << "a truncated gzip stream read whole";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(TextStream, DamagedStreamsAreErrors) {
  const std::string text = big_text();
  for (const auto& [name, bytes] : {std::pair{"bad.gz", gzip(text)}, {"bad.zst", zstd(text)}}) {
    std::string damaged = bytes;
    for (size_t i = damaged.size() / 3; i < damaged.size() / 3 + 16; ++i) damaged[i] ^= 0x5a;
    EXPECT_THROW(TextStream::from_bytes(damaged, name).read_all(text.size()), Error) << name;
  }
  // A gzip member's CRC covers what it holds: a flipped byte of the trailer is caught.
  std::string crc = gzip("hello\n");
  crc[crc.size() - 6] ^= 1;
  EXPECT_THROW(TextStream::from_bytes(crc, "crc.gz").read_all(100), Error);
}

TEST(TextStream, LinesPastTheLimitAreSkippedNotHeld) {
  const std::string text =
      "short\n" + std::string(3u << 20, 'y') + "\nafter\n" + std::string(5000, 'z');
  for (const std::string& bytes : {text, gzip(text), zstd(text)}) {
    EXPECT_EQ(lines_of(TextStream::from_bytes(bytes, "t"), 4096),
              (std::vector<std::string>{"short", "<too long>", "after", "<too long>"}));
  }
}

TEST(TextStream, ReadAllStopsAtItsLimitOnABomb) {
  // 64 MiB of zeros in a few tens of kilobytes: the reader gives up at its limit.
  const std::string bomb = gzip(std::string(64u << 20, '\0'), 9);
  ASSERT_LT(bomb.size(), 100'000u);
  try {
    TextStream::from_bytes(bomb, "bomb.gz").read_all(1u << 20);
    ADD_FAILURE() << "read 64 MiB past a 1 MiB limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bomb.gz"), std::string::npos) << e.what();
  }
}

TEST(TextStream, CountsTheBytesItHandsOut) {
  auto stream = TextStream::from_bytes(gzip("ab\ncd\n"), "t");
  std::string line;
  stream.next_line(line, 100);
  EXPECT_EQ(stream.bytes_read(), 3u);
  EXPECT_EQ(stream.read_all(100), "cd\n");
  EXPECT_EQ(stream.bytes_read(), 6u);
}

TEST(TextStream, AMissingFileIsAnErrorNamingIt) {
  try {
    TextStream::open("/nonexistent/corpus.jsonl.zst");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.jsonl.zst"), std::string::npos);
  }
}

}  // namespace
}  // namespace agora
