#include "agora/net/blob_store.h"

namespace agora::net {

void BlobStore::put(const std::string& hash, std::string bytes, uint64_t step) {
  std::lock_guard lock(mutex_);
  blobs_[hash] = Entry{std::move(bytes), step};
}

std::optional<std::string> BlobStore::get(const std::string& hash) const {
  std::lock_guard lock(mutex_);
  const auto it = blobs_.find(hash);
  if (it == blobs_.end()) return std::nullopt;
  return it->second.bytes;
}

bool BlobStore::contains(const std::string& hash) const {
  std::lock_guard lock(mutex_);
  return blobs_.count(hash) > 0;
}

bool BlobStore::holds(const std::string& hash, uint64_t step) const {
  std::lock_guard lock(mutex_);
  const auto it = blobs_.find(hash);
  return it != blobs_.end() && it->second.step == step;
}

void BlobStore::prune_below(uint64_t step) {
  std::lock_guard lock(mutex_);
  for (auto it = blobs_.begin(); it != blobs_.end();) {
    it = it->second.step < step ? blobs_.erase(it) : std::next(it);
  }
}

size_t BlobStore::size() const {
  std::lock_guard lock(mutex_);
  return blobs_.size();
}

}  // namespace agora::net
