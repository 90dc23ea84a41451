#include "agora/data/sampler.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "test_support.h"

namespace agora {
namespace {

namespace fs = std::filesystem;

class SamplerTest : public agora::testing::TempDirTest {
 protected:
  // Writes a shard whose token at position p is base + p, so a token names its own position.
  std::shared_ptr<const ShardReader> make_shard(const std::string& name, size_t n,
                                                TokenId base = 0) {
    std::vector<TokenId> tokens(n);
    std::iota(tokens.begin(), tokens.end(), base);
    write_shard(dir_ / name, tokens, 2);
    return std::make_shared<const ShardReader>(ShardReader::open(dir_ / name));
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Checks that perm is a bijection on [0, size) by visiting every image once.
void expect_bijection(const KeyedPermutation& perm) {
  std::vector<bool> seen(perm.size(), false);
  for (uint64_t k = 0; k < perm.size(); ++k) {
    const uint64_t v = perm(k);
    ASSERT_LT(v, perm.size()) << "k=" << k;
    ASSERT_FALSE(seen[v]) << "value " << v << " hit twice (size " << perm.size() << ")";
    seen[v] = true;
  }
}

TEST(SamplerPermutation, IsABijectionForManySizes) {
  // 1, small, primes, powers of two and their neighbours, odd and even bit counts, ~1e5.
  for (const uint64_t size : {1,  2,   3,   4,   5,    7,    8,    9,     16,    17,     31,
                              97, 255, 256, 257, 1000, 1024, 4093, 65536, 99991, 100000, 131072}) {
    SCOPED_TRACE(size);
    for (const uint64_t epoch : {0, 1, 7}) {
      ASSERT_NO_FATAL_FAILURE(expect_bijection(KeyedPermutation(size, 1234, epoch)));
    }
  }
}

TEST(SamplerPermutation, ExhaustiveOverSmallSizesAndSeeds) {
  for (uint64_t size = 1; size <= 70; ++size) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      ASSERT_NO_FATAL_FAILURE(expect_bijection(KeyedPermutation(size, seed, seed * 3)));
    }
  }
}

TEST(SamplerPermutation, LargeDomainStaysInRange) {
  const uint64_t size = (uint64_t{1} << 62) + 12345;
  const KeyedPermutation perm(size, 99, 3);
  for (uint64_t k : {uint64_t{0}, uint64_t{1}, size / 2, size - 1}) EXPECT_LT(perm(k), size);
  const KeyedPermutation full(UINT64_MAX, 5, 0);
  EXPECT_LT(full(UINT64_MAX - 1), UINT64_MAX);
}

TEST(SamplerPermutation, RejectsBadArguments) {
  EXPECT_THROW(KeyedPermutation(0, 1, 0), Error);
  EXPECT_NE(error_of([] { KeyedPermutation(10, 1, 0)(10); }).find("index 10 is out of range"),
            std::string::npos);
}

// Golden values: computed once with this implementation (splitmix64 keys, 8 alternating rounds,
// cycle walking) when it was written. If this test fails, the mapping from sequence ids to data
// changed, and runs started before the change would train on different data after it.
TEST(SamplerPermutation, GoldenValues) {
  const KeyedPermutation perm(1000, 1234, 0);
  std::vector<uint64_t> first;
  for (uint64_t k = 0; k < 8; ++k) first.push_back(perm(k));
  EXPECT_EQ(first, (std::vector<uint64_t>{544, 25, 126, 974, 422, 128, 761, 237}));
}

TEST(SamplerPermutation, SeedAndEpochChangeTheOrder) {
  auto prefix = [](uint64_t seed, uint64_t epoch) {
    const KeyedPermutation perm(1000, seed, epoch);
    std::vector<uint64_t> out;
    for (uint64_t k = 0; k < 64; ++k) out.push_back(perm(k));
    return out;
  };
  EXPECT_NE(prefix(1234, 0), prefix(1235, 0));
  EXPECT_NE(prefix(1234, 0), prefix(1234, 1));
  EXPECT_NE(prefix(1234, 1), prefix(1234, 2));
  EXPECT_EQ(prefix(1234, 5), prefix(1234, 5));
  // Not the identity, and not a rotation of it.
  const auto p = prefix(1234, 0);
  int ascending = 0;
  for (size_t i = 1; i < p.size(); ++i) ascending += p[i] == p[i - 1] + 1;
  EXPECT_LT(ascending, 8);
}

TEST_F(SamplerTest, WindowsFollowTheLayout) {
  const uint32_t T = 4;
  // 4 tokens: too short (needs T + 1 = 5); 5: one window; 8: one; 9: two; 21: five.
  const std::vector<size_t> sizes = {4, 5, 8, 9, 21};
  std::vector<std::shared_ptr<const ShardReader>> shards;
  for (size_t i = 0; i < sizes.size(); ++i) {
    shards.push_back(make_shard("s" + std::to_string(i) + ".bin", sizes[i], 1000 * i));
  }
  const Sampler sampler(shards, T, 1);
  ASSERT_EQ(sampler.windows_per_epoch(), 0u + 1 + 1 + 2 + 5);
  const std::vector<Sampler::Window> expected = {{1, 0}, {2, 0}, {3, 0},  {3, 4}, {4, 0},
                                                 {4, 4}, {4, 8}, {4, 12}, {4, 16}};
  for (uint64_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(sampler.window_at(i), expected[i]) << "window " << i;
  }
  EXPECT_THROW(sampler.window_at(expected.size()), Error);
  // Every token after a shard's first is a target exactly once per shard.
  std::vector<std::vector<int>> targeted(sizes.size());
  for (size_t s = 0; s < sizes.size(); ++s) targeted[s].assign(sizes[s], 0);
  for (uint64_t i = 0; i < expected.size(); ++i) {
    const auto w = sampler.window_at(i);
    for (uint64_t p = w.first_token + 1; p <= w.first_token + T; ++p) ++targeted[w.shard][p];
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    const size_t windows = sizes[s] < T + 1 ? 0 : (sizes[s] - 1) / T;
    for (size_t p = 0; p < sizes[s]; ++p) {
      EXPECT_EQ(targeted[s][p], p >= 1 && p <= windows * T ? 1 : 0) << "shard " << s << " p " << p;
    }
  }
}

// Bags of s tokens (TST): a window is T + 1 bags, windows start every s * T tokens and share one
// bag with the next, so every bag after a shard's first is a target bag exactly once.
TEST_F(SamplerTest, BagWindowsFollowTheLayout) {
  const uint32_t T = 2, s = 3;
  // s * (T + 1) = 9 tokens make one window: 8 is too short, 9 and 14 hold one, 15 two, 27 four.
  const std::vector<size_t> sizes = {8, 9, 14, 15, 27};
  std::vector<std::shared_ptr<const ShardReader>> shards;
  for (size_t i = 0; i < sizes.size(); ++i) {
    shards.push_back(make_shard("b" + std::to_string(i) + ".bin", sizes[i], 1000 * i));
  }
  const Sampler sampler(shards, T, 5, s);
  EXPECT_EQ(sampler.bag(), s);
  EXPECT_EQ(sampler.window_tokens(), 9u);
  ASSERT_EQ(sampler.windows_per_epoch(), 0u + 1 + 1 + 2 + 4);
  const std::vector<Sampler::Window> expected = {{1, 0}, {2, 0}, {3, 0},  {3, 6},
                                                 {4, 0}, {4, 6}, {4, 12}, {4, 18}};
  for (uint64_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(sampler.window_at(i), expected[i]) << "window " << i;
  }
  // read() writes the s * (T + 1) consecutive tokens of the window.
  std::vector<TokenId> got(sampler.window_tokens());
  for (uint64_t q = 0; q < 2 * expected.size(); ++q) {
    const Sampler::Window w = sampler.window(q);
    sampler.read(q, got.data());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], 1000 * w.shard + w.first_token + k) << "sequence " << q;
    }
  }
  // bag = 1 is the ordinary sampler, window for window.
  const Sampler plain(shards, T, 5), one(shards, T, 5, 1);
  ASSERT_EQ(plain.windows_per_epoch(), one.windows_per_epoch());
  for (uint64_t q = 0; q < 50; ++q) EXPECT_EQ(plain.window(q), one.window(q));
  EXPECT_THROW(Sampler(shards, T, 5, 0), Error);
  try {
    Sampler({make_shard("short.bin", 8)}, T, 5, s);
    ADD_FAILURE() << "a shard shorter than one bag window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bags of 3"), std::string::npos) << e.what();
  }
}

