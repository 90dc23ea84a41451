// PeerNetwork: everything a peer does on the network, on one I/O thread beside the training loop.
//
// The thread owns every ZeroMQ socket of the peer (ZeroMQ sockets belong to one thread):
//   - the client connection to the coordinator: messages from the training loop go out through
//     send_to_coordinator(); what the coordinator pushes waits in a queue for
//     next_from_coordinator(); a heartbeat (applied steps, awaited round) goes out every second;
//   - the server (peer_server.h) that answers GetBlob from the BlobStore and GetTensor from the
//     snapshots, to the run's current members only (learned from the coordinator's messages as
//     they pass through this thread), within rate and reply-queue limits;
//   - one client per (member key, endpoint), created on first use, for fetching; closed when
//     idle or when its member left, and at most kMaxClients at once: past that, a request waits
//     until a connection's answer frees one (the idlest is closed for it), it is not refused. Keyed
//     by key too: a member advertising another's endpoint gets a connection of its own (that fails
//     the CURVE handshake, as its key is not the server's) and the honest member stays reachable.
//
// Fetching (peer_fetch.cc). collect() takes a step's commitments and fetches every payload not
// yet held for that step, all at once, each from its author first and then from the other
// members in turn (a request that gets NotFound or no answer within its per-source timeout moves
// to the next source; a late answer from an earlier source is still taken). A fetched payload is
// accepted only when its BLAKE2b hash equals the commitment's, the author's signature over
// (run, step, hash) verifies, and the payload validator (the strategy's layout and step check)
// passes; otherwise it is rejected with a reason naming the author. The Witness goes to the
// coordinator when every payload is held or rejected or out of sources, or at kWitnessShare of
// the run's witness_seconds after collect() was called, whichever is first: one payload nobody
// serves cannot make this peer's Witness late. Fetching goes on after it; what arrives later is
// kept for apply. fetch_state() fetches a model state tensor by tensor, spread over its
// holders, each tensor checked against its hash.
//
// The I/O thread survives zmq errors (counted in io_errors, logged), and reads a bounded number
// of requests per loop so that a flood cannot delay the heartbeat.
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
#include "agora/peer/peer_server.h"

namespace agora::peer {

struct PeerNetworkOptions {
  std::string coordinator;                 // tcp://host:port
  net::PublicKey coordinator_key;          // its ed25519 key
  std::string listen = "tcp://0.0.0.0:*";  // where this peer serves
  // Where fetch latencies go (agora_peer_fetch_duration_seconds); none when null.
  obs::Registry* metrics = nullptr;
  std::string advertise;  // what others dial; "" = the bound endpoint
  // Limits on replies before configure() tells the run's sizes.
  net::DecodeLimits limits;
  // Per source; a payload's is also capped at kSourceShare of the run's witness_seconds.
  double blob_timeout_seconds = 10;
  double tensor_timeout_seconds = 60;
  PeerServerLimits server;
};

// When the Witness goes out at the latest, and the most one source may take, as shares of the
// run's witness_seconds: late enough for two or three sources, early enough that the Witness
// reaches the coordinator in time over a slow link.
inline constexpr double kWitnessShare = 0.65;
inline constexpr double kSourceShare = 0.25;
inline constexpr size_t kMaxClients = 256;
inline constexpr double kClientIdleSeconds = 60;
inline constexpr double kCleanupSeconds = 2;  // how often idle connections are looked for
// A snapshot older than the newest two is kept while a joiner asked for it this recently.
inline constexpr double kSnapshotPinSeconds = 30;

class PeerNetwork final : public PeerLink {
 public:
  PeerNetwork(const net::Identity& identity, PeerNetworkOptions options);
  ~PeerNetwork();
  PeerNetwork(const PeerNetwork&) = delete;
  PeerNetwork& operator=(const PeerNetwork&) = delete;

