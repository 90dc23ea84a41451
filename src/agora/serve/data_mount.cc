#include "agora/serve/data_mount.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/data/chunk_source.h"
#include "agora/data/data_manifest.h"
#include "agora/serve/data_mount_detail.h"
#include "agora/serve/poll.h"

namespace agora::serve {
namespace fs = std::filesystem;
using data_mount_detail::Clock;
using data_mount_detail::fetch_manifest;
using data_mount_detail::get_blob;
using data_mount_detail::now_seconds;
using data_mount_detail::seconds_since;
using data_mount_detail::split_not_found;

class DataMount::Core : public ChunkSource {
 public:
  Core(DataMountOptions options, DataManifest manifest, std::unique_ptr<net::Context> context,
       const net::Identity& identity, std::unique_ptr<net::Client> client)
      : o_(std::move(options)),
        manifest_(std::move(manifest)),
        context_(std::move(context)),
        identity_(identity) {
    sources_.push_back(Source{{o_.endpoint, o_.server_key}, std::move(client)});
    const auto& shards = manifest_.identity.shards;
    for (uint32_t s = 0; s < shards.size(); ++s) {
      for (uint64_t c = 0; c < shards[s].chunk_hashes.size(); ++c) {
        places_[shards[s].chunk_hashes[c]].emplace_back(s, c);
      }
    }
  }