TEST_F(SamplerTest, EveryWindowOncePerEpochAndTokensMatch) {
  const uint32_t T = 3;
  std::vector<std::shared_ptr<const ShardReader>> shards = {
      make_shard("a.bin", 301, 0), make_shard("b.bin", 2, 10000), make_shard("c.bin", 3000, 20000)};
  const Sampler sampler(shards, T, 42);
  const uint64_t W = sampler.windows_per_epoch();
  ASSERT_EQ(W, 100u + 0 + 999);
  std::vector<TokenId> got(sampler.window_tokens()), want(sampler.window_tokens());
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> visits(W, 0);
    for (uint64_t k = 0; k < W; ++k) {
      const uint64_t q = epoch * W + k;
      const auto w = sampler.window(q);
      // Recover the global index from the window to count visits.
      const uint64_t index = w.shard == 0 ? w.first_token / T : 100 + w.first_token / T;
      ASSERT_EQ(sampler.window_at(index), w);
      ++visits[index];
      sampler.read(q, got.data());
      sampler.shard(w.shard).copy(w.first_token, want.size(), want.data());
      ASSERT_EQ(got, want) << "sequence " << q;
      // Tokens name their positions: consecutive, starting at the window's first token.
      const TokenId base = w.shard == 0 ? 0 : 20000;
      ASSERT_EQ(got.front(), base + w.first_token);
      ASSERT_EQ(got.back(), base + w.first_token + T);
    }
    for (uint64_t i = 0; i < W; ++i) {
      ASSERT_EQ(visits[i], 1) << "epoch " << epoch << " window " << i;
    }
  }
}

