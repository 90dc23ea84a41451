#include "agora/serve/data_service.h"

#include <fmt/format.h>

#include <algorithm>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/data_meta.h"
#include "agora/net/envelope.h"

namespace agora::serve {
namespace fs = std::filesystem;

DataService::DataService(const fs::path& dir, DataLimits limits) : limits_(limits) {
  // One chunk's reply must fit a full bucket, or a member could never be answered.
  limits_.burst_bytes = std::max(limits_.burst_bytes, 2.0 * DataIdentity::kChunkBytes);
  manifest_.identity = data_identity(dir);
  // Beside the shards: meta.json and the tokenizer file it names in the folder, if any.
  uint64_t side_bytes = 0;
  const auto add = [&](const std::string& name) {
    if (!is_side_file_name(name) || !fs::is_regular_file(dir / name)) return;
    manifest_.files[name] = read_file(dir / name);
    side_bytes += manifest_.files[name].size();
  };
  add("meta.json");
  try {
    const fs::path tokenizer = has_data_meta(dir) ? read_data_meta(dir).tokenizer_spec : "";
    std::error_code ec;
    if (fs::is_regular_file(tokenizer, ec) && fs::equivalent(tokenizer.parent_path(), dir, ec)) {
      add(tokenizer.filename().string());
    }
  } catch (const Error&) {
    // A meta.json agora cannot read is served as it is; members reading it will say why.
  }
  if (side_bytes > kMaxManifestFileBytes) {
    fail("{}: meta.json and the tokenizer have {} bytes; a served folder's may have at most {}",
         dir.string(), side_bytes, kMaxManifestFileBytes);
  }
  const auto& shards = manifest_.identity.shards;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    files_.push_back(MappedFile::open(dir / shards[s].name, "shard"));
    if (files_.back().bytes().size() != shards[s].bytes) {
      fail("shard {} changed while it was hashed; serve a folder nobody is writing to",
           (dir / shards[s].name).string());
    }
    for (uint64_t c = 0; c < shards[s].chunk_hashes.size(); ++c) {
      chunks_.try_emplace(shards[s].chunk_hashes[c], Place{s, c});
    }
  }
  wire::Envelope reply;
  reply.mutable_blob()->set_hash(manifest_.identity.hash);
  reply.mutable_blob()->set_data(encode_manifest(manifest_));
  manifest_reply_ = std::make_shared<const std::string>(net::encode_envelope(reply));
  limits_.burst_bytes = std::max(limits_.burst_bytes, 2.0 * manifest_reply_->size());
}

std::optional<std::string> DataService::chunk(const std::string& hash) const {
  const auto place = chunks_.find(hash);
  if (place == chunks_.end()) return std::nullopt;
  return chunk_bytes(place->second);
}

bool DataService::holds(const wire::GetBlob& request) const {
  return request.hash() == manifest_.identity.hash || chunks_.contains(request.hash());
}

std::string DataService::chunk_bytes(const Place& place) const {
  const auto bytes = files_[place.shard].bytes();
  const uint64_t begin = place.chunk * DataIdentity::kChunkBytes;
  const uint64_t end = std::min<uint64_t>(bytes.size(), begin + DataIdentity::kChunkBytes);
  return std::string(reinterpret_cast<const char*>(bytes.data()) + begin, end - begin);
}

DataService::Taker& DataService::taker(const std::string& member, double now) {
  if (!takers_.contains(member) && takers_.size() >= limits_.max_members) {
    // Forget the one silent longest (what is still queued to it leaves the total: the table, not
    // the queue, is what this bounds).
    auto oldest = std::min_element(
        takers_.begin(), takers_.end(),
        [](const auto& a, const auto& b) { return a.second.last_seen < b.second.last_seen; });
    takers_.erase(oldest);
  }
  Taker& t = takers_[member];
  t.last_seen = now;
  return t;
}

bool DataService::answer(net::Server& server, const std::string& member, const std::string& route,
                         const wire::GetBlob& request, double now) {
  const bool manifest = request.hash() == manifest_.identity.hash;
  const auto place = chunks_.find(request.hash());
  if (!manifest && place == chunks_.end()) return false;
  Taker& t = taker(member, now);
  const auto busy = [&](const std::string& why) {
    ++counters_.busy;
    wire::Envelope reply;
    // The hash first, so a member with several asks out knows which one must wait.
    reply.mutable_not_found()->set_what(request.hash() + " " + why);
    server.send(route, reply);
  };
  if (t.queued->load() >= limits_.queued_bytes) {
    busy(fmt::format("busy: {} bytes are still queued to you; ask again when they arrived",
                     t.queued->load()));
    return true;
  }
  if (now - total_summed_at_ >= 0.05 || now < total_summed_at_) {
    total_queued_ = 0;
    for (const auto& [key, other] : takers_) total_queued_ += other.queued->load();
    total_summed_at_ = now;
  }
  if (total_queued_ >= limits_.total_queued_bytes) {
    busy(fmt::format("busy: {} MiB are queued to members; ask again in a moment",
                     total_queued_ >> 20));
    return true;
  }
  std::shared_ptr<const std::string> bytes = manifest_reply_;
  if (!manifest) {
    wire::Envelope reply;
    reply.mutable_blob()->set_hash(request.hash());
    reply.mutable_blob()->set_data(chunk_bytes(place->second));
    bytes = std::make_shared<const std::string>(net::encode_envelope(reply));
  }
  // A bucket of bytes: refilled at the member's rate, spent by each reply's size.
  const double size = static_cast<double>(bytes->size());
  if (!t.started) {
    t.tokens = limits_.burst_bytes;
    t.last = now;
    t.started = true;
  }
  t.tokens = std::min(limits_.burst_bytes,
                      t.tokens + std::max(0.0, now - t.last) * limits_.bytes_per_second);
  t.last = std::max(t.last, now);
  if (t.tokens < size) {
    busy(fmt::format("busy: past your share of {:.1f} MiB/s of data; ask again in a moment",
                     limits_.bytes_per_second / (1 << 20)));
    return true;
  }
  t.tokens -= size;
  if (server.send_shared(route, bytes, t.queued) != net::Server::SendResult::kQueued) return true;
  total_queued_ += static_cast<int64_t>(bytes->size());
  (manifest ? counters_.manifests : counters_.chunks) += 1;
  counters_.bytes += bytes->size();
  return true;
}

}  // namespace agora::serve
