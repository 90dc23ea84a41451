// ParamFeed and ParamFollower: how a server publishes parameters to the members that follow
// them (the asynchronous run's workers, the RL learner's rollout workers), and how a member
// follows. The messages are GetParams (member -> server) and Params (server -> member).
//
// The server publishes versions 1, 2, ..., each as a payload that moves the previous version to
// it (train/published_policy.h makes them: int8 deltas of a published copy, so every follower
// holds the server's published parameters bit for bit). A member asks with the version it holds.
// When the feed still keeps the deltas from there, it gets the chain of them; otherwise (it is
// new, fell further behind than the kept deltas, or asks for a whole copy after a hash mismatch)
// it gets the whole newest version, encoded once a version and shared by every member asking.
//
// What waits in the send queue is bounded, per member and for all members together. One reply
// may always wait per member, so a member is never starved by the others' backlog; beyond it, an
// ask is answered only as far as the limits allow and the member asks again, from what it then
// holds, when its wait runs out. Nothing a member sends makes the feed keep more: the deltas kept
// are the newest `deltas_kept`, the whole copy is the newest version's.
//
// The follower applies each Params through the role's `apply`, which sets the parameters and
// returns their state hash, and compares it with the hash the server sent: a mismatch (a delta
// applied to other parameters, or corrupted bytes) or bytes `apply` refuses make it ask for a
// whole copy next.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agora/net/curve_socket.h"
#include "agora/serve/member_client.h"

namespace agora::serve {

class ParamFeed {
 public:
  struct Limits {
    int64_t bytes_in_flight = int64_t{1} << 30;   // every member's queued replies together
    int64_t bytes_per_member = int64_t{64} << 20;  // one member's, beyond its first reply
    size_t deltas_kept = 8;                        // the newest versions a chain can start from
  };

  // `whole` returns the whole payload of the newest version; it is called at most once a version,
  // when a member first needs it. The feed starts at `version` (0, or where a restart resumed)
  // with no deltas: members holding an older version get a whole copy.
  ParamFeed(Limits limits, std::function<std::string()> whole, uint64_t version,
            std::string state_hash);

  // Starts again at `version` with no deltas (the server restored an earlier save).
  void reset(uint64_t version, std::string state_hash);
  // Version `version` (which must be version() + 1), moved to by `delta` from version().
  void publish(uint64_t version, std::string delta, std::string state_hash);

  uint64_t version() const { return version_; }
  const Limits& limits() const { return limits_; }

  struct Answer {
    int64_t delta_bytes = 0;  // queued to the member
    int64_t whole_bytes = 0;
    bool busy = false;  // a reply did not fit the limits: the member asks again
    // The version the queued replies bring the member to (0 when none was queued): what a
    // server may believe the member holds, whatever it later claims.
    uint64_t reached = 0;
  };
  // Answers a member's ask on `server` at `route`. `in_flight` counts this member's queued
  // bytes; `queued` is every member's together.
  Answer answer(net::Server& server, const std::string& route, const wire::GetParams& ask,
                const std::shared_ptr<std::atomic<int64_t>>& in_flight, int64_t queued);

 private:
  Limits limits_;
  std::function<std::string()> make_whole_;
  uint64_t version_;
  std::string state_hash_;
  std::map<uint64_t, std::shared_ptr<const std::string>> deltas_;  // version -> encoded Params
  std::shared_ptr<const std::string> whole_;                       // of version_, once asked
};

class ParamFollower {
 public:
  // Sets the parameters from one Params (throws Error when its bytes do not fit them) and
  // returns their state hash (raw 32 bytes).
  using Apply = std::function<std::string(const wire::Params&)>;
  // Hears each Params that came: its encoded size, whether it was applied and its hash matched,
  // and why `apply` refused its bytes (empty when it applied them).
  using Heard = std::function<void(const wire::Params&, int64_t bytes, bool ok,
                                   const std::string& error)>;

  // Follows from `version` (the parameters the member starts with), through `client`.
  ParamFollower(MemberClient& client, uint64_t version, Apply apply, Heard heard = {});

  // Brings the parameters to `target` or newer: false when six asks, each waiting at most
  // `wait_seconds` for the next reply, did not (the server is busy, gone, or sends bad bytes).
  bool sync(uint64_t target, double wait_seconds = 10.0);
  // The parameters are no longer the server's version(): the next ask is for a whole copy
  // (the server went back to an older version, after a restart).
  void forget();

  uint64_t version() const { return version_; }
  int64_t bytes() const { return bytes_; }
  int64_t hash_mismatches() const { return hash_mismatches_; }

 private:
  MemberClient& client_;
  uint64_t version_;
  Apply apply_;
  Heard heard_;
  bool whole_next_ = false;
  int64_t bytes_ = 0, hash_mismatches_ = 0;
};

}  // namespace agora::serve
