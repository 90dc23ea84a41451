// What a token folder holds, as one hash: the run's data identity.
//
// Every honest member of a run must train on the same tokens: recomputation blames a member
// whose folder differs for work it did honestly, and nothing else would notice. A run config may
// name the identity its data must have (`[data] hash`); each member computes its own folder's
// and refuses to train on other data.
//
// The identity is a small tree, so that a piece of a shard can later be checked on its own:
// each shard (train_*.bin and val_*.bin, by name) is cut into chunks of kChunkBytes, a chunk's
// hash is BLAKE2b-256 of its bytes, a shard's hash is BLAKE2b-256 of its name, its size and its
// chunk hashes, and the folder's hash is BLAKE2b-256 of a version tag and its shards' hashes in
// name order. Same shards, same hash, on any machine; a changed token, a renamed, missing or
// extra shard, a different cut into shards: another hash. meta.json is not part of it (it
// describes the shards; the tokens are what is trained).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

struct ShardIdentity {
  std::string name;
  uint64_t bytes = 0;
  std::vector<std::string> chunk_hashes;  // raw 32-byte BLAKE2b-256, one per chunk
  std::string hash;                       // raw 32 bytes
};

struct DataIdentity {
  static constexpr uint64_t kChunkBytes = uint64_t{1} << 20;
  std::vector<ShardIdentity> shards;
  std::string hash;  // raw 32 bytes

  std::string hex() const;
};

// Reads every shard of `dir` once; an Error names a folder without shards or an unreadable file.
DataIdentity data_identity(const std::filesystem::path& dir);

// Throws an Error that says what to do when `dir`'s identity is not `expected_hex` (the run
// config's data.hash); `setting` names where the expectation came from.
void check_data_identity(const std::filesystem::path& dir, const std::string& expected_hex,
                         const std::string& setting = "data.hash");

// True when `text` is a data hash as written in configs: 64 lowercase hexadecimal digits.
bool is_data_hash(const std::string& text);

// True for the names a token folder's shards have: train_*.bin or val_*.bin, made of letters,
// digits, '_', '-' and '.' only (so a name never leaves the folder it is written to).
bool is_shard_file_name(std::string_view name);

// The hashes the tree is made of, from the parts a manifest carries (data/data_manifest.h):
// a shard's from its name, size and chunk hashes; the folder's from its shards' hashes in order.
std::string shard_hash(const ShardIdentity& shard);
std::string root_hash(const std::vector<ShardIdentity>& shards);
// ceil(bytes / kChunkBytes): how many chunk hashes a shard of `bytes` has.
uint64_t chunk_count(uint64_t bytes);

}  // namespace agora
