// A token folder's identity: the same tokens give the same hash, anything else another.
#include "agora/data/data_identity.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "agora/core/error.h"
#include "agora/core/file.h"

namespace agora {
namespace {
namespace fs = std::filesystem;

class DataIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("agora_identity_test_" + std::to_string(getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A folder with shards of these contents, named train_000000.bin ... and val_000000.bin.
  fs::path folder(const std::string& name, const std::vector<std::string>& train,
                  const std::string& val = "validation tokens") {
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    for (size_t i = 0; i < train.size(); ++i) {
      write_file_atomic(dir / fmt::format("train_{:06}.bin", i), train[i]);
    }
    write_file_atomic(dir / "val_000000.bin", val);
    write_file_atomic(dir / "meta.json", "{}");
    return dir;
  }

  static std::string bytes(size_t n, char seed) {
    std::string out(n, '\0');
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(seed + i * 7 + i / 251);
    return out;
  }

  fs::path root_;
};

TEST_F(DataIdentityTest, SameTokensSameHashWhateverTheMetadata) {
  const auto a = folder("a", {bytes(3'000'000, 1), bytes(1000, 2)});
  const auto b = folder("b", {bytes(3'000'000, 1), bytes(1000, 2)});
  write_file_atomic(b / "meta.json", R"({"tokenizer": "other words"})");
  write_file_atomic(b / "notes.txt", "not a shard");
  const DataIdentity identity = data_identity(a);
  EXPECT_EQ(identity.hex(), data_identity(b).hex());
  EXPECT_TRUE(is_data_hash(identity.hex()));
  ASSERT_EQ(identity.shards.size(), 3u);
  EXPECT_EQ(identity.shards[0].name, "train_000000.bin");
  EXPECT_EQ(identity.shards[0].chunk_hashes.size(), 3u);  // 3,000,000 bytes in 1 MiB chunks
  EXPECT_EQ(identity.shards[2].name, "val_000000.bin");
  EXPECT_NO_THROW(check_data_identity(b, identity.hex()));
}

TEST_F(DataIdentityTest, OneChangedByteChangesTheHashAndOnlyItsChunk) {
  const std::string shard = bytes(3'000'000, 1);
  std::string changed = shard;
  changed[2'500'000] ^= 1;
  const DataIdentity a = data_identity(folder("a", {shard}));
  const DataIdentity b = data_identity(folder("b", {changed}));
  EXPECT_NE(a.hex(), b.hex());
  EXPECT_EQ(a.shards[0].chunk_hashes[0], b.shards[0].chunk_hashes[0]);
  EXPECT_EQ(a.shards[0].chunk_hashes[1], b.shards[0].chunk_hashes[1]);
  EXPECT_NE(a.shards[0].chunk_hashes[2], b.shards[0].chunk_hashes[2]);
  EXPECT_EQ(a.shards[1].hash, b.shards[1].hash);  // the validation shard is the same
}

TEST_F(DataIdentityTest, NamesCutsAndExtraShardsCount) {
  const std::string one = bytes(5000, 3), two = bytes(7000, 4);
  const std::string base = data_identity(folder("base", {one, two})).hex();
  EXPECT_NE(base, data_identity(folder("joined", {one + two})).hex());
  EXPECT_NE(base, data_identity(folder("extra", {one, two, "x"})).hex());
  EXPECT_NE(base, data_identity(folder("swapped", {two, one})).hex());
  EXPECT_NE(base, data_identity(folder("other_val", {one, two}, "other")).hex());
  const fs::path renamed = folder("renamed", {one, two});
  fs::rename(renamed / "train_000001.bin", renamed / "train_000002.bin");
  EXPECT_NE(base, data_identity(renamed).hex());
}

TEST_F(DataIdentityTest, AFolderOfOtherDataIsRefusedNamingBothHashes) {
  const auto a = folder("a", {bytes(100, 1)});
  const auto b = folder("b", {bytes(100, 2)});
  const std::string expected = data_identity(a).hex();
  try {
    check_data_identity(b, expected);
    FAIL() << "other data was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find(data_identity(b).hex()), std::string::npos) << message;
    EXPECT_NE(message.find("data.hash"), std::string::npos) << message;
  }
}

TEST_F(DataIdentityTest, AFolderWithoutShardsIsAnError) {
  fs::create_directories(root_ / "empty");
  EXPECT_THROW(data_identity(root_ / "empty"), Error);
  EXPECT_THROW(data_identity(root_ / "missing"), Error);
  EXPECT_FALSE(is_data_hash(std::string(64, 'A')));
  EXPECT_FALSE(is_data_hash("abc"));
}

}  // namespace
}  // namespace agora