TEST_F(SamplerTest, EpochsOfManySizesArePermutations) {
  // W = 1, a prime, a power of two, and ~10^5, built from shards with T = 1 (W = n - 1).
  for (const size_t W : {size_t{1}, size_t{2}, size_t{997}, size_t{4096}, size_t{100003}}) {
    SCOPED_TRACE(W);
    const Sampler sampler({make_shard("w.bin", W + 1)}, 1, 7);
    ASSERT_EQ(sampler.windows_per_epoch(), W);
    for (const uint64_t epoch : {uint64_t{0}, uint64_t{1}, uint64_t{1000000007}}) {
      std::vector<bool> seen(W, false);
      for (uint64_t k = 0; k < W; ++k) {
        const uint64_t i = sampler.window(epoch * W + k).first_token;
        ASSERT_FALSE(seen[i]) << "epoch " << epoch << " visits window " << i << " twice";
        seen[i] = true;
      }
    }
  }
}

TEST_F(SamplerTest, SeedChangesOrder) {
  auto shard = make_shard("x.bin", 1001);
  const Sampler a({shard}, 1, 1), b({shard}, 1, 2);
  std::vector<uint64_t> wa, wb, wa_epoch1;
  for (uint64_t q = 0; q < 100; ++q) {
    wa.push_back(a.window(q).first_token);
    wb.push_back(b.window(q).first_token);
    wa_epoch1.push_back(a.window(1000 + q).first_token);
  }
  EXPECT_NE(wa, wb);
  EXPECT_NE(wa, wa_epoch1);
}

