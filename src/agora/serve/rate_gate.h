// RateGate: a message budget for each member and one for all strangers together, for the roles
// whose membership is decided elsewhere: the data-parallel coordinator (its state machine), a
// peer's server (the coordinator's lists), a swarm replica's stage fetches (the swarm view), a
// SAPO node (its configured peers). serve::Members keeps the same two budgets inside its table.
//
// Promises:
//   - a member's messages draw from a bucket of its own (`member` rate and burst), so one member
//     flooding cannot take another's share;
//   - every key that is not a member draws from ONE shared bucket (`strangers`), so a crowd of
//     fresh keys costs at most what the strangers' budget allows and leaves no entry behind;
//   - the map of buckets holds at most `max_tracked` keys: a full bucket is the same as none and
//     is forgotten first; if every tracked bucket is in use, the gate starts over (each key gets
//     one fresh burst: a bounded, one-off cost, never unbounded memory);
//   - what was dropped is counted per key until report() hands the counts to the role's log.
//
// Times are seconds on any monotonic clock, passed in (tests drive them). One thread owns a gate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agora/core/token_bucket.h"

namespace agora::serve {

struct Rate {
  double per_second = 0, burst = 0;
};

class RateGate {
 public:
  RateGate(Rate member, Rate strangers, size_t max_tracked = 4096)
      : member_(member), strangers_rate_(strangers), max_tracked_(max_tracked) {}

  // The members' budget, for a role that learns it later (it depends on the model's size).
  void set_member_rate(Rate member) { member_ = member; }

  // Charges one message from `key` to its budget: the key's own when `member`, else the one all
  // strangers share. False, and counted against the key, when over it.
  bool take(const std::string& key, bool member, double now);

  // Drops the buckets of the keys `gone` says left (their budget starts full if they return).
  void forget_if(const std::function<bool(const std::string& key)>& gone);

  struct Dropped {
    std::string key;  // empty: the strangers together
    uint64_t messages = 0;
  };
  // The messages dropped per key since the last report; forgets the buckets that refilled.
  std::vector<Dropped> report(double now);

  uint64_t dropped_total() const { return dropped_total_; }
  size_t tracked() const { return buckets_.size(); }

 private:
  struct Bucket {
    TokenBucket tokens;
    uint64_t dropped = 0;  // since the last report
  };
  Bucket& bucket_of(const std::string& key, double now);

  Rate member_, strangers_rate_;
  size_t max_tracked_;
  std::map<std::string, Bucket> buckets_;
  Bucket strangers_;
  uint64_t dropped_total_ = 0;
};

}  // namespace agora::serve
