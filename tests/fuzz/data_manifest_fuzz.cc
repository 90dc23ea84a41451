// Fuzzes decode_manifest: any bytes must be refused with an Error or decode into a manifest whose
// shards all have valid names, sizes and one hash per chunk, and which encodes back to the same
// bytes (the layout has one encoding, so a member's check of the hash sees what was sent).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agora/core/error.h"
#include "agora/data/data_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const agora::DataManifest m = agora::decode_manifest(bytes);
    for (const auto& shard : m.identity.shards) {
      if (!agora::is_shard_file_name(shard.name)) std::abort();
      if (shard.chunk_hashes.size() != agora::chunk_count(shard.bytes)) std::abort();
    }
    if (agora::encode_manifest(m) != bytes) std::abort();
  } catch (const agora::Error&) {
    // Refused with a message: the expected outcome for most inputs.
  }
  return 0;
}
