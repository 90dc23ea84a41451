// The data manifest: what a member fetches first, and checks against the run's data hash before
// it trusts a single chunk hash in it.
#include "agora/data/data_manifest.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agora/core/file.h"
#include "agora/data/shard.h"
#include "test_support.h"

namespace agora {
namespace {

class DataManifestTest : public testing::TempDirTest {
 protected:
  // Two shards: train of 1.5 M tokens (3 MiB: three chunks, the last one short) and val.
  DataManifest make() {
    std::vector<TokenId> tokens(1'500'000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>((i * 7919) % 50000);
    write_shard(dir_ / "train_000000.bin", tokens, 1);
    tokens.resize(3000);
    write_shard(dir_ / "val_000000.bin", tokens, 1);
    DataManifest m;
    m.identity = data_identity(dir_);
    m.files["meta.json"] = R"({"vocab_size": 50000})";
    m.files["tokenizer.model"] = std::string(3000, 'x');
    return m;
  }
};

TEST_F(DataManifestTest, RoundTripRecomputesTheFolderHash) {
  const DataManifest m = make();
  const DataManifest back = decode_manifest(encode_manifest(m));
  EXPECT_EQ(back.identity.hex(), m.identity.hex());
  ASSERT_EQ(back.identity.shards.size(), 2u);
  EXPECT_EQ(back.identity.shards[0].chunk_hashes.size(), 3u);
  EXPECT_EQ(back.identity.shards[0].hash, m.identity.shards[0].hash);
  EXPECT_EQ(back.files, m.files);
}

TEST_F(DataManifestTest, AnyChangedByteChangesTheHashOrIsRefused) {
  const DataManifest m = make();
  const std::string bytes = encode_manifest(m);
  // Every byte of every field, flipped: decoding refuses it, or it names other data (so a
  // member comparing with the run's hash refuses it). meta.json is the one part the hash leaves
  // out (data_manifest.h says why): the files come last.
  size_t meta_at = bytes.size() - 4;
  for (const auto& [name, content] : m.files) meta_at -= 2 + name.size() + 4 + content.size();
  for (size_t i = 0; i < meta_at; i += 97) {
    std::string changed = bytes;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    try {
      EXPECT_NE(decode_manifest(changed).identity.hex(), m.identity.hex()) << "byte " << i;
    } catch (const Error&) {
    }
  }
}

TEST_F(DataManifestTest, MalformedManifestsNameTheirFault) {
  const DataManifest m = make();
  const std::string bytes = encode_manifest(m);
  EXPECT_ERROR_WITH(decode_manifest(""), "truncated");
  EXPECT_ERROR_WITH(decode_manifest("agora data manifest v2\n"), "does not start");
  EXPECT_ERROR_WITH(decode_manifest(bytes.substr(0, bytes.size() - 1)), "truncated",
                    "tokenizer.model");
  EXPECT_ERROR_WITH(decode_manifest(bytes.substr(0, 200)), "truncated");
  EXPECT_ERROR_WITH(decode_manifest(bytes + "x"), "1 bytes follow");

  DataManifest escape = m;
  escape.identity.shards[0].name = "../train_000000.bin";
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(escape)), "../train_000000.bin", "letters");
  DataManifest other = m;
  other.identity.shards[1].name = "notes.txt";
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(other)), "notes.txt");
  DataManifest twice = m;
  twice.identity.shards[1] = twice.identity.shards[0];
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(twice)), "once each");
  DataManifest tiny = m;
  tiny.identity.shards[1].bytes = 10;
  tiny.identity.shards[1].chunk_hashes.resize(1);
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(tiny)), "less than the 1024-byte header");
  DataManifest hidden = m;
  hidden.files["../meta.json"] = "{}";
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(hidden)), "../meta.json");
  DataManifest shard_beside = m;
  shard_beside.files["train_000001.bin"] = "";
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(shard_beside)), "train_000001.bin");
  DataManifest none = m;
  none.identity.shards.clear();
  EXPECT_ERROR_WITH(decode_manifest(encode_manifest(none)), "0 shards");
}

}  // namespace
}  // namespace agora