TEST_F(SamplerTest, TwoProcessesAgree) {
  make_shard("train_000000.bin", 5000, 0);
  make_shard("train_000001.bin", 777, 50000);
  constexpr uint64_t kIds = 20000;  // several epochs
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child builds its own sampler from the folder: nothing computed by the parent is shared.
    ::close(fds[0]);
    int rc = 0;
    try {
      const Sampler sampler = Sampler::from_directory(dir_, "train", 16, 1234);
      for (uint64_t q = 0; q < kIds && rc == 0; ++q) {
        const auto w = sampler.window(q);
        const uint64_t record[2] = {w.shard, w.first_token};
        if (::write(fds[1], record, sizeof(record)) != sizeof(record)) rc = 2;
      }
    } catch (...) {
      rc = 3;
    }
    ::close(fds[1]);
    ::_exit(rc);
  }
  ::close(fds[1]);
  const Sampler sampler = Sampler::from_directory(dir_, "train", 16, 1234);
  uint64_t mismatches = 0, received = 0;
  for (uint64_t record[2]; received < kIds; ++received) {
    size_t got = 0;
    while (got < sizeof(record)) {
      const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(record) + got, sizeof(record) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got < sizeof(record)) break;
    const auto w = sampler.window(received);
    mismatches += record[0] != w.shard || record[1] != w.first_token;
  }
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(received, kIds);
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(SamplerTest, FromDirectoryFindsAndSortsTheSplit) {
  make_shard("train_000001.bin", 11, 100);
  make_shard("train_000000.bin", 11, 0);
  make_shard("fineweb_train_000002.bin", 11, 200);  // llm.c's naming
  make_shard("val_000000.bin", 11, 900);
  make_shard("trainer_000000.bin", 11, 800);  // "trainer" is not "train"
  std::ofstream(dir_ / "train_notes.txt") << "not a shard";
  fs::create_directory(dir_ / "train_dir.bin");
  fs::create_symlink(dir_ / "nowhere", dir_ / "train_dangling.bin");
  const Sampler train = Sampler::from_directory(dir_, "train", 10, 0);
  ASSERT_EQ(train.num_shards(), 3u);
  EXPECT_EQ(train.shard(0).path().filename(), "fineweb_train_000002.bin");
  EXPECT_EQ(train.shard(1).path().filename(), "train_000000.bin");
  EXPECT_EQ(train.shard(2).path().filename(), "train_000001.bin");
  EXPECT_EQ(train.windows_per_epoch(), 3u);
  const Sampler val = Sampler::from_directory(dir_, "val", 10, 0);
  ASSERT_EQ(val.num_shards(), 1u);
  TokenId out[11];
  val.read(0, out);
  EXPECT_EQ(out[0], 900u);
  EXPECT_EQ(out[10], 910u);
}

TEST_F(SamplerTest, ErrorsNameTheProblem) {
  std::string e = error_of([&] { Sampler::from_directory(dir_, "train", 8, 0); });
  EXPECT_NE(e.find(dir_.string()), std::string::npos) << e;
  EXPECT_NE(e.find("no \"train\" shards"), std::string::npos) << e;

  e = error_of([&] { Sampler::from_directory(dir_ / "nope", "train", 8, 0); });
  EXPECT_NE(e.find("cannot list shard folder"), std::string::npos) << e;

  make_shard("train_000000.bin", 8);
  make_shard("train_000001.bin", 5);
  e = error_of([&] { Sampler::from_directory(dir_, "train", 8, 0); });
  EXPECT_NE(e.find(dir_.string()), std::string::npos) << e;
  EXPECT_NE(e.find("13 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("the 9 tokens that one window of seq_len 8 needs"), std::string::npos) << e;

  e = error_of([&] { Sampler({make_shard("z.bin", 3)}, 8, 0); });
  EXPECT_NE(e.find("z.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("9 tokens"), std::string::npos) << e;

  EXPECT_NE(error_of([] { Sampler({}, 8, 0); }).find("no shards"), std::string::npos);
  EXPECT_NE(error_of([&] { Sampler({make_shard("y.bin", 30)}, 0, 0); }).find("seq_len is 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Sampler::from_directory(dir_, "", 8, 0); }).find("split name"),
            std::string::npos);

  // A corrupt shard in the folder stops the sampler with the shard's own error.
  std::ofstream(dir_ / "train_000002.bin") << "garbage";
  e = error_of([&] { Sampler::from_directory(dir_, "train", 2, 0); });
  EXPECT_NE(e.find("train_000002.bin"), std::string::npos) << e;
}

TEST_F(SamplerTest, GoldenWindowsThroughTheSampler) {
  // W = 1000 windows of T = 1; the sampler's order is KeyedPermutation(1000, seed, epoch).
  const Sampler sampler({make_shard("g.bin", 1001)}, 1, 1234);
  const KeyedPermutation perm(1000, 1234, 2);
  for (uint64_t k = 0; k < 1000; ++k) {
    ASSERT_EQ(sampler.window(2000 + k).first_token, perm(k));
  }
}

}  // namespace
}  // namespace agora