  ~Core() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Creates or reopens every shard file; what an earlier run fetched and still hashes right is
  // kept.
  void lay_out() {
    const auto& shards = manifest_.identity.shards;
    std::set<std::string> names;
    for (const auto& s : shards) names.insert(s.name);
    fs::create_directories(o_.cache_dir);
    for (const auto& entry : fs::directory_iterator(o_.cache_dir)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".bin") && !names.contains(name)) {
        fail(
            "data cache {} holds {}, which is not a shard of the run's data {}; a reader of the "
            "folder would train on it: give the cache an empty folder",
            o_.cache_dir.string(), name, o_.data_hash);
      }
    }
    std::string chunk(DataIdentity::kChunkBytes, '\0');
    for (uint32_t s = 0; s < shards.size(); ++s) {
      const fs::path path = o_.cache_dir / shards[s].name;
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) fail("cannot open data cache file {}: {}", path.string(), std::strerror(errno));
      fds_.push_back(fd);
      held_.emplace_back(shards[s].chunk_hashes.size(), 0);
      std::error_code ec;
      const uint64_t size = fs::file_size(path, ec);
      if (ec || size != shards[s].bytes) {
        // Holes where nothing was fetched: the file has its full size from the start, so a
        // reader's map of it never changes size.
        if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(shards[s].bytes)) != 0) {
          fail("cannot size data cache file {}: {}", path.string(), std::strerror(errno));
        }
        continue;
      }
      for (uint64_t c = 0; c < held_[s].size(); ++c) {
        const uint64_t n = chunk_size(s, c);
        const ssize_t got =
            ::pread(fd, chunk.data(), n, static_cast<off_t>(c * DataIdentity::kChunkBytes));
        if (got == static_cast<ssize_t>(n) &&
            blake2b256_bytes(std::string_view(chunk.data(), n)) == shards[s].chunk_hashes[c]) {
          held_[s][c] = 1;
          ++stats_.chunks_cached;
        }
      }
    }
    for (const auto& v : held_) stats_.chunks += v.size();
    for (const auto& s : shards) stats_.bytes += s.bytes;
    stats_.chunks_held = stats_.chunks_cached;
    for (const auto& [name, bytes] : manifest_.files) write_file_atomic(o_.cache_dir / name, bytes);
  }

  void start() {
    worker_ = std::thread([this] { run(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void ensure(const std::string& name, uint64_t begin, uint64_t end) override {
    const auto& shards = manifest_.identity.shards;
    const auto it = std::find_if(shards.begin(), shards.end(),
                                 [&](const ShardIdentity& s) { return s.name == name; });
    if (it == shards.end()) {
      fail("data cache {}: {} is not a shard of the run's data", o_.cache_dir.string(), name);
    }
    const uint32_t s = static_cast<uint32_t>(it - shards.begin());
    if (end <= begin) return;
    if (end > it->bytes) {
      fail("data cache {}: bytes [{}, {}) of {} are past its end ({} bytes)", o_.cache_dir.string(),
           begin, end, name, it->bytes);
    }
    const uint64_t first = begin / DataIdentity::kChunkBytes;
    const uint64_t last = (end - 1) / DataIdentity::kChunkBytes;
    std::unique_lock lock(mutex_);
    bool waiting = false;
    for (uint64_t c = first; c <= last; ++c) {
      if (!held_[s][c]) {
        demanded_.emplace_back(s, c);
        failed_.erase({s, c});  // an earlier failure (of the prefetch, say) is asked anew
        waiting = true;
      }
    }
    if (!waiting) return;
    const Clock::time_point start = Clock::now();
    changed_.notify_all();
    changed_.wait(lock, [&] {
      if (stopping_) return true;
      for (uint64_t c = first; c <= last; ++c) {
        if (!held_[s][c] && !failed_.contains({s, c})) return false;
      }
      return true;
    });
    stats_.waited_seconds += seconds_since(start);
    for (uint64_t c = first; c <= last; ++c) {
      if (held_[s][c]) continue;
      if (stopping_) fail("data cache {}: closed while {} was read", o_.cache_dir.string(), name);
      fail("could not fetch chunk {} of {} (bytes {}..{}) from {}: {}", c, name,
           c * DataIdentity::kChunkBytes, c * DataIdentity::kChunkBytes + chunk_size(s, c),
           o_.endpoint, failed_.at({s, c}));
    }
  }

  DataMountStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  bool wait_complete(double seconds) const {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
      return stopping_ || stats_.chunks_held == stats_.chunks;
    }) && stats_.chunks_held == stats_.chunks;
  }

  const DataMountOptions& options() const { return o_; }

 private:
  using Place = std::pair<uint32_t, uint64_t>;
  struct Ask {
    Place place;
    double first_sent = 0;  // a chunk is given up on after attempts x request_seconds in all
    double sent = 0;        // when last sent
    double retry_at = 0;    // a busy answer: send again at this time (0 = not waiting)
    int failures = 0;       // asks unanswered or answered with other bytes (busy is neither)
    size_t source = 0;      // sources_[0] is the server, the others members
    bool peer_tried = false;
    std::string last_error;
  };

  uint64_t chunk_size(uint32_t s, uint64_t c) const {
    const uint64_t bytes = manifest_.identity.shards[s].bytes;
    return std::min<uint64_t>(DataIdentity::kChunkBytes, bytes - c * DataIdentity::kChunkBytes);
  }
  const std::string& hash_of(const Place& p) const {
    return manifest_.identity.shards[p.first].chunk_hashes[p.second];
  }
  bool asked(const Place& p) const {
    const auto it = asks_.find(hash_of(p));
    return it != asks_.end();
  }

  // The next chunk to ask for: a reader's first, then (prefetching) the next missing one.
  std::optional<Place> next_wanted() {
    while (!demanded_.empty()) {
      const Place p = demanded_.front();
      demanded_.pop_front();
      if (!held_[p.first][p.second] && !asked(p)) {
        failed_.erase(p);  // a new read asks anew
        return p;
      }
    }
    if (!o_.prefetch) return std::nullopt;
    for (; fill_shard_ < held_.size(); ++fill_shard_, fill_chunk_ = 0) {
      for (; fill_chunk_ < held_[fill_shard_].size(); ++fill_chunk_) {
        const Place p{fill_shard_, fill_chunk_};
        if (!held_[p.first][p.second] && !asked(p) && !failed_.contains(p)) {
          ++fill_chunk_;
          return p;
        }
      }
    }
    return std::nullopt;
  }

  // A member to ask first (not distrusted, not resting), or the server (0).
  size_t pick_source(double now) {
    std::vector<size_t> usable;
    for (size_t i = 1; i < sources_.size(); ++i) {
      if (!sources_[i].distrusted && sources_[i].resting_until <= now) usable.push_back(i);
    }
    return usable.empty() ? 0 : usable[next_peer_++ % usable.size()];
  }

  // Sends ask `a` again to the server: a member did not hold the chunk, was busy, silent or
  // wrong. Not a failure: the server has not been asked yet.
  static void to_server(Ask& a, double now) {
    a.source = 0;
    a.retry_at = now;
  }

  // Called with the lock held: what to send now, and to which source.
  std::vector<std::pair<std::string, size_t>> plan(double now) {
    std::vector<std::pair<std::string, size_t>> send;
    for (auto it = asks_.begin(); it != asks_.end();) {
      Ask& a = it->second;
      const bool due = a.retry_at > 0 && now >= a.retry_at;
      const double wait = a.source == 0 ? o_.request_seconds : o_.peer_request_seconds;
      const bool timed_out = a.retry_at == 0 && now - a.sent >= wait;
      if (!due && !timed_out) {
        ++it;
        continue;
      }
      if (timed_out && a.source != 0) {
        sources_[a.source].resting_until = now + 10;  // silent: ask others for a while
        to_server(a, now);
      } else if (timed_out) {
        ++a.failures;
        a.last_error = fmt::format("no answer within {:.0f} s", o_.request_seconds);
      }
      const bool too_long = now - a.first_sent >= o_.attempts * o_.request_seconds;
      if (a.failures >= o_.attempts || too_long) {
        failed_[a.place] = fmt::format("{} ({} asks)", a.last_error, a.failures);
        it = asks_.erase(it);
        changed_.notify_all();
        continue;
      }
      a.sent = now;
      a.retry_at = 0;
      send.emplace_back(it->first, a.source);
      ++it;
    }
    while (asks_.size() < static_cast<size_t>(o_.in_flight)) {
      const auto p = next_wanted();
      if (!p) break;
      Ask& a = asks_[hash_of(*p)];
      a.place = *p;
      a.first_sent = a.sent = now;
      a.source = pick_source(now);
      a.peer_tried = a.source != 0;
      send.emplace_back(hash_of(*p), a.source);
    }
    return send;
  }

  // Called with the lock held: message `m` from sources_[from].
  void receive(const wire::Envelope& m, size_t from, double now) {
    const bool member = from != 0;
    if (m.has_blob()) {
      const auto it = asks_.find(m.blob().hash());
      // Late (already held, given up, or asked of another source since) or never asked.
      if (it == asks_.end() || it->second.source != from) return;
      Ask& a = it->second;
      const std::string& data = m.blob().data();
      const uint64_t want = chunk_size(a.place.first, a.place.second);
      if (data.size() != want || blake2b256_bytes(data) != it->first) {
        ++stats_.refused;
        a.last_error =
            data.size() != want
                ? fmt::format("the answer had {} bytes, the chunk has {}", data.size(), want)
                : "the answer's bytes are not the run's (their hash is not the chunk's)";
        if (member) {
          sources_[from].distrusted = true;  // a member that lies once is never asked again
          to_server(a, now);
        } else {
          ++a.failures;
          a.retry_at = now;  // ask again at once
        }
        return;
      }
      write_chunk(a.place, data);
      // Every place with the same bytes (a repeated chunk) is filled by the one answer.
      for (const Place& p : places_.at(it->first)) {
        if (!held_[p.first][p.second]) write_chunk(p, data);
      }
      stats_.bytes_fetched += data.size();
      if (member) stats_.bytes_from_peers += data.size();
      asks_.erase(it);
      changed_.notify_all();
      return;
    }
    if (m.has_not_found()) {
      const auto [hash, why] = split_not_found(m.not_found().what());
      const bool busy = why.starts_with("busy");
      if (busy) ++stats_.busy;
      for (auto& [h, a] : asks_) {
        if (a.source != from || (!hash.empty() && h != hash)) continue;
        if (member) {
          to_server(a, now);  // it does not hold the chunk (yet), or is busy: the server has it
          continue;
        }
        a.last_error = "the server answered: " + why;
        // Busy is the server pacing us: not an attempt lost, but the wait is bounded all the
        // same (too_long in plan()).
        a.retry_at = now + (busy ? 0.25 : o_.request_seconds);
        if (!busy) ++a.failures;
      }
      return;
    }
    if (m.has_refused()) {
      if (member) {
        // Not (yet) a member in its eyes: a joiner is listed from the next round on.
        sources_[from].resting_until = now + 10;
        for (auto& [h, a] : asks_) {
          if (a.source == from) to_server(a, now);
        }
        return;
      }
      for (auto& [h, a] : asks_) a.last_error = "the server refused: " + m.refused().reason();
    }
  }

  void write_chunk(const Place& p, const std::string& data) {
    const off_t offset = static_cast<off_t>(p.second * DataIdentity::kChunkBytes);
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fds_[p.first], data.data() + done, data.size() - done,
                                 offset + static_cast<off_t>(done));
      if (n <= 0) {
        failed_[p] = fmt::format("cannot write the data cache: {}", std::strerror(errno));
        return;
      }
      done += static_cast<size_t>(n);
    }
    held_[p.first][p.second] = 1;
    ++stats_.chunks_held;
  }

  // A line every 5 s while chunks arrive, and one when the folder is whole.
  void report(double now) {
    if (!o_.progress) return;
    const bool whole = stats_.chunks_held == stats_.chunks;
    if (whole) {
      if (!reported_whole_ && stats_.bytes_fetched > 0) {
        o_.progress(
            fmt::format("data: all {:.1f} MiB held, {:.1f} MiB fetched ({:.1f} from other "
                        "members)",
                        static_cast<double>(stats_.bytes) / (1 << 20),
                        static_cast<double>(stats_.bytes_fetched) / (1 << 20),
                        static_cast<double>(stats_.bytes_from_peers) / (1 << 20)));
      }
      reported_whole_ = true;
      return;
    }
    const uint64_t fetched = stats_.bytes_fetched;
    if (now - last_report_ < 5 || fetched == reported_bytes_) return;
    const double rate = (fetched - reported_bytes_) / std::max(1e-9, now - last_report_);
    const double held =
        static_cast<double>(stats_.chunks_held) / std::max<uint64_t>(1, stats_.chunks);
    const double left =
        static_cast<double>(stats_.chunks - stats_.chunks_held) * DataIdentity::kChunkBytes;
    std::string line = fmt::format(
        "data: {:.1f} of {:.1f} MiB held ({:.0f}%), {:.2f} MiB/s", held * stats_.bytes / (1 << 20),
        static_cast<double>(stats_.bytes) / (1 << 20), 100 * held, rate / (1 << 20));
    if (rate > 0) line += fmt::format(", about {:.0f} s to go", left / rate);
    last_report_ = now;
    reported_bytes_ = fetched;
    o_.progress(line);
  }

  // Called with the lock held: the members to ask become those set_peers() named last. The
  // server stays sources_[0]; asks on a member that leaves go to the server.
  void sync_peers(double now) {
    if (!peers_changed_) return;
    peers_changed_ = false;
    std::vector<DataPeer> wanted = peers_;
    if (wanted.size() > o_.max_peers) wanted.resize(o_.max_peers);
    for (size_t i = sources_.size() - 1; i >= 1; --i) {
      if (std::find(wanted.begin(), wanted.end(), sources_[i].peer) != wanted.end()) continue;
      for (auto& [h, a] : asks_) {
        if (a.source == i)
          to_server(a, now);
        else if (a.source > i)
          --a.source;
      }
      sources_.erase(sources_.begin() + static_cast<ptrdiff_t>(i));
    }
    for (const DataPeer& p : wanted) {
      const bool known = std::any_of(sources_.begin() + 1, sources_.end(),
                                     [&](const Source& s) { return s.peer == p; });
      if (known) continue;
      try {
        sources_.push_back(
            Source{p, std::make_unique<net::Client>(
                          *context_, identity_, p.endpoint, p.key,
                          net::DecodeLimits{net::kMaxControlBytes, size_t{4} << 20})});
      } catch (const Error&) {
        // An endpoint ZeroMQ will not dial: that member is simply not asked.
      }
    }
  }

  void run() {
    last_report_ = now_seconds();
    std::vector<zmq::pollitem_t> items;
    for (;;) {
      std::vector<std::pair<std::string, size_t>> send;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        sync_peers(now_seconds());
        send = plan(now_seconds());
      }
      for (const auto& [hash, source] : send) sources_[source].client->send(get_blob(hash));
      items.clear();
      for (const Source& source : sources_) {
        items.push_back({source.client->socket().handle(), 0, ZMQ_POLLIN, 0});
      }
      poll(items, std::chrono::milliseconds(20));
      std::lock_guard lock(mutex_);
      for (size_t i = 0; i < sources_.size(); ++i) {
        while (auto m = sources_[i].client->recv()) receive(*m, i, now_seconds());
      }
      report(now_seconds());
    }
  }

 public:
  std::optional<std::string> held_chunk(const std::string& hash) const {
    Place place;
    {
      std::lock_guard lock(mutex_);
      const auto it = places_.find(hash);
      if (it == places_.end()) return std::nullopt;
      const auto held = std::find_if(it->second.begin(), it->second.end(),
                                     [&](const Place& p) { return held_[p.first][p.second]; });
      if (held == it->second.end()) return std::nullopt;
      place = *held;
    }
    // Written once and never again: reading it needs no lock.
    std::string bytes(chunk_size(place.first, place.second), '\0');
    const ssize_t got = ::pread(fds_[place.first], bytes.data(), bytes.size(),
                                static_cast<off_t>(place.second * DataIdentity::kChunkBytes));
    if (got != static_cast<ssize_t>(bytes.size())) return std::nullopt;
    return bytes;
  }

  void set_peers(std::vector<DataPeer> peers) {
    std::lock_guard lock(mutex_);
    if (peers == peers_) return;
    peers_ = std::move(peers);
    peers_changed_ = true;
  }

 private:
  DataMountOptions o_;
  DataManifest manifest_;
  struct Source {
    DataPeer peer;
    std::unique_ptr<net::Client> client;
    double resting_until = 0;  // silent or refusing: not asked before then
    bool distrusted = false;   // answered with other bytes: never asked again
  };
  std::unique_ptr<net::Context> context_;  // outlives the clients
  net::Identity identity_;
  std::vector<Source> sources_;  // [0] the server; the worker's alone once it runs
  size_t next_peer_ = 0;
  std::map<std::string, std::vector<Place>> places_;  // chunk hash -> where it goes
  std::vector<int> fds_;
  std::thread worker_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<std::vector<uint8_t>> held_;  // per shard, per chunk
  std::deque<Place> demanded_;
  std::vector<DataPeer> peers_;  // as set_peers() named them
  bool peers_changed_ = false;
  std::map<std::string, Ask> asks_;  // by chunk hash
  std::map<Place, std::string> failed_;
  uint32_t fill_shard_ = 0;
  uint64_t fill_chunk_ = 0;
  DataMountStats stats_;
  double last_report_ = 0;
  uint64_t reported_bytes_ = 0;
  bool reported_whole_ = false;
};

