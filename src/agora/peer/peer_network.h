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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agora/core/mutex.h"
#include "agora/net/blob_store.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/obs/metrics.h"
#include "agora/peer/peer_link.h"

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

class PeerNetwork final : public PeerLink {
 public:
  PeerNetwork(const net::Identity& identity, PeerNetworkOptions options);
  ~PeerNetwork();
  PeerNetwork(const PeerNetwork&) = delete;
  PeerNetwork& operator=(const PeerNetwork&) = delete;

  // PeerLink (peer_link.h). The endpoint is the advertised one, or the bound one; snapshots
  // are kept for the newest 2 steps published; fetch_state() asks several holders at once.
  const std::string& endpoint() const override { return endpoint_; }
  net::BlobStore& blobs() override { return blobs_; }
  void configure(std::string run_id, PayloadValidator validator) override;
  void send_to_coordinator(wire::Envelope message) override;
  std::optional<wire::Envelope> next_from_coordinator(double timeout_seconds) override;
  void set_status(uint64_t applied_steps, uint64_t next_round) override;
  void collect(uint64_t step, std::vector<wire::CommitRecord> commits,
               std::vector<wire::Member> members, bool witness) override;
  std::vector<std::string> ensure(uint64_t step, const std::vector<wire::CommitRecord>& set,
                                  std::vector<wire::Member> members,
                                  double timeout_seconds) override;
  void publish_snapshot(uint64_t applied_steps, std::shared_ptr<const Snapshot> snapshot) override;
  Snapshot fetch_state(const wire::StateRecord& state, const std::vector<wire::Member>& holders,
                       double timeout_seconds) override;
  // The metrics' collector reads them from an HTTP thread.
  NetworkCounters counters() const override;

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

  // Blocks until the I/O thread finished `job` or `timeout_seconds` pass; a job given up on is
  // cancelled (the I/O thread drops it). True when it finished.
  bool wait_for(Job& job, double timeout_seconds) EXCLUDES(mutex_);

  // Set at construction, then read-only.
  const net::Identity& identity_;
  PeerNetworkOptions options_;
  std::string endpoint_;
  obs::Histogram* payload_fetch_ = nullptr;
  obs::Histogram* state_fetch_ = nullptr;

  // The I/O thread's alone: the sockets (ZeroMQ sockets belong to one thread) and the jobs in
  // flight. Never locked; the training thread never touches them.
  net::Context context_;
  std::unique_ptr<net::Server> server_;
  std::unique_ptr<net::Client> coordinator_;
  std::map<std::string, std::unique_ptr<net::Client>> clients_;  // by endpoint
  std::vector<std::shared_ptr<Job>> jobs_;
  uint64_t dropped_seen_ = 0;

  // Thread-safe on its own.
  net::BlobStore blobs_;

  // What the two threads hand each other. The I/O thread never sends on a socket with mutex_
  // held, and the training thread never blocks on the network with it held.
  mutable Mutex mutex_;
  std::condition_variable_any arrived_;  // a message from the coordinator, or a job finished
  std::deque<wire::Envelope> from_coordinator_ GUARDED_BY(mutex_);
  std::deque<wire::Envelope> to_coordinator_ GUARDED_BY(mutex_);
  std::deque<std::shared_ptr<Job>> new_jobs_ GUARDED_BY(mutex_);
  std::map<uint64_t, std::shared_ptr<const Snapshot>> snapshots_ GUARDED_BY(mutex_);
  std::string run_id_ GUARDED_BY(mutex_);
  PayloadValidator validator_ GUARDED_BY(mutex_);
  uint64_t applied_steps_ GUARDED_BY(mutex_) = 0;
  uint64_t next_round_ GUARDED_BY(mutex_) = 0;
  NetworkCounters counters_ GUARDED_BY(mutex_);  // the tallies not kept in the atomics below
  // Written by the I/O thread, read by counters() from any thread.
  std::array<std::atomic<uint64_t>, 3> sent_{}, received_{};
  std::array<std::atomic<uint64_t>, 4> rejected_{};

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace agora::peer