  // PeerLink (peer_link.h). The endpoint is the advertised one, or the bound one; snapshots
  // are kept for the newest 2 steps published, and one older while a joiner fetches it;
  // fetch_state() asks several holders at once, and the coordinator's relay for those nobody
  // can dial.
  const std::string& endpoint() const override { return endpoint_; }
  net::BlobStore& blobs() override { return blobs_; }
  void configure(LinkSettings settings) override;
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
  void publish_strategy_state(std::shared_ptr<const StrategyState> state, size_t keep) override;
  std::string fetch_strategy_manifest(const std::string& hash, const wire::Member& author,
                                      double timeout_seconds,
                                      const std::atomic<bool>* cancel) override;
  Snapshot fetch_strategy_state(const std::string& hash, const std::vector<std::string>& names,
                                const wire::Member& author, double timeout_seconds,
                                const std::atomic<bool>* cancel) override;
  // The metrics' collector reads them from an HTTP thread.
  NetworkCounters counters() const override;
  void serve_data(std::function<std::optional<std::string>(const std::string&)> lookup) override;

 private:
  // One thing to fetch: a payload (by hash) or a snapshot tensor (by name).
  struct Want {
    std::string key;
    wire::Envelope request;
    std::vector<wire::Member> sources;
    size_t next_source = 0;
    std::string asked;                      // the connection asked now; "" = none
    std::vector<std::string> asked_before;  // earlier sources: a late answer is still taken
    double deadline = 0;
    double timeout = 10;
    double started = 0;      // when the first source was asked
    double retry_at = 0;     // > 0: ask the sources again from then
    bool not_found = false;  // a source answered that it does not hold it
    // A source refused us as a stranger (we are not yet in its member list); when every source
    // did and `retry_refused`, they are asked again a second later (a joiner is listed from the
    // next RoundStart on) until the waiter gives up.
    bool refused = false, retry_refused = false;
    bool done = false, ok = false;
    std::string reason;
    wire::CommitRecord record;  // payloads
    bool manifest = false;      // a strategy state's manifest: a blob checked by its hash alone
    std::string expected_hash;  // tensors
    TensorBytes tensor;         // tensors, once fetched
    uint64_t total_bytes = 0;   // a relayed chunk's: the whole tensor's size, as its holder says
  };
  // A set of wants that finishes together: a step's collection, an ensure(), a state fetch.
  struct Job {
    uint64_t step = 0;
    bool witness = false;
    double witness_at = 0;   // the Witness goes out by then, whatever is still missing
    bool witnessed = false;  // later payloads count as late
    std::vector<Want> wants;
    bool finished = false;   // under mutex_
    bool cancelled = false;  // under mutex_: the waiter gave up
  };
  std::shared_ptr<Job> collect_job(uint64_t step, std::vector<wire::CommitRecord> commits,
                                   const std::vector<wire::Member>& members, bool witness);
  void submit(std::shared_ptr<Job> job);
  void run();
  void loop_once(double& next_heartbeat);
  void pump_commands();
  // True when the message was for the I/O thread alone (a relayed request), not the training loop.
  bool on_coordinator(const wire::Envelope& m);
  // The snapshot a GetTensor names: the parameters after its applied_steps, or the strategy
  // state with its strategy_hash; null when not kept.
  std::shared_ptr<const Snapshot> find_snapshot(const wire::GetTensor& get) EXCLUDES(mutex_);
  // peer_state_relay.cc. The holder's side: a chunk of this peer's state the coordinator asks
  // for on a joiner's behalf (coord/tensor_relay.h), answered on the coordinator connection,
  // the only one that reaches a peer nobody can dial.
  void answer_relayed(const wire::GetTensor& get);
  // The fetcher's side: the tensors `indices` of `state`, chunk by chunk through the
  // coordinator's relay from `holders` (members nobody can dial), each tensor assembled and
  // checked against its hash, a tensor that fails tried with the next holder. Into `out`;
  // throws naming the tensor and why when one cannot be had within `timeout_seconds`.
  void fetch_relayed(const wire::StateRecord& state, std::vector<int> indices,
                     const std::vector<wire::Member>& holders, double timeout_seconds,
                     Snapshot& out) EXCLUDES(mutex_);
  void on_reply(const std::string& source, wire::Envelope&& reply);
  void on_blob(Job& job, Want& want, const std::string& source, wire::Blob& blob, double now);
  void advance(Want& want, double now);
  void expire_wants(double now);
  void finish_jobs(double now);
  // The connection to `member`, opened when there is none; nullptr when kMaxClients are open
  // and every one waits on an answer (a run of more members than that fetches in waves).
  net::Client* client_for(const wire::Member& member);
  // The connections a want not done is asking, and with `earlier_sources` those it asked before
  // (whose late answer it still takes).
  std::set<std::string> waited_on(bool earlier_sources) const;
  // At kMaxClients: closes the idlest connection no want is asking now, if there is one.
  void make_room();
  void close_idle_clients(double now);
  void count(Traffic kind, bool sent, uint64_t bytes);
  void reject(Rejection why);
  void bump(uint64_t NetworkCounters::*field);
  void sync_socket_counters();

