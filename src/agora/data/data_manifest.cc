#include "agora/data/data_manifest.h"

#include <algorithm>

#include "agora/core/byte_reader.h"
#include "agora/core/error.h"
#include "agora/data/shard.h"

namespace agora {
namespace {

constexpr std::string_view kMagic = "agora data manifest v1\n";
constexpr std::string_view kWhere = "data manifest";

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

}  // namespace

bool is_side_file_name(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name.front() != '.' && !name.ends_with(".bin") &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
         });
}

std::string encode_manifest(const DataManifest& manifest) {
  std::string out(kMagic);
  put_le(out, manifest.identity.shards.size(), 4);
  for (const ShardIdentity& shard : manifest.identity.shards) {
    put_le(out, shard.name.size(), 2);
    out += shard.name;
    put_le(out, shard.bytes, 8);
    for (const std::string& h : shard.chunk_hashes) out += h;
  }
  put_le(out, manifest.files.size(), 4);
  for (const auto& [name, bytes] : manifest.files) {
    put_le(out, name.size(), 2);
    out += name;
    put_le(out, bytes.size(), 4);
    out += bytes;
  }
  return out;
}

DataManifest decode_manifest(std::string_view bytes) {
  ByteReader in(bytes);
  const uint8_t* magic = in.take(kMagic.size(), kWhere, "its first line");
  if (std::string_view(reinterpret_cast<const char*>(magic), kMagic.size()) != kMagic) {
    fail("data manifest: it does not start with \"agora data manifest v1\"");
  }
  const uint64_t count = in.uint(4, kWhere, "the shard count");
  if (count == 0 || count > kMaxManifestShards) {
    fail("data manifest: {} shards; a manifest names 1 to {}", count, kMaxManifestShards);
  }
  DataManifest manifest;
  std::vector<ShardIdentity>& shards = manifest.identity.shards;
  for (uint64_t i = 0; i < count; ++i) {
    ShardIdentity shard;
    const uint64_t name_bytes = in.uint(2, kWhere, "a shard name's length");
    if (name_bytes == 0 || name_bytes > 255) {
      fail("data manifest: shard {} has a name of {} bytes; names have 1 to 255", i, name_bytes);
    }
    shard.name.assign(reinterpret_cast<const char*>(in.take(name_bytes, kWhere, "a shard name")),
                      name_bytes);
    if (!is_shard_file_name(shard.name)) {
      fail(
          "data manifest: shard {} is named \"{}\"; a shard is train_*.bin or val_*.bin, of "
          "letters, digits, '_', '-' and '.'",
          i, shard.name);
    }
    if (!shards.empty() && !(shards.back().name < shard.name)) {
      fail(
          "data manifest: shard \"{}\" follows \"{}\"; shards are listed once each, in name "
          "order",
          shard.name, shards.back().name);
    }
    shard.bytes = in.uint(8, kWhere, "a shard's size");
    if (shard.bytes < kShardHeaderBytes) {
      fail("data manifest: shard {} has {} bytes, less than the {}-byte header of a shard",
           shard.name, shard.bytes, kShardHeaderBytes);
    }
    const uint64_t chunks = chunk_count(shard.bytes);
    if (chunks > in.remaining() / 32) {
      fail(
          "data manifest: truncated: shard {} of {} bytes needs {} chunk hashes, only {} bytes "
          "remain",
          shard.name, shard.bytes, chunks, in.remaining());
    }
    shard.chunk_hashes.reserve(chunks);
    for (uint64_t c = 0; c < chunks; ++c) {
      shard.chunk_hashes.emplace_back(reinterpret_cast<const char*>(in.take(32, kWhere, "a hash")),
                                      32);
    }
    shard.hash = shard_hash(shard);
    shards.push_back(std::move(shard));
  }
  const uint64_t files = in.uint(4, kWhere, "the file count");
  if (files > kMaxManifestFiles) {
    fail("data manifest: {} files beside the shards; at most {}", files, kMaxManifestFiles);
  }
  uint64_t file_bytes = 0;
  for (uint64_t i = 0; i < files; ++i) {
    const uint64_t name_bytes = in.uint(2, kWhere, "a file name's length");
    const std::string name(
        reinterpret_cast<const char*>(in.take(name_bytes, kWhere, "a file name")), name_bytes);
    if (!is_side_file_name(name)) {
      fail(
          "data manifest: a file beside the shards is named \"{}\"; allowed are plain names of "
          "letters, digits, '_', '-' and '.' that are no shard's",
          name);
    }
    const uint64_t size = in.uint(4, kWhere, "a file's length");
    file_bytes += size;
    if (file_bytes > kMaxManifestFileBytes) {
      fail("data manifest: the files beside the shards have more than {} bytes",
           kMaxManifestFileBytes);
    }
    std::string bytes(reinterpret_cast<const char*>(in.take(size, kWhere, name)), size);
    if (!manifest.files.empty() && !(manifest.files.rbegin()->first < name)) {
      fail("data manifest: file \"{}\" follows \"{}\"; files are listed once each, in name order",
           name, manifest.files.rbegin()->first);
    }
    manifest.files.emplace(name, std::move(bytes));
  }
  if (in.remaining() != 0) {
    fail("data manifest: {} bytes follow its end", in.remaining());
  }
  manifest.identity.hash = root_hash(shards);
  return manifest;
}

}  // namespace agora
