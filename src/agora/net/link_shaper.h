// LinkShaper: a TCP proxy that makes a loopback connection behave like a wide-area link.
//
// The kernel these tests and benchmarks run on has no netem, so delay, jitter and loss are
// added here, in user space. A LinkShaper listens on a local port; for every connection it
// accepts it opens one to the target and forwards bytes both ways, each direction shaped by its
// own LinkProfile. A process that should see a slow link connects to the shaper's port instead
// of the real one, e.g. a ZeroMQ peer connects to tcp://127.0.0.1:<shaper.port()>.
//
// What a direction promises, for the bytes read from one side and written to the other:
// - Bytes arrive complete and in order; nothing is dropped, duplicated or reordered.
// - Bandwidth. A token bucket (burst: one segment or 10 ms of rate, whichever is larger) meters
//   the reads, so 20 Mbit/s carries about 2.5 MB/s. The shaper reads no faster than the link
//   drains, so a fast sender feels TCP back-pressure as it would on the real link.
// - Delay. Every byte is released no earlier than delay + U[0, jitter] after the shaper read it;
//   a chunk is never released before the chunk read ahead of it (jitter delays, never reorders).
// - Loss, as TCP experiences it: each segment of kSegmentBytes is lost with probability `loss`,
//   and then it and everything behind it wait one retransmission timeout,
//   max(0.2 s, 2 round trips = 4 * delay), before they are released. Losses within one
//   timeout of each other are recovered together (as TCP with SACK would), so they do not add up.
// - Closing. When a side closes its sending half, what is queued is flushed and then the
//   sending half towards the other side is shut down (the FIN travels on, after the data). A
//   reset or a write error tears the whole connection down.
// Jitter and loss draws come from a splitmix64 stream keyed by (seed, connection number,
// direction), the same on every machine. Which bytes a draw lands on depends on how the
// kernel hands over the data (one draw of jitter per read), so runs are alike, not identical.
//
// Threads: one accepts; each connection has a reader and a writer per direction (four). stop()
// or the destructor shuts every socket down and joins every thread; it does not flush. stats()
// may be called from any thread at any time.
//
// It is a test and benchmark tool: it holds at most max_queued_bytes per direction in memory
// and makes no attempt to scale past tens of connections.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "agora/net/link_profile.h"

struct addrinfo;

namespace agora::net {

struct LinkShaperOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: the kernel picks one; LinkShaper::port() tells which
  std::string target_host = "127.0.0.1";
  uint16_t target_port = 0;
  LinkProfile to_target;  // bytes the connecting client sends to the target
  LinkProfile to_client;  // bytes the target sends back
  // Per direction, bytes read but not yet written. When full the shaper stops reading, which
  // pushes back on the sender; it bounds memory when the link is unlimited or the receiver
  // stalls. Must be at least kSegmentBytes.
  size_t max_queued_bytes = 64u << 20;
};

class LinkShaper {
 public:
  // The unit of loss and the smallest read the token bucket allows (an Ethernet TCP payload).
  static constexpr size_t kSegmentBytes = 1448;

  // Totals over all connections so far (closed ones included).
  struct Stats {
    uint64_t connections_accepted = 0;
    uint64_t connections_open = 0;
    uint64_t connect_failures = 0;  // accepted, but the target could not be reached
    uint64_t bytes_to_target = 0;   // written to the target
    uint64_t bytes_to_client = 0;   // written back to clients
    uint64_t segments_lost_to_target = 0;
    uint64_t segments_lost_to_client = 0;
  };

  // Validates both profiles, resolves the target, binds and listens, and starts accepting.
  // Throws Error when a profile is invalid, the target does not resolve or the listen address
  // cannot be bound. The target is connected per accepted connection: when it refuses, the
  // accepted connection is closed (the client sees EOF) and connect_failures counts it.
  explicit LinkShaper(LinkShaperOptions options);
  // stop().
  ~LinkShaper();
  LinkShaper(const LinkShaper&) = delete;
  LinkShaper& operator=(const LinkShaper&) = delete;

  // The port the shaper listens on.
  uint16_t port() const { return port_; }
  const LinkShaperOptions& options() const { return options_; }
  Stats stats() const;

  // Stops accepting, shuts every connection down without flushing, joins all threads. Idempotent.
  void stop();

 private:
  struct Counters;   // the atomics behind stats()
  class Direction;   // one direction of one connection: its queue, token bucket and draws
  class Connection;  // two sockets, two Directions, four threads

  void accept_loop();
  int connect_to_target();          // a connected socket, or -1 (refused, unreachable, or stopping)
  void reap_connections(bool all);  // joins and frees finished connections, or all of them

  LinkShaperOptions options_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};                 // a byte written to [1] wakes the accept loop
  std::shared_ptr<::addrinfo> target_address_;  // the resolved target, freed with freeaddrinfo
  std::shared_ptr<Counters> counters_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;                               // serialises stop() callers
  std::list<std::unique_ptr<Connection>> connections_;  // touched by the accept thread only
  std::thread accept_thread_;
};

}  // namespace agora::net
