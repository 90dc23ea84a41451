#include "agora/data/data_identity.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kVersion = "agora data identity v1";

std::string digest(Blake2bHasher& hasher) {
  const auto bytes = hasher.finish();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string u64_bytes(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

ShardIdentity shard_identity(const fs::path& path) {
  ShardIdentity shard;
  shard.name = path.filename().string();
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) fail("cannot read shard {}: {}", path.string(), std::strerror(errno));
  std::string chunk(DataIdentity::kChunkBytes, '\0');
  for (;;) {
    const size_t got = std::fread(chunk.data(), 1, chunk.size(), file);
    if (got == 0) break;
    shard.bytes += got;
    shard.chunk_hashes.push_back(blake2b256_bytes(std::string_view(chunk.data(), got)));
  }
  const bool failed = std::ferror(file);
  std::fclose(file);
  if (failed) fail("cannot read shard {}", path.string());
  shard.hash = shard_hash(shard);
  return shard;
}

}  // namespace

std::string shard_hash(const ShardIdentity& shard) {
  Blake2bHasher hasher;
  hasher.update(shard.name);
  hasher.update(std::string_view("\0", 1));
  hasher.update(u64_bytes(shard.bytes));
  for (const auto& h : shard.chunk_hashes) hasher.update(h);
  return digest(hasher);
}

std::string root_hash(const std::vector<ShardIdentity>& shards) {
  Blake2bHasher hasher;
  hasher.update(kVersion);
  for (const auto& shard : shards) hasher.update(shard.hash);
  return digest(hasher);
}

uint64_t chunk_count(uint64_t bytes) {
  return bytes / DataIdentity::kChunkBytes + (bytes % DataIdentity::kChunkBytes != 0 ? 1 : 0);
}

bool is_shard_file_name(std::string_view name) {
  if (!(name.starts_with("train_") || name.starts_with("val_")) || !name.ends_with(".bin")) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

std::string DataIdentity::hex() const {
  return hex_encode(hash);
}

DataIdentity data_identity(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail("data folder {} does not exist", dir.string());
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && is_shard_file_name(entry.path().filename().string())) {
      shards.push_back(entry.path());
    }
  }
  if (shards.empty()) {
    fail("data folder {} holds no shards (train_*.bin, val_*.bin); make one with agora tokenize",
         dir.string());
  }
  std::sort(shards.begin(), shards.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  DataIdentity identity;
  for (const auto& path : shards) identity.shards.push_back(shard_identity(path));
  identity.hash = root_hash(identity.shards);
  return identity;
}

bool is_data_hash(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

void check_data_identity(const fs::path& dir, const std::string& expected_hex,
                         const std::string& setting) {
  const std::string found = data_identity(dir).hex();
  if (found != expected_hex) {
    fail(
        "data folder {} holds other tokens than the run's: its hash is {}, the run's {} is {}; "
        "get the run's token folder (or make it with the same agora tokenize command) and check "
        "it with `agora data hash DIR`",
        dir.string(), found, setting, expected_hex);
  }
}

}  // namespace agora
