// Members: who a server serves, and the gate every message passes before a role sees it.
//
// Every role that serves members over CURVE (the asynchronous outer server, the RL learner, the
// swarm coordinator; the data-parallel coordinator keeps its members in its state machine and
// uses the same gate pieces) holds one Members table. The life of a key, the same in every role:
//
//   stranger   connected (the allowlist let the handshake through) but never proved itself with
//              a hello. Its messages draw from ONE bucket shared by all strangers, so a crowd of
//              fresh keys costs the server at most stranger_rate messages a second. Anything but
//              a hello is answered with the one refusal, refusal(kNotAMember, may_rejoin=true).
//   member     said hello naming the ed25519 key whose curve25519 form is the connection's
//              authenticated key (proves_key). Counts against max_members; draws from a bucket
//              of its own (member_rate, member_burst); every message marks it heard from.
//   banned     the role banned it (strikes). It keeps its entry, so reconnecting does not wash
//              the ban away, and stops counting against max_members; the role answers its
//              requests with the ban's reason. At most max_banned are kept (the longest silent
//              go first).
//   forgotten  a member silent for idle_seconds leaves the table: the role releases what it held
//              (on_forget), and the key is a stranger again, free to say hello anew.
//
// Nothing here grows with what a member sends: the table is bounded by max_members plus
// max_banned, strangers have no entries at all. One thread owns a table (the server's loop).
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "agora/core/token_bucket.h"
#include "agora/net/identity.h"
#include "agora/wire/agora.pb.h"

namespace agora::serve {

// The refusal of a message from a key that is not a member (never said hello, or forgotten).
inline constexpr const char* kNotAMember =
    "not a member: say hello first (this key never did, or was forgotten after its silence)";

// The one way a server refuses a message it will not handle: a Refused envelope.
wire::Envelope refusal(std::string reason, bool may_rejoin);

// Whether `claimed` (an ed25519 public key, as a hello names it) is the key whose curve25519 form
// the CURVE handshake authenticated (`curve_key`). False for anything malformed.
bool proves_key(std::string_view claimed, std::string_view curve_key);

struct MemberLimits {
  int max_members = 64;  // members not banned, at once
  int max_banned = 256;  // banned keys remembered
  double idle_seconds = 120;
  double member_rate = 200, member_burst = 1000;    // messages a second, each member
  double stranger_rate = 20, stranger_burst = 100;  // messages a second, all strangers together
};

// What the table keeps of every member; the role's own state is State, which Member extends, so
// a role's code reads its fields and these alike.
template <class State>
struct Member : State {
  net::PublicKey key;     // ed25519, proved by the hello
  std::string name;       // the key in hex, for logs and APIs
  std::string curve_key;  // the connection's authenticated key, the table's index
  TokenBucket rate;
  double joined_at = 0, last_seen = 0;
  bool banned = false;
};

// Where a message stands after the gate.
enum class Standing {
  kStranger,   // no entry: a hello may make it a member, anything else gets kNotAMember
  kMember,     // within its budget
  kBanned,     // within its budget, banned: the role answers with the ban
  kThrottled,  // over its budget (or the strangers'): drop it, answer nothing
};

template <class State>
class Members {
 public:
  using Entry = Member<State>;

  explicit Members(MemberLimits limits) : limits_(limits) {}
  const MemberLimits& limits() const { return limits_; }

  struct Admitted {
    Standing standing = Standing::kStranger;
    Entry* member = nullptr;  // for kMember and kBanned
  };
  // Charges the message to its sender's bucket and marks a member heard from.
  Admitted admit(const std::string& curve_key, double now) {
    const auto it = by_curve_.find(curve_key);
    if (it == by_curve_.end()) {
      if (!strangers_.take(limits_.stranger_rate, limits_.stranger_burst, now)) {
        return {Standing::kThrottled, nullptr};
      }
      return {Standing::kStranger, nullptr};
    }
    Entry& m = it->second;
    if (!m.rate.take(limits_.member_rate, limits_.member_burst, now)) {
      return {Standing::kThrottled, &m};
    }
    m.last_seen = now;
    return {m.banned ? Standing::kBanned : Standing::kMember, &m};
  }

  struct Joined {
    Entry* member = nullptr;  // null when refused
    bool fresh = false;       // a new member (else a known one saying hello again)
    std::string refused;      // why not, in plain words
  };
  // A hello naming ed25519 key `claimed` on the connection authenticated as `curve_key` (which
  // admit() already charged). A known key, banned or not, comes back as itself.
  Joined join(const std::string& curve_key, const std::string& claimed, double now) {
    Joined j;
    if (!proves_key(claimed, curve_key)) {
      j.refused = "the hello names another ed25519 key than the one this connection authenticated";
      return j;
    }
    if (const auto it = by_curve_.find(curve_key); it != by_curve_.end()) {
      it->second.last_seen = now;
      j.member = &it->second;
      return j;
    }
    if (serving() >= limits_.max_members) {
      j.refused = "the server is full: it serves at most " + std::to_string(limits_.max_members) +
                  " members";
      return j;
    }
    Entry& m = by_curve_[curve_key];
    m.key = claimed;
    m.name = net::key_to_hex(claimed);
    m.curve_key = curve_key;
    m.joined_at = m.last_seen = now;
    j.member = &m;
    j.fresh = true;
    return j;
  }

  void ban(Entry& m) {
    m.banned = true;
    int banned = 0;
    for (const auto& [curve, e] : by_curve_) banned += e.banned ? 1 : 0;
    while (banned-- > limits_.max_banned) {
      auto oldest = by_curve_.end();
      for (auto it = by_curve_.begin(); it != by_curve_.end(); ++it) {
        if (it->second.banned && &it->second != &m &&
            (oldest == by_curve_.end() || it->second.last_seen < oldest->second.last_seen)) {
          oldest = it;
        }
      }
      if (oldest == by_curve_.end()) break;
      by_curve_.erase(oldest);
    }
  }

  Entry* find(const std::string& curve_key) {
    const auto it = by_curve_.find(curve_key);
    return it == by_curve_.end() ? nullptr : &it->second;
  }

  Entry& at(const std::string& curve_key) { return by_curve_.at(curve_key); }

  // Members not banned.
  int serving() const {
    return static_cast<int>(std::count_if(by_curve_.begin(), by_curve_.end(),
                                          [](const auto& item) { return !item.second.banned; }));
  }

  // Forgets the members (not the banned) silent for idle_seconds. `release` frees what the role
  // held for one first, or returns false to keep it a while longer (bytes still queued to it).
  void evict_idle(double now, const std::function<bool(Entry&)>& release) {
    for (auto it = by_curve_.begin(); it != by_curve_.end();) {
      if (!it->second.banned && now - it->second.last_seen > limits_.idle_seconds &&
          (!release || release(it->second))) {
        it = by_curve_.erase(it);
      } else {
        ++it;
      }
    }
  }

  auto begin() { return by_curve_.begin(); }
  auto end() { return by_curve_.end(); }
  auto begin() const { return by_curve_.begin(); }
  auto end() const { return by_curve_.end(); }
  size_t size() const { return by_curve_.size(); }

 private:
  MemberLimits limits_;
  std::map<std::string, Entry> by_curve_;
  TokenBucket strangers_;
};

}  // namespace agora::serve
