// What the coordinator's service sends each member, and how (issue 41, docs/scaling.md).
//
// A member's messages go out on the connection its latest message arrived on (its route). A
// message the state machine shares among many members (Outgoing.shared) is encoded once per
// batch and handed to ZeroMQ without a copy; a member's own part follows it in the same frame.
// A RoundStart is held back while the last one to that member for the same step still waits
// in ZeroMQ's queue: a member waiting behind that queue asks again, and at 10,000 simulated
// members those copies were half of what the coordinator sent. A member not connected since
// this process started (a resumed run) gets its newest messages when it first writes.
//
// Every map is keyed by a member the state machine knows; forget_others() drops the rest.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agora/coord/state_machine.h"
#include "agora/net/curve_socket.h"

namespace agora::coord {

class Outbox {
 public:
  explicit Outbox(net::Server& server) : server_(server) {}

  // Sends a batch's messages in order; `between` runs before each after the first (the
  // service's crash point between two sends).
  void send(std::vector<Outgoing>& messages, const std::function<void()>& between);
  // `key` wrote on `route`: its messages go there from now on, starting with what waited.
  void connected(const net::PublicKey& key, const std::string& route);
  // Where `key`'s messages go; nullptr when it has not written since this process started.
  const std::string* route(const net::PublicKey& key) const;
  // Drops every entry of a key that is not in `members`.
  void forget_others(const std::map<net::PublicKey, MemberRecord>& members);
  // RoundStarts not sent because the last one to that member still waited in the queue.
  uint64_t round_starts_held() const { return round_starts_held_; }

 private:
  // Bytes handed to ZeroMQ for a member and not yet taken to be written, and the step of the
  // last RoundStart among them.
  struct Queued {
    std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
    uint64_t round_start_step = UINT64_MAX;
  };
  static constexpr size_t kMaxUndelivered = 16;  // the protocol re-asks for anything older

  net::Server& server_;
  std::map<net::PublicKey, std::string> route_of_;
  std::map<net::PublicKey, std::deque<wire::Envelope>> undelivered_;
  std::map<net::PublicKey, Queued> queued_;
  uint64_t round_starts_held_ = 0;
};

}  // namespace agora::coord
