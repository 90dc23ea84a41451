// ChunkSource: a token folder that fills in as it is read.
//
// A member without the run's data mounts a source on an empty cache folder (serve/data_mount.h
// fetches from the run). The folder then holds every shard at its full size, with the bytes not
// yet fetched left as holes, and everything that reads shards (ShardReader, so every Sampler of
// every role) asks the mounted source for the bytes it is about to read: the first read of a
// piece waits for it, later reads find it on disk. A folder nothing is mounted on is read as it
// is, at no cost beyond one atomic load.
//
// Promise of a source: ensure() returns only when the bytes asked for are on disk and are the
// run's (checked against their hashes), or throws Error; so a reader never sees a hole or bytes
// that another member does not also train on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace agora {

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Returns once bytes [begin, end) of shard file `name` in the mounted folder are present and
  // checked; throws Error when they cannot be had (the message says from where and why).
  // Thread-safe.
  virtual void ensure(const std::string& name, uint64_t begin, uint64_t end) = 0;
};

// Mounts `source` on folder `dir` (replacing any earlier mount there) for this process.
void mount_chunk_source(const std::filesystem::path& dir, std::shared_ptr<ChunkSource> source);
void unmount_chunk_source(const std::filesystem::path& dir);
// The source mounted on the folder that holds `file`, or null.
std::shared_ptr<ChunkSource> chunk_source_for(const std::filesystem::path& file);

}  // namespace agora