DataMount::DataMount(std::shared_ptr<Core> core) : core_(std::move(core)) {}

std::unique_ptr<DataMount> DataMount::open(const net::Identity& identity,
                                           DataMountOptions options) {
  if (!is_data_hash(options.data_hash)) {
    fail("cannot fetch the run's data: its data hash \"{}\" is not 64 lowercase hex digits",
         options.data_hash);
  }
  if (options.attempts < 1 || options.in_flight < 1 || !(options.request_seconds > 0)) {
    fail("data fetching needs attempts >= 1, in_flight >= 1 and request_seconds > 0");
  }
  const std::string root = hex_decode(options.data_hash);
  // A Blob of a chunk is 1 MiB; the manifest of a very large folder may be more.
  auto context = std::make_unique<net::Context>();  // a client's only: nobody dials a mount
  auto client =
      std::make_unique<net::Client>(*context, identity, options.endpoint, options.server_key,
                                    net::DecodeLimits{net::kMaxControlBytes, size_t{64} << 20});
  DataManifest manifest = fetch_manifest(*client, options, root);
  auto core = std::make_shared<Core>(std::move(options), std::move(manifest), std::move(context),
                                     identity, std::move(client));
  core->lay_out();
  core->start();
  std::unique_ptr<DataMount> mount(new DataMount(core));
  mount_chunk_source(core->options().cache_dir, core);
  return mount;
}

DataMount::~DataMount() {
  unmount_chunk_source(core_->options().cache_dir);
  core_->stop();
}

const fs::path& DataMount::folder() const {
  return core_->options().cache_dir;
}

DataMountStats DataMount::stats() const {
  return core_->stats();
}

bool DataMount::wait_complete(double seconds) const {
  return core_->wait_complete(seconds);
}

void DataMount::set_peers(std::vector<DataPeer> peers) {
  core_->set_peers(std::move(peers));
}

std::optional<std::string> DataMount::held_chunk(const std::string& hash) const {
  return core_->held_chunk(hash);
}

}  // namespace agora::serve