  // Blocks until the I/O thread finished `job` or `timeout_seconds` pass; a job given up on is
  // cancelled (the I/O thread drops it). True when it finished.
  // With `cancel`, it gives up as soon as *cancel is true.
  bool wait_for(Job& job, double timeout_seconds, const std::atomic<bool>* cancel = nullptr)
      EXCLUDES(mutex_);
  // Fetches `wants` as jobs of at most `batch` wants, one after another, within
  // `timeout_seconds` in all (wait_for's contract for `cancel`); true when every job finished.
  // A server keeps at most replies_per_connection (64) replies waiting per connection and drops
  // requests beyond them, which then wait out their timeout: a model of more tensors than that,
  // asked of one source at once, never arrived.
  bool fetch_batched(std::vector<Want>& wants, size_t batch, double timeout_seconds,
                     const std::atomic<bool>* cancel = nullptr) EXCLUDES(mutex_);

  // Set at construction, then read-only.
  const net::Identity& identity_;
  PeerNetworkOptions options_;
  std::string endpoint_;
  obs::Histogram* payload_fetch_ = nullptr;
  obs::Histogram* state_fetch_ = nullptr;

  // The I/O thread's alone: the sockets (ZeroMQ sockets belong to one thread) and the jobs in
  // flight. Never locked; the training thread never touches them.
  net::Context context_;
  std::unique_ptr<PeerServer> server_;
  std::unique_ptr<net::Client> coordinator_;
  struct Connection {
    std::unique_ptr<net::Client> client;
    std::string member_key;
    double last_used = 0;
  };
  std::map<std::string, Connection> clients_;  // by connection_id(member): key and endpoint
  std::map<std::string, Connection>::iterator close_client(
      std::map<std::string, Connection>::iterator it);
  // Replies read from the clients and requests given up on a source, ever: what can free a
  // connection.
  uint64_t pool_events_ = 0;
  uint64_t full_at_events_ = UINT64_MAX;  // pool_events_ when make_room() found nothing to close
  std::vector<std::shared_ptr<Job>> jobs_;
  uint64_t dropped_seen_ = 0, dropped_closed_ = 0;  // drops of clients closed since
  std::map<std::string, uint64_t> drops_closed_;
  double next_cleanup_ = 0;

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
  std::map<uint64_t, double> snapshot_used_ GUARDED_BY(mutex_);  // when each was last asked for
  // This peer's strategy states for verifiers, by hash; the newest last in strategy_order_.
  std::map<std::string, std::shared_ptr<const StrategyState>> strategy_states_ GUARDED_BY(mutex_);
  std::deque<std::string> strategy_order_ GUARDED_BY(mutex_);
  LinkSettings settings_ GUARDED_BY(mutex_);
  net::DecodeLimits reply_limits_ GUARDED_BY(mutex_);
  uint64_t applied_steps_ GUARDED_BY(mutex_) = 0;
  uint64_t next_round_ GUARDED_BY(mutex_) = 0;
  // When each recent Collect passed through the I/O thread: the witness deadline counts from
  // there, not from when the training thread got to it.
  std::map<uint64_t, double> collect_arrived_ GUARDED_BY(mutex_);
  NetworkCounters counters_ GUARDED_BY(mutex_);  // the tallies not kept in the atomics below
  // Written by the I/O thread, read by counters() from any thread.
  std::array<std::atomic<uint64_t>, 3> sent_{}, received_{};
  std::array<std::atomic<uint64_t>, 4> rejected_{};

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace agora::peer
