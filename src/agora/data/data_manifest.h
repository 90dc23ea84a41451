// A data manifest: what a member needs to fetch a run's token folder piece by piece and check
// every piece on its own.
//
// It is the folder's data identity (data/data_identity.h) written out: each shard's name, size
// and chunk hashes, plus the small files beside them (meta.json, the tokenizer it names). A
// member that knows the run's data hash (the
// run config's [data] hash) fetches the manifest from anyone, decodes it here and keeps it only
// when the hash recomputed from its shards is the run's; from then on every 1 MiB chunk is
// checked against its own hash. So neither the server nor another member can feed it other
// tokens than everyone else trains on. The files beside the shards (which tokenizer made them)
// are not covered by the hash: they come from the coordinator, which the member already trusts
// for the run config, and the tokens alone are what is trained.
//
// Layout (integers little-endian):
//   "agora data manifest v1\n"
//   u32 shard count (1 .. kMaxManifestShards)
//   per shard, in strictly increasing name order:
//     u16 name length (1 .. 255), the name (data_identity.h's is_shard_file_name),
//     u64 bytes (at least the 1024-byte header), chunk_count(bytes) x 32-byte chunk hashes
//   u32 file count (at most kMaxManifestFiles), per file in strictly increasing name order:
//     u16 name length, the name (letters,
//     digits, '_', '-', '.'; not a shard's, no leading '.'), u32 length, the bytes; the files'
//     bytes together at most kMaxManifestFileBytes
// and nothing after. decode_manifest() refuses anything else with an Error that names the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "agora/data/data_identity.h"

namespace agora {

inline constexpr uint32_t kMaxManifestShards = 65536;
inline constexpr uint32_t kMaxManifestFiles = 8;
inline constexpr uint32_t kMaxManifestFileBytes = 16 << 20;

struct DataManifest {
  DataIdentity identity;  // hash: recomputed from the shards, never taken from the bytes
  std::map<std::string, std::string> files;  // name -> bytes: meta.json, the tokenizer
};

// Whether `name` may be a file beside the shards: a plain name that is not a shard's.
bool is_side_file_name(std::string_view name);

std::string encode_manifest(const DataManifest& manifest);
// Decodes untrusted bytes; the identity's hashes are recomputed from what they name.
DataManifest decode_manifest(std::string_view bytes);

}  // namespace agora
