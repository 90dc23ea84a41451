#include "agora/data/shard.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "test_support.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class ShardTest : public agora::testing::TempDirTest {};

// Raw bytes of a shard, built by hand (independently of ShardWriter) for the rejection tests.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, size_t body_bytes) {
  std::string bytes(kShardHeaderBytes + body_bytes, '\0');
  auto put = [&](size_t at, int32_t v) {
    for (int b = 0; b < 4; ++b) bytes[at + b] = static_cast<char>((uint32_t(v) >> (8 * b)) & 0xff);
  };
  put(0, magic);
  put(4, version);
  put(8, count);
  return bytes;
}

std::vector<TokenId> all_tokens(const ShardReader& reader) {
  std::vector<TokenId> out(reader.num_tokens());
  reader.copy(0, out.size(), out.data());
  return out;
}

// A deterministic mix of ordinary values and the extremes of the version's range.
std::vector<TokenId> sample_tokens(size_t n, TokenId max_id) {
  std::vector<TokenId> tokens(n);
  uint64_t state = 12345;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    tokens[i] = static_cast<TokenId>((state >> 33) % (uint64_t{max_id} + 1));
  }
  if (n > 0) tokens[0] = max_id;
  if (n > 1) tokens[n - 1] = 0;
  return tokens;
}

TEST(ShardVersion, ForVocab) {
  EXPECT_EQ(shard_version_for_vocab(0), 1);
  EXPECT_EQ(shard_version_for_vocab(50257), 1);
  EXPECT_EQ(shard_version_for_vocab(65535), 1);
  EXPECT_EQ(shard_version_for_vocab(65536), 1);
  EXPECT_EQ(shard_version_for_vocab(65537), 2);
  EXPECT_EQ(shard_version_for_vocab(128256), 2);
  EXPECT_EQ(shard_version_for_vocab(UINT32_MAX), 2);
}

TEST_F(ShardTest, RoundTripBothVersionsAndSizes) {
  for (const int version : {1, 2}) {
    const TokenId max_id = version == 1 ? 0xffff : 0xffffffff;
    for (const size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{1000}, size_t{300000}}) {
      SCOPED_TRACE(::testing::Message() << "version " << version << ", " << n << " tokens");
      const auto tokens = sample_tokens(n, max_id);
      const fs::path path = dir_ / ("rt_" + std::to_string(version) + "_" + std::to_string(n));
      write_shard(path, tokens, version);
      EXPECT_EQ(fs::file_size(path), kShardHeaderBytes + n * (version == 1 ? 2 : 4));
      const ShardReader reader = ShardReader::open(path);
      EXPECT_EQ(reader.version(), version);
      EXPECT_EQ(reader.num_tokens(), n);
      EXPECT_EQ(reader.path(), path);
      EXPECT_EQ(all_tokens(reader), tokens);
      for (size_t i = 0; i < n; i += 997) EXPECT_EQ(reader.token(i), tokens[i]);
      if (n > 0) {
        EXPECT_EQ(reader.token(n - 1), tokens[n - 1]);
      }
    }
  }
}

TEST_F(ShardTest, HeaderBytesAreLlmcLayout) {
  const fs::path path = dir_ / "layout.bin";
  write_shard(path, std::vector<TokenId>{0x0102, 0xa0b0}, 1);
  const std::string bytes = read_file(path);
  ASSERT_EQ(bytes.size(), kShardHeaderBytes + 4);
  // 20240520 = 0x0134d888, little-endian.
  EXPECT_EQ(bytes.substr(0, 12), std::string("\x88\xd8\x34\x01\x01\0\0\0\x02\0\0\0", 12));
  EXPECT_EQ(bytes.substr(12, kShardHeaderBytes - 12), std::string(kShardHeaderBytes - 12, '\0'));
  EXPECT_EQ(bytes.substr(kShardHeaderBytes), std::string("\x02\x01\xb0\xa0", 4));
}

