#include "agora/data/chunk_source.h"

#include <atomic>
#include <map>
#include <mutex>

namespace agora {
namespace fs = std::filesystem;

namespace {

struct Mounts {
  std::mutex mutex;
  std::map<fs::path, std::shared_ptr<ChunkSource>> by_dir;
  std::atomic<size_t> count{0};  // read without the lock: the common case has no mount at all
};

Mounts& mounts() {
  static Mounts* m = new Mounts();  // never destroyed: readers may run during exit
  return *m;
}

fs::path key(const fs::path& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  return p.has_filename() ? p : p.parent_path();  // "dir/" and "dir" are one folder
}

}  // namespace

void mount_chunk_source(const fs::path& dir, std::shared_ptr<ChunkSource> source) {
  Mounts& m = mounts();
  std::lock_guard lock(m.mutex);
  m.by_dir[key(dir)] = std::move(source);
  m.count = m.by_dir.size();
}

void unmount_chunk_source(const fs::path& dir) {
  Mounts& m = mounts();
  std::lock_guard lock(m.mutex);
  m.by_dir.erase(key(dir));
  m.count = m.by_dir.size();
}

std::shared_ptr<ChunkSource> chunk_source_for(const fs::path& file) {
  Mounts& m = mounts();
  if (m.count.load(std::memory_order_acquire) == 0) return nullptr;
  const fs::path dir = key(file).parent_path();
  std::lock_guard lock(m.mutex);
  const auto it = m.by_dir.find(dir);
  return it == m.by_dir.end() ? nullptr : it->second;
}

}  // namespace agora
