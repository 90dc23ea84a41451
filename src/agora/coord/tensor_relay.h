// TensorRelay: the coordinator's relay for the model state of members nobody can dial.
//
// A member behind a home router's NAT holds the parameters like any other, but no joiner can
// dial it to fetch them: a run whose every member sits behind NAT could take no joiner. So a
// joiner asks the coordinator instead, one chunk at a time (a GetTensor naming the holder, the
// offset and a length of at most kMaxRelayedChunkBytes); the coordinator forwards the request on
// the connection the holder dialled out, the holder answers with the chunk (a TensorData), and
// the coordinator passes it on to every member that asked for it. Nothing is stored: a chunk
// lives only between the holder's answer and its forwarding. The fetcher checks each tensor it
// assembles against the majority's hash (peer_fetch.cc), so the relay, like the payload relay,
// can lose bytes but never forge them.
//
// Bounds, whatever members send:
//   - a request is taken only from a current member, for a current member marked relayed, for a
//     chunk of at most Limits::max_chunk_bytes and a name of at most Limits::max_name bytes;
//   - at most Limits::per_fetcher requests of one member wait, Limits::max_waiting in all;
//     identical requests are forwarded once and answered together;
//   - at most Limits::per_holder forwarded requests wait for one holder's answer, and forwarding
//     is paced to Limits::bytes_per_second with a burst of Limits::burst_bytes: the
//     coordinator's uplink carries the whole run's control traffic too;
//   - a request not answered within Limits::timeout_seconds gets a NotFound, as does one whose
//     answer does not fit what was asked (a holder lying about sizes);
//   - an answer nobody waits for is dropped and counted.
// Pure logic over messages and connection routes: torch-free, no sockets, one thread; the
// service (service.cc) sends what it returns.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "agora/net/envelope.h"
#include "agora/net/identity.h"

namespace agora::coord {

// A message the service sends: to the connection `route` (a fetcher's), or, when `route` is
// empty, to `member` on its own connection (a holder's).
struct RelayOutgoing {
  std::string route;
  net::PublicKey member;
  wire::Envelope message;
};

class TensorRelay {
 public:
  struct Limits {
    uint64_t max_chunk_bytes = net::kMaxRelayedChunkBytes;
    size_t max_name = 1024;
    size_t per_fetcher = 16;
    size_t per_holder = 16;
    size_t max_waiting = 1024;
    double bytes_per_second = 32e6;
    double burst_bytes = 8.0 * net::kMaxRelayedChunkBytes;
    double timeout_seconds = 30;
  };
  struct Counters {
    uint64_t chunks = 0;       // answered and passed on (once per chunk, whoever waited)
    uint64_t bytes_in = 0;     // tensor bytes from holders
    uint64_t bytes_out = 0;    // tensor bytes to fetchers
    uint64_t refused = 0;      // requests answered NotFound at once (why: last_refusal)
    uint64_t expired = 0;      // requests whose holder did not answer in time
    uint64_t unsolicited = 0;  // answers nobody waited for, or that did not fit the request
  };

  TensorRelay() = default;
  explicit TensorRelay(Limits limits) : limits_(limits) {}

  // A GetTensor naming a holder, from `fetcher` on the connection `route`. `fetcher_current`:
  // the fetcher is a current member; `holder_relayed`: the holder is a current member nobody
  // can dial. Returns the NotFound of a refused request, else nothing (pump() forwards it).
  std::vector<RelayOutgoing> request(const net::PublicKey& fetcher, const std::string& route,
                                     const wire::GetTensor& get, bool fetcher_current,
                                     bool holder_relayed, double now);
  // A TensorData from `holder`: what goes to the members that wait for it.
  std::vector<RelayOutgoing> answer(const net::PublicKey& holder, const wire::TensorData& data,
                                    double now);
  // Forwards the waiting requests the pace and the per-holder bound allow, oldest first, and
  // answers those that waited past the timeout.
  std::vector<RelayOutgoing> pump(double now);

  size_t waiting() const { return chunks_.size(); }
  const Counters& counters() const { return counters_; }
  const std::string& last_refusal() const { return last_refusal_; }
  const Limits& limits() const { return limits_; }

 private:
  // holder, applied_steps, strategy_hash, name, offset, length.
  using Key = std::tuple<net::PublicKey, uint64_t, std::string, std::string, uint64_t, uint64_t>;
  struct Waiter {
    net::PublicKey fetcher;
    std::string route;
  };
  struct Chunk {
    wire::GetTensor request;
    std::vector<Waiter> waiters;
    double asked_at = 0;
    bool forwarded = false;
  };
  static Key key_of(const net::PublicKey& holder, const wire::GetTensor& get);
  std::vector<RelayOutgoing> refuse(const std::string& route, const wire::GetTensor& get,
                                    std::string why);
  // Forgets `it`, returning what its waiters get: NotFound with `why` (empty: nothing).
  std::map<Key, Chunk>::iterator drop(std::map<Key, Chunk>::iterator it,
                                      std::vector<RelayOutgoing>* not_found);

  Limits limits_;
  std::map<Key, Chunk> chunks_;
  std::deque<Key> queue_;  // not yet forwarded, oldest first (may name chunks already dropped)
  std::map<net::PublicKey, size_t> waiting_by_fetcher_;
  std::map<net::PublicKey, size_t> forwarded_by_holder_;
  double tokens_ = -1;  // bytes forwarding may use now; < 0: not started
  double refilled_at_ = 0;
  Counters counters_;
  std::string last_refusal_;
};

}  // namespace agora::coord