TEST_F(ShardTest, StreamingAppendsEqualOneShot) {
  const auto tokens = sample_tokens(700000, 100000);  // crosses the writer's 1 MiB buffer
  {
    ShardWriter writer(dir_ / "streamed.bin", 2);
    size_t at = 0;
    for (size_t chunk = 1; at < tokens.size(); chunk = chunk * 3 + 1) {
      const size_t n = std::min(chunk, tokens.size() - at);
      writer.append(std::span<const TokenId>(tokens).subspan(at, n));
      at += n;
    }
    writer.append({});
    EXPECT_EQ(writer.num_tokens(), tokens.size());
    writer.finish();
  }
  write_shard(dir_ / "oneshot.bin", tokens, 2);
  EXPECT_EQ(read_file(dir_ / "streamed.bin"), read_file(dir_ / "oneshot.bin"));
}

TEST_F(ShardTest, WriterRejectsTokenThatDoesNotFitAndStaysUsable) {
  const fs::path path = dir_ / "v1.bin";
  ShardWriter writer(path, 1);
  writer.append(std::vector<TokenId>{1, 2, 3});
  EXPECT_ERROR_WITH(writer.append(std::vector<TokenId>{4, 65535, 65536, 7}), path.string(),
                    "token 65536", "position 5", "version 1", "65535");
  EXPECT_EQ(writer.num_tokens(), 3u);
  writer.append(std::vector<TokenId>{65535});
  writer.finish();
  EXPECT_EQ(all_tokens(ShardReader::open(path)), (std::vector<TokenId>{1, 2, 3, 65535}));
  EXPECT_ERROR_WITH(writer.append(std::vector<TokenId>{1}), "finished");
  EXPECT_ERROR_WITH(writer.finish(), "finished");
}

