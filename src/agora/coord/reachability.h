// Prober: can a member be dialled at the endpoint it advertises? The coordinator asks for each
// member that joins, and again every `retry_seconds` while the answer is no (a router's port may
// be opened later).
//
// A probe is a CURVE connection to the endpoint that expects the member's own key, and one
// GetBlob for a hash nobody holds. Any answer proves both that the endpoint is open and that the
// member holds its key: a member's server answers a stranger (the coordinator is not a member)
// with a NotFound, and the handshake fails against any other key. No answer within
// `timeout_seconds` means unreachable: a home peer behind NAT, a firewalled port, an address
// that is not its own. Its payloads then go through the coordinator's relay (relay.h).
//
// The probes run on a thread of their own with their own sockets (ZeroMQ sockets belong to one
// thread), at most kMaxInFlight at once; probe() and results() are thread-safe. At most one
// probe per member waits, so a stream of joins cannot grow the queue past the members.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "agora/core/mutex.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"

namespace agora::coord {

struct ProbeResult {
  net::PublicKey key;
  std::string endpoint;
  bool reachable = false;
  double seconds = 0;  // until the answer, or the timeout
};

class Prober {
 public:
  static constexpr size_t kMaxInFlight = 64;

  Prober(net::Context& context, const net::Identity& identity, double timeout_seconds);
  ~Prober();
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // Asks whether `key` answers at `endpoint`; replaces a waiting probe of the same key.
  void probe(const net::PublicKey& key, const std::string& endpoint) EXCLUDES(mutex_);
  // The answers since the last call.
  std::vector<ProbeResult> results() EXCLUDES(mutex_);

 private:
  void run();

  net::Context& context_;
  const net::Identity& identity_;
  const double timeout_seconds_;
  Mutex mutex_;
  std::map<net::PublicKey, std::string> waiting_ GUARDED_BY(mutex_);
  std::vector<ProbeResult> done_ GUARDED_BY(mutex_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace agora::coord
