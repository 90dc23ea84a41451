// Shared by the coordinator's state-machine tests (coordinator_test.cc: membership, phases and
// the batch split; coordinator_rounds_test.cc: commits, finalization, hashes and recovery):
// message builders, action filters, and a fixture that starts a run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agora/coord/assignment.h"
#include "agora/coord/state_machine.h"
#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/net/identity.h"

namespace agora::coord::testing_support {

using net::Identity;
using Body = wire::Envelope::BodyCase;

inline constexpr double kT0 = 1'700'000'000.0;  // an epoch time, like the service passes

inline std::string hash_of(int i) {
  return std::string(32, static_cast<char>('a' + i));
}

// Where member `id` serves, in tests: a host name of its own, so no two members share one.
inline std::string endpoint_of(const Identity& id) {
  return "tcp://peer-" + net::short_key(id.public_key()) + ".test:7500";
}

inline wire::Envelope join_msg(const Identity& id, double sps = 0.0,
                               std::optional<std::string> endpoint = std::nullopt) {
  wire::Envelope e;
  e.mutable_join()->set_key(id.public_key());
  e.mutable_join()->set_endpoint(endpoint.value_or(endpoint_of(id)));
  e.mutable_join()->set_agent("agora test");
  e.mutable_join()->set_sequences_per_second(sps);
  return e;
}

inline wire::Envelope commit_msg(const Identity& signer, const std::string& run_id, uint64_t step,
                                 const std::string& hash, uint64_t sequences = 0,
                                 double seconds = 0.0) {
  wire::Envelope e;
  wire::CommitRecord* r = e.mutable_commit()->mutable_record();
  r->set_author(signer.public_key());
  r->set_step(step);
  r->set_payload_hash(hash);
  r->set_signature(signer.sign(net::commit_signing_bytes(run_id, step, hash)));
  e.mutable_commit()->set_sequences(sequences);
  e.mutable_commit()->set_compute_seconds(seconds);
  return e;
}

inline wire::Envelope witness_msg(uint64_t step, const std::vector<std::string>& held) {
  wire::Envelope e;
  e.mutable_witness()->set_step(step);
  for (const std::string& h : held) e.mutable_witness()->add_held(h);
  return e;
}

inline wire::Envelope heartbeat_msg(uint64_t applied, uint64_t next_round) {
  wire::Envelope e;
  e.mutable_heartbeat()->set_applied_steps(applied);
  e.mutable_heartbeat()->set_next_round(next_round);
  return e;
}

// The state hash of a one-tensor model whose tensor hashes to `tensor_hash` (docs/protocol.md
// section 2: the BLAKE2b-256 of the tensor hashes).
inline std::string state_hash_for(const std::string& tensor_hash) {
  return blake2b256_bytes(tensor_hash);
}

// A consistent report of a one-tensor model ("w") whose tensor hashes to `tensor_hash`.
inline wire::Envelope state_report_msg(uint64_t applied, const std::string& tensor_hash) {
  wire::Envelope e;
  wire::StateRecord* s = e.mutable_state_report()->mutable_state();
  s->set_applied_steps(applied);
  s->set_state_hash(state_hash_for(tensor_hash));
  s->add_tensor_names("w");
  s->add_tensor_hashes(tensor_hash);
  return e;
}

inline wire::Envelope leave_msg() {
  wire::Envelope e;
  e.mutable_leave();
  return e;
}

// Messages of kind `body` that `actions` sends to `to`.
inline std::vector<wire::Envelope> sent(const Actions& actions, const net::PublicKey& to,
                                        Body body) {
  std::vector<wire::Envelope> out;
  for (const Outgoing& o : actions.send) {
    if (o.to == to && o.body_case() == body) out.push_back(o.merged());
  }
  return out;
}

inline size_t count_kind(const Actions& actions, Body body) {
  return std::count_if(actions.send.begin(), actions.send.end(),
                       [&](const Outgoing& o) { return o.body_case() == body; });
}

inline bool logged(const Actions& actions, const std::string& part) {
  return std::any_of(actions.log.begin(), actions.log.end(),
                     [&](const LogLine& l) { return l.text.find(part) != std::string::npos; });
}

// Whether `actions` logged an event of `kind` about the member with key `about`.
inline bool logged(const Actions& actions, EventKind kind, const PublicKey& about) {
  return std::any_of(actions.log.begin(), actions.log.end(), [&](const LogLine& l) {
    return l.kind == kind && l.peer == net::short_key(about);
  });
}

// The value of field `key` on the first event of `kind` that `actions` logged, if any.
inline std::optional<obs::LogValue> logged_field(const Actions& actions, EventKind kind,
                                                 const std::string& key) {
  for (const LogLine& l : actions.log) {
    if (l.kind != kind) continue;
    for (const obs::LogField& f : l.fields) {
      if (f.key == key) return f.value;
    }
  }
  return std::nullopt;
}

inline std::vector<SequenceRange> ranges_of(const wire::RoundStart& start) {
  std::vector<SequenceRange> out;
  for (const auto& r : start.assignment()) out.push_back({r.first(), r.count()});
  return out;
}

inline uint64_t count_of(const wire::RoundStart& start) {
  return total_count(ranges_of(start));
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 5; ++i) ids_.push_back(Identity::generate());
    // Key order decides the split's tie-breaks; sort so that ids_[0] < ids_[1] < ...
    std::sort(ids_.begin(), ids_.end(),
              [](const Identity& a, const Identity& b) { return a.public_key() < b.public_key(); });
    options_.run_id = "0123abcd";
    options_.run_config_toml = "seed = 1\n";
    options_.total_steps = 10;
    options_.batch_size = 12;
    options_.network.min_peers = 2;
    options_.network.warmup_seconds = 2.0;
    options_.network.overlap = 0;
    options_.network.deadline_factor = 3.0;
    options_.network.min_deadline_seconds = 10.0;
    options_.network.witness_seconds = 10.0;
    options_.network.heartbeat_timeout_seconds = 15.0;
    options_.network.max_strikes = 3;
    options_.network.hash_interval = 10;
    options_.network.quorum = 0.5;
    options_.network.checkpointers = 1;
  }

  void make() { sm_ = std::make_unique<StateMachine>(options_, RunState{}); }
  const net::PublicKey& key(int i) const { return ids_[i].public_key(); }
  const RunState& state() const { return sm_->state(); }
  const MemberRecord& member(int i) const { return state().members.at(key(i)); }

  Actions handle(int i, const wire::Envelope& e, double now) { return sm_->handle(key(i), e, now); }
  Actions commit(int i, uint64_t step, const std::string& hash, double now) {
    return handle(i, commit_msg(ids_[i], options_.run_id, step, hash), now);
  }

  // Joins members 0..n-1 at kT0 and ticks past the warmup: round 0 is open. Returns the tick.
  Actions start(int n, double sps = 0.0) {
    make();
    for (int i = 0; i < n; ++i) handle(i, join_msg(ids_[i], sps), kT0);
    Actions opened = sm_->tick(kT0 + options_.network.warmup_seconds);
    EXPECT_EQ(state().phase, Phase::kTraining);
    EXPECT_TRUE(state().round.has_value());
    return opened;
  }

  // Every member in `committers` commits step `step`, then every committer witnesses every
  // payload. Returns the actions of the last witness (which finalizes the step).
  Actions full_round(uint64_t step, const std::vector<int>& committers, double now) {
    std::vector<std::string> hashes;
    for (int i : committers) {
      hashes.push_back(hash_of(static_cast<int>(step % 10) + i));
      commit(i, step, hashes.back(), now);
    }
    Actions last;
    for (int i : committers) last = handle(i, witness_msg(step, hashes), now);
    return last;
  }

  Options options_;
  std::vector<Identity> ids_;
  std::unique_ptr<StateMachine> sm_;
};

}  // namespace agora::coord::testing_support