TEST_F(ShardTest, WriterRejectsUnknownVersion) {
  EXPECT_ERROR_WITH(ShardWriter(dir_ / "x.bin", 3), "x.bin", "version 3", "1 (uint16", "2 (uint32");
  EXPECT_ERROR_WITH(write_shard(dir_ / "y.bin", {}, 0), "version 0");
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(ShardTest, WriterIsAtomic) {
  const fs::path path = dir_ / "atomic.bin";
  {
    ShardWriter writer(path, 2);
    writer.append(sample_tokens(1000, 1u << 20));
    EXPECT_FALSE(fs::exists(path)) << "the final path appeared before finish()";
    writer.finish();
    EXPECT_TRUE(fs::exists(path));
  }
  std::vector<fs::path> entries(fs::directory_iterator(dir_), fs::directory_iterator{});
  ASSERT_EQ(entries.size(), 1u) << "a temporary file was left behind";
  EXPECT_EQ(entries[0], path);

  // An existing shard is replaced whole, and stays readable until the replacement is in place.
  {
    ShardWriter writer(path, 1);
    writer.append(std::vector<TokenId>{9, 8, 7});
    EXPECT_EQ(ShardReader::open(path).num_tokens(), 1000u);
    writer.finish();
  }
  EXPECT_EQ(all_tokens(ShardReader::open(path)), (std::vector<TokenId>{9, 8, 7}));
}

TEST_F(ShardTest, AbandonedWriterLeavesNothing) {
  {
    ShardWriter writer(dir_ / "abandoned.bin", 1);
    writer.append(std::vector<TokenId>{1, 2, 3});
  }
  {
    ShardWriter a(dir_ / "moved.bin", 1);
    ShardWriter b = std::move(a);
    b.append(std::vector<TokenId>{1});
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(ShardTest, MovedWriterAndReaderKeepWorking) {
  ShardWriter a(dir_ / "m.bin", 2);
  a.append(std::vector<TokenId>{5});
  ShardWriter b(std::move(a));
  b.append(std::vector<TokenId>{6});
  b.finish();
  ShardReader r1 = ShardReader::open(dir_ / "m.bin");
  ShardReader r2 = std::move(r1);
  EXPECT_EQ(all_tokens(r2), (std::vector<TokenId>{5, 6}));
  r1 = std::move(r2);
  EXPECT_EQ(r1.token(1), 6u);
}

TEST_F(ShardTest, ReaderBoundsChecks) {
  const fs::path path = dir_ / "b.bin";
  write_shard(path, std::vector<TokenId>{1, 2, 3}, 1);
  const ShardReader reader = ShardReader::open(path);
  EXPECT_ERROR_WITH(reader.token(3), "b.bin", "token index 3", "has 3 tokens");
  TokenId out[4];
  reader.copy(3, 0, out);  // an empty range at the end is fine
  reader.copy(1, 2, out);
  EXPECT_EQ(out[0], 2u);
  EXPECT_EQ(out[1], 3u);
  EXPECT_ERROR_WITH(reader.copy(2, 2, out), "b.bin", "out of range", "has 3 tokens");
  EXPECT_ERROR_WITH(reader.copy(4, 0, out), "out of range");
  EXPECT_ERROR_WITH(reader.copy(1, SIZE_MAX, out), "out of range");
  EXPECT_ERROR_WITH(reader.copy(SIZE_MAX, 2, out), "out of range");
}

TEST_F(ShardTest, ReaderRejectsBadFiles) {
  auto write = [&](const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  EXPECT_ERROR_WITH(ShardReader::open(dir_ / "missing.bin"), "missing.bin", "No such file");
  EXPECT_ERROR_WITH(ShardReader::open(dir_), dir_.string(), "not a regular file");
  EXPECT_ERROR_WITH(ShardReader::open(write("empty.bin", "")), "empty.bin", "empty", "1024-byte");
  EXPECT_ERROR_WITH(ShardReader::open(write("short.bin", std::string(100, 'x'))), "short.bin",
                    "100 bytes", "shorter than the 1024-byte header");
  EXPECT_ERROR_WITH(
      ShardReader::open(
          write("short2.bin", raw_shard(kShardMagic, 1, 0, 0).substr(0, kShardHeaderBytes - 1))),
      "1023 bytes");
  EXPECT_ERROR_WITH(ShardReader::open(write("magic.bin", raw_shard(12345, 1, 0, 0))), "magic.bin",
                    "magic is 12345", "expected 20240520");
  // llm.c's Llama-3 shards (magic 20240801, version 7) are not this format.
  EXPECT_ERROR_WITH(ShardReader::open(write("llama3.bin", raw_shard(20240801, 7, 1, 4))),
                    "magic is 20240801");
  EXPECT_ERROR_WITH(ShardReader::open(write("v3.bin", raw_shard(kShardMagic, 3, 0, 0))), "v3.bin",
                    "version is 3", "expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  EXPECT_ERROR_WITH(ShardReader::open(write("v0.bin", raw_shard(kShardMagic, 0, 0, 0))),
                    "version is 0");
  EXPECT_ERROR_WITH(ShardReader::open(write("neg.bin", raw_shard(kShardMagic, 2, -5, 0))),
                    "neg.bin", "-5 tokens", "negative");
  const fs::path x = write("x.bin", raw_shard(kShardMagic, 1, 1000, 1500));
  EXPECT_ERROR_WITH(ShardReader::open(x),
                    x.string() +
                        ": header says 1000 tokens (2000 bytes of uint16) but the file "
                        "has 1500 bytes after its 1024-byte header");
  EXPECT_ERROR_WITH(ShardReader::open(write("long.bin", raw_shard(kShardMagic, 2, 1, 8))),
                    "header says 1 tokens (4 bytes of uint32)", "has 8 bytes");
  EXPECT_ERROR_WITH(ShardReader::open(write("odd.bin", raw_shard(kShardMagic, 1, 2, 5))),
                    "has 5 bytes");
  EXPECT_ERROR_WITH(ShardReader::open(write("huge.bin", raw_shard(kShardMagic, 2, 0x7fffffff, 4))),
                    "2147483647 tokens (8589934588 bytes of uint32)");
}

// ---------------------------------------------------------------------------------------------
// Independent check: llm.c's own Python loader reads what ShardWriter writes, and ShardReader
// reads what llm.c's Python writer writes.

constexpr const char* kPython = "/usr/bin/python3";

// The loader and writer of llm.c (train_gpt2.py's _load_data_shard, dev/data/data_common.py's
// write_datafile), widened to version 2 as agora defines it. Native int32/uint16/uint32, as
// llm.c uses, on the little-endian hosts it runs on.
constexpr const char* kLlmcScript = R"(
import sys
import numpy as np

def load_data_shard(filename):
    with open(filename, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        assert header[0] == 20240520, "magic number mismatch in the data .bin file"
        assert header[1] in (1, 2), "unsupported version"
        ntok = header[2]
        dtype = np.uint16 if header[1] == 1 else np.uint32
        tokens = np.frombuffer(f.read(), dtype=dtype)
    assert len(tokens) == ntok, "number of tokens read does not match header?"
    return tokens

def write_datafile(filename, toks, version):
    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240520
    header[1] = version
    header[2] = len(toks)
    toks_np = np.array(toks, dtype=np.uint16 if version == 1 else np.uint32)
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(toks_np.tobytes())

if sys.argv[1] == "read":
    for filename in sys.argv[2:]:
        t = load_data_shard(filename)
        print(len(t), int(t.astype(np.uint64).sum()), *t.tolist())
else:
    n, version, filename = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    toks = [(i * 2654435761) % (65536 if version == 1 else 4294967296) for i in range(n)]
    write_datafile(filename, toks, version)
)";

// Runs `command`, returns its stdout; fails the test when it exits non-zero.
std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return out;
  }
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " failed (status " << status << "); output:\n"
      << out;
  return out;
}

void require_numpy() {
  const int status = std::system((std::string(kPython) + " -c 'import numpy' 2>/dev/null").c_str());
  ASSERT_TRUE(status == 0) << "the independent reader check needs " << kPython
                           << " with numpy (Debian: apt-get install python3-numpy); `" << kPython
                           << " -c 'import numpy'` failed";
}

TEST_F(ShardTest, LlmcPythonLoaderReadsOurShards) {
  ASSERT_NO_FATAL_FAILURE(require_numpy());
  const fs::path script = dir_ / "llmc.py";
  std::ofstream(script) << kLlmcScript;
  struct Case {
    std::string name;
    int version;
    std::vector<TokenId> tokens;
  };
  const std::vector<Case> cases = {
      {"v1_empty.bin", 1, {}},
      {"v1_one.bin", 1, {65535}},
      {"v1_many.bin", 1, sample_tokens(5000, 0xffff)},
      {"v2_empty.bin", 2, {}},
      {"v2_one.bin", 2, {0xffffffff}},
      {"v2_many.bin", 2, sample_tokens(5000, 0xffffffff)},
  };
  std::string command = std::string(kPython) + " " + script.string() + " read";
  for (const Case& c : cases) {
    write_shard(dir_ / c.name, c.tokens, c.version);
    command += " " + (dir_ / c.name).string();
  }
  std::istringstream lines(run(command + " 2>&1"));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << "python printed too few lines";
    std::istringstream fields(line);
    uint64_t count = 0, sum = 0;
    fields >> count >> sum;
    uint64_t expected_sum = 0;
    for (const TokenId t : c.tokens) expected_sum += t;
    EXPECT_EQ(count, c.tokens.size());
    EXPECT_EQ(sum, expected_sum);
    std::vector<TokenId> seen;
    for (uint64_t t; fields >> t;) seen.push_back(static_cast<TokenId>(t));
    EXPECT_EQ(seen, c.tokens);
  }
}

TEST_F(ShardTest, ReaderReadsLlmcPythonWriterShards) {
  ASSERT_NO_FATAL_FAILURE(require_numpy());
  const fs::path script = dir_ / "llmc.py";
  std::ofstream(script) << kLlmcScript;
  for (const int version : {1, 2}) {
    for (const size_t n : {size_t{0}, size_t{1}, size_t{4097}}) {
      SCOPED_TRACE(::testing::Message() << "version " << version << ", " << n << " tokens");
      const fs::path path = dir_ / "py.bin";
      run(std::string(kPython) + " " + script.string() + " write " + std::to_string(n) + " " +
          std::to_string(version) + " " + path.string() + " 2>&1");
      const ShardReader reader = ShardReader::open(path);
      EXPECT_EQ(reader.version(), version);
      ASSERT_EQ(reader.num_tokens(), n);
      const uint64_t modulus = version == 1 ? 65536 : 4294967296;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(reader.token(i), (i * 2654435761ULL) % modulus) << "token " << i;
      }
    }
  }
}

}  // namespace
}  // namespace agora
