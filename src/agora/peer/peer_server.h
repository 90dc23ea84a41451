// PeerServer: the serving half of a peer's network side. It answers GetBlob from the BlobStore
// (and, for a hash that is no payload, from the run's data this peer holds: serve/data_mount.h)
// and GetTensor from the published snapshots, to the run's current members only, within limits
// that keep one member (or a stranger) from exhausting the peer:
//   - admission: a request whose authenticated CURVE key is not among the members the
//     coordinator listed most recently (RoundStart members and joiners, Collect members, the
//     holders of a Welcome or Resync), or listed within the last `grace_seconds`, gets the
//     refusal every role gives a key it does not serve (serve::refusal, Refused{kNotAdmitted,
//     may_rejoin}) and no data. The ZAP handshake stays open: membership
//     changes every round, and a message-level check also covers connections made before a
//     member was removed;
//   - sizes: the socket refuses frames above the largest valid request (ZMQ_MAXMSGSIZE), and
//     each request is checked for its kind (a 32-byte hash, a bounded name);
//   - rates: a budget per member key and per connection (serve::RateGate); excess requests are
//     dropped;
//   - data: chunks of the run's data go out at most `data_bytes_per_second` in all (a 1 MiB
//     chunk a member could equally get from the coordinator must not delay payloads); past it
//     the answer is NotFound "busy", and the member asks the coordinator instead;
//   - replies: each snapshot tensor is serialized once and every reply shares those bytes; at
//     most `replies_per_connection` replies wait per connection and `max_bytes_in_flight` bytes
//     in all, beyond which requests are refused;
//   - fairness: serve() reads at most `requests_per_poll` requests (or `seconds_per_poll` of
//     answering) per call (serve::drain), so the I/O thread reaches the coordinator's messages
//     and its heartbeat between batches, whatever the load.
// Every refusal is counted by reason (Refusal, network_counters.h).
//
// Owned by the I/O thread (its socket is that thread's); refusals() is thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "agora/core/token_bucket.h"
#include "agora/net/blob_store.h"
#include "agora/net/curve_socket.h"
#include "agora/peer/network_counters.h"
#include "agora/peer/peer_link.h"
#include "agora/serve/rate_gate.h"

namespace agora::peer {

// The reason of the refusal of a request whose sender is not a current member: the fetcher then
// knows to ask again later (a joiner is listed from the next RoundStart on).
inline constexpr const char* kNotAdmitted = "agora: not a current member of the run";

struct PeerServerLimits {
  // The largest valid request: a GetTensor with a name of kMaxTensorName bytes fits.
  size_t max_request_bytes = 2048;
  size_t max_tensor_name = 1024;
  // A joiner asks one holder for about its share of the model's tensors at once.
  double member_requests_per_second = 64, member_burst = 512;
  double connection_requests_per_second = 64, connection_burst = 512;
  // Refusals are answered (so a joiner knows to retry) at most this often, in all.
  double refusal_replies_per_second = 20;
  // Twice what a fetcher asks of one source at once (PeerNetwork::fetch_batched, 32): beyond it
  // requests are dropped and wait out a timeout.
  int replies_per_connection = 64;
  int64_t max_bytes_in_flight = int64_t{4} << 30;
  // Serialized tensors kept for further requests.
  int64_t reply_cache_bytes = int64_t{1} << 30;
  size_t requests_per_poll = 64;
  double seconds_per_poll = 0.05;  // ... or this long, whichever comes first
  double grace_seconds = 60;  // a member dropped from the newest list may still ask this long
  size_t max_connections_tracked = 4096;
  double data_bytes_per_second = 8.0 * (1 << 20), data_burst_bytes = 4.0 * (1 << 20);
};

class PeerServer {
 public:
  // The snapshot a GetTensor asks for: the parameters after its applied_steps, or the strategy
  // state with its strategy_hash.
  using SnapshotLookup = std::function<std::shared_ptr<const Snapshot>(const wire::GetTensor&)>;
  // Traffic, sent?, bytes: for the peer's byte counters.
  using Count = std::function<void(Traffic, bool, uint64_t)>;
  // The manifest of a strategy state this peer published, by the state's hash (peer_link.h).
  using ManifestLookup = std::function<std::shared_ptr<const std::string>(const std::string&)>;
  // The bytes of a chunk of the run's data by its hash, when this peer holds it. Thread-safe.
  using DataLookup = std::function<std::optional<std::string>(const std::string& hash)>;

  PeerServer(net::Context& context, const net::Identity& identity, const std::string& listen,
             PeerServerLimits limits, SnapshotLookup snapshots, ManifestLookup manifests,
             Count count);

  std::string bound_endpoint() const { return server_.bound_endpoint(); }
  net::Server& socket_owner() { return server_; }

  // The members of a new list: with `replace`, this list is the run's current membership and
  // keys not in it keep only the grace period; otherwise the keys are added (holders, joiners).
  template <typename Members>
  void admit(const Members& members, bool replace, double now) {
    if (replace) end_current(now);
    for (const wire::Member& m : members) admit_key(m.key(), now);
  }
  bool admitted(const std::string& curve_key, double now) const;
  // Serve the run's data this peer holds from now on. Thread-safe (called by the peer's thread
  // once the run's data is known, while the I/O thread serves).
  void serve_data(DataLookup lookup);

  // Reads and answers at most limits.requests_per_poll waiting requests; returns how many.
  size_t serve(const net::BlobStore& blobs, double now);

  std::array<uint64_t, kRefusals> refusals() const;

 private:
  struct Admission {
    bool current = false;
    double until = 0;  // when not current: admitted until then
  };
  void end_current(double now);
  void admit_key(const std::string& ed25519_key, double now);
  void refuse(Refusal why, const std::string& route, const std::string& what, double now);
  void answer(const net::Incoming& in, const net::BlobStore& blobs, double now);
  // The data chunk `hash` if this peer holds it and the data rate allows; data_busy_ says
  // whether the rate was why not.
  std::optional<std::string> data_chunk(const std::string& hash, double now);
  std::shared_ptr<const std::string> tensor_reply(const wire::GetTensor& get);
  void reply(const std::string& route, std::shared_ptr<const std::string> bytes, Traffic kind);

  PeerServerLimits limits_;
  SnapshotLookup snapshots_;
  ManifestLookup manifests_;
  Count count_;
  net::Server server_;
  std::map<std::string, Admission> members_;  // by curve key; bounded by the coordinator's lists
  serve::RateGate member_rates_;              // by curve key (strangers are refused before it)
  serve::RateGate connection_rates_;          // by route
  TokenBucket refusal_replies_;
  struct Cached {
    std::weak_ptr<const Snapshot> snapshot;  // the entry is stale once this snapshot is gone
    std::shared_ptr<const std::string> bytes;
  };
  std::map<std::tuple<uint64_t, std::string, std::string>, Cached> cache_;
  int64_t cache_bytes_ = 0;
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
  std::mutex data_mutex_;
  std::shared_ptr<const DataLookup> data_;  // null until serve_data()
  double data_tokens_ = 0, data_last_ = 0;  // a bucket of bytes, refilled at the data rate
  bool data_busy_ = false;
  std::array<std::atomic<uint64_t>, kRefusals> refused_{};
};

}  // namespace agora::peer
