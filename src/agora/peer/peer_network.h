// PeerNetwork: everything a peer does on the network, on one I/O thread beside the training loop.
//
// The thread owns every ZeroMQ socket of the peer (ZeroMQ sockets belong to one thread):
//   - the client connection to the coordinator: messages from the training loop go out through
//     send_to_coordinator(); what the coordinator pushes waits in a queue for
//     next_from_coordinator(); a heartbeat (applied steps, awaited round) goes out every second;
//   - the server that answers GetBlob from the BlobStore and GetTensor from the snapshots, to
//     any admitted peer: every holder re-serves what it has;
//   - one client per other member, created on first use, for fetching.
//
// Fetching. collect() takes a step's commitments and fetches every payload not yet held, all at
// once, each from its author first and then from the other members in turn (a request that gets
// NotFound or no answer within its timeout moves to the next source). A fetched payload is
// accepted only when its BLAKE2b hash equals the commitment's, the author's signature over
// (run, step, hash) verifies, and the payload validator (the strategy's layout check) passes;
// otherwise it is rejected with a reason naming the author. When every payload is held or
// rejected or out of sources, the thread sends the coordinator a Witness. fetch_state() fetches
// a model state tensor by tensor, spread over its holders, each tensor checked against its hash.
//
// Training never waits on the network except where it must: before applying a finalized set
// (ensure()) and when joining (fetch_state()).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agora/net/blob_store.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/obs/metrics.h"

namespace agora::peer {

struct PeerNetworkOptions {
  std::string coordinator;             // tcp://host:port
  net::PublicKey coordinator_key;      // its ed25519 key
  std::string listen = "tcp://0.0.0.0:*";  // where this peer serves
  // Where fetch latencies go (agora_peer_fetch_duration_seconds); none when null.
  obs::Registry* metrics = nullptr;
  std::string advertise;               // what others dial; "" = the bound endpoint
  net::DecodeLimits limits;
  double blob_timeout_seconds = 10;
  double tensor_timeout_seconds = 60;
};

// One tensor of a snapshot, as served: dtype, shape and little-endian bytes.
struct TensorBytes {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};
using Snapshot = std::map<std::string, TensorBytes>;

// What travels: payloads (GetBlob, Blob), model state (GetTensor, TensorData) and control (the
// coordinator's connection, NotFound answers).
enum class Traffic { kPayload = 0, kState = 1, kControl = 2 };
inline constexpr const char* kTrafficNames[] = {"payload", "state", "control"};

// Why a fetched payload was refused: its bytes did not hash to the commitment (that source is
// skipped, the next is asked), the author's signature did not verify, the strategy's layout
// check failed, or no source served it.
enum class Rejection { kHash = 0, kSignature = 1, kLayout = 2, kUnavailable = 3 };
inline constexpr const char* kRejectionNames[] = {"hash", "signature", "layout", "unavailable"};

struct NetworkCounters {
  uint64_t bytes_sent = 0, bytes_received = 0;                 // every kind
  std::array<uint64_t, 3> sent_by_kind{}, received_by_kind{};  // indexed by Traffic
  uint64_t payloads_fetched = 0, payloads_rejected = 0, dropped_messages = 0;
  std::array<uint64_t, 4> rejected_by_reason{};       // indexed by Rejection
  std::map<std::string, uint64_t> dropped_by_reason;  // net::Server::drops_by_reason() tokens
};

class PeerNetwork {
 public:
  PeerNetwork(const net::Identity& identity, PeerNetworkOptions options);
  ~PeerNetwork();
  PeerNetwork(const PeerNetwork&) = delete;
  PeerNetwork& operator=(const PeerNetwork&) = delete;

  // The endpoint other peers dial (advertise, or the bound one).
  const std::string& endpoint() const { return endpoint_; }
  net::BlobStore& blobs() { return blobs_; }

  // Set once the run is known: the run id commitments are signed under, and a check of a
  // payload's content ("" = valid, else the reason).
  void configure(std::string run_id, std::function<std::string(std::string_view)> validator);

  void send_to_coordinator(wire::Envelope message);
  // The next message from the coordinator, waiting up to `timeout_seconds`.
  std::optional<wire::Envelope> next_from_coordinator(double timeout_seconds);
  // What the heartbeat reports.
  void set_status(uint64_t applied_steps, uint64_t next_round);

  // Fetches and verifies the payloads of `commits`; sends a Witness for `step` when done if
  // `witness`. Returns at once.
  void collect(uint64_t step, std::vector<wire::CommitRecord> commits,
               std::vector<wire::Member> members, bool witness);
  // Blocks until every payload of `set` is held (fetching what is missing from `members`) or
  // `timeout_seconds` pass; returns the hashes still missing.
  std::vector<std::string> ensure(uint64_t step, const std::vector<wire::CommitRecord>& set,
                                  std::vector<wire::Member> members, double timeout_seconds);

  // Keeps `snapshot` (the parameters after `applied_steps` steps) to serve; keeps the newest 2.
  void publish_snapshot(uint64_t applied_steps, std::shared_ptr<const Snapshot> snapshot);
  // Fetches the tensors of `state` from `holders`, several at once, each verified against its
  // hash. Throws Error when a tensor cannot be had from any holder within the timeout.
  Snapshot fetch_state(const wire::StateRecord& state, const std::vector<wire::Member>& holders,
                       double timeout_seconds);

  // Thread-safe: the metrics' collector reads them from an HTTP thread.
  NetworkCounters counters() const;

 private:
  struct Want;
  struct Job;
  std::shared_ptr<Job> collect_job(uint64_t step, std::vector<wire::CommitRecord> commits,
                                   const std::vector<wire::Member>& members, bool witness);
  void submit(std::shared_ptr<Job> job);
  void run();
  void pump_commands();
  void serve(net::Incoming&& in);
  void on_reply(const std::string& source, wire::Envelope&& reply);
  void advance(Want& want, double now);
  void finish_jobs();
  net::Client& client_for(const wire::Member& member);
  void count(Traffic kind, bool sent, uint64_t bytes);
  void reject(Rejection why);
  void sync_socket_counters();

  const net::Identity& identity_;
  PeerNetworkOptions options_;
  net::Context context_;
  std::unique_ptr<net::Server> server_;
  std::unique_ptr<net::Client> coordinator_;
  std::map<std::string, std::unique_ptr<net::Client>> clients_;  // by endpoint
  std::string endpoint_;
  net::BlobStore blobs_;

  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<wire::Envelope> from_coordinator_;
  std::deque<wire::Envelope> to_coordinator_;
  std::deque<std::shared_ptr<Job>> new_jobs_;
  std::map<uint64_t, std::shared_ptr<const Snapshot>> snapshots_;
  std::string run_id_;
  std::function<std::string(std::string_view)> validator_;
  uint64_t applied_steps_ = 0, next_round_ = 0;
  NetworkCounters counters_;
  // Updated without mutex_ (advance() runs with and without it held).
  std::array<std::atomic<uint64_t>, 3> sent_{}, received_{};
  std::array<std::atomic<uint64_t>, 4> rejected_{};
  uint64_t dropped_seen_ = 0;  // I/O thread only
  obs::Histogram* payload_fetch_ = nullptr;
  obs::Histogram* state_fetch_ = nullptr;

  std::vector<std::shared_ptr<Job>> jobs_;  // I/O thread only
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace agora::peer
