// RelayStore: the coordinator's relay for members nobody can dial (behind a home router's NAT,
// or advertising an address that does not answer; see reachability.h).
//
// Such a member dials out only: after each commit it uploads the payload (a Blob) on its own
// connection to the coordinator, and the other members fetch it from the coordinator (GetBlob)
// as they would from its author. The relay checks only that the bytes hash to what that member
// committed; fetchers verify the author's signature as they do for any source, so a relay can
// lose a payload but never forge one.
//
// Bounds, whatever members send: a blob is kept only from a member marked relayed, only for a
// commit of that member in a step not yet final, at most Limits::max_blob_bytes each; the store
// holds at most Limits::max_bytes in all (full, it forgets the oldest steps' blobs for a newer
// step's, and refuses an upload when only the same step's or newer ones are left) and forgets
// steps more than Limits::keep_steps below the newest final one; each member may fetch each blob at
// most Limits::fetches_per_member times (a witness and an ensure() need two). Torch-free; one
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "agora/coord/reachability.h"
#include "agora/coord/run_state.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/tensor_relay.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"

namespace agora::coord {

// The step `author` committed `hash` for, among the open round and the steps still collecting;
// nullopt when none (a payload the relay has no reason to keep).
std::optional<uint64_t> committed_step(const RunState& state, const net::PublicKey& author,
                                       const std::string& hash);

class RelayStore {
 public:
  struct Limits {
    size_t max_blob_bytes = net::kMaxRelayedBlobBytes;
    uint64_t max_bytes = uint64_t{256} << 20;
    uint64_t keep_steps = 32;
    int fetches_per_member = 4;
  };
  RelayStore() = default;
  explicit RelayStore(Limits limits) : limits_(limits) {}

  // Keeps `data` as `author`'s payload for `step`, whose commitment is `hash`. Returns "" when
  // kept, else why not (for a log line): too large, the store full of this step and newer ones,
  // or the bytes do not hash to `hash`.
  std::string put(const net::PublicKey& author, uint64_t step, const std::string& hash,
                  std::string data);
  // The bytes of `hash` for member `who`; nullptr when not held or `who` used its fetches of it.
  std::shared_ptr<const std::string> get(const net::PublicKey& who, const std::string& hash);
  // Forgets the blobs of steps more than Limits::keep_steps below `finalized_steps` (members
  // still catching up fetch what they lack within that window).
  void prune(uint64_t finalized_steps);

  bool holds(const std::string& hash) const { return blobs_.contains(hash); }
  size_t blobs() const { return blobs_.size(); }
  uint64_t bytes_held() const { return held_; }
  uint64_t bytes_in() const { return in_; }
  uint64_t bytes_out() const { return out_; }
  // Bytes relayed for `step` (uploaded plus served), for its table row.
  uint64_t bytes_for_step(uint64_t step) const;
  const Limits& limits() const { return limits_; }

 private:
  struct Blob {
    uint64_t step = 0;
    std::shared_ptr<const std::string> data;
    std::map<net::PublicKey, int> fetches;
  };
  Limits limits_;
  std::map<std::string, Blob> blobs_;           // by hash
  std::map<uint64_t, uint64_t> bytes_by_step_;  // relayed, for rows; pruned with the blobs
  uint64_t held_ = 0, in_ = 0, out_ = 0;
};

// What the coordinator's service does for members nobody can dial: it probes every member that
// joins (again when its endpoint changes, and every kReprobeSeconds while it is unreachable),
// tells the state machine the answers (StateMachine::set_relayed), keeps relayed members'
// uploads and serves fetches from the store, and passes their model state to joiners chunk by
// chunk (TensorRelay). On the service's thread, but for the probes.
class Relay {
 public:
  static constexpr double kProbeSeconds = 5.0;
  static constexpr double kReprobeSeconds = 60.0;

  // `keep_steps`: how far below the newest final step uploads are kept (as long as members keep
  // payloads, so a member catching up finds a relayed author's too).
  Relay(net::Context& context, const net::Identity& identity, uint64_t keep_steps)
      : store_(RelayStore::Limits{.keep_steps = keep_steps}),
        prober_(context, identity, kProbeSeconds) {}

  // A message of the relay's (GetBlob, Blob, GetTensor, TensorData) from `from` on the
  // connection `route`, dispatched to the four below: what to send in answer. nullopt when the
  // message is none of the relay's (it goes to the state machine).
  std::optional<std::vector<RelayOutgoing>> handle(const StateMachine& machine,
                                                   const net::PublicKey& from,
                                                   const std::string& route,
                                                   const wire::Envelope& message, double now);
  // A Blob from `from`: kept when `from` is relayed and it is one of its commitments; else
  // counted, and said in sweep().
  void upload(const StateMachine& machine, const net::PublicKey& from, const wire::Blob& blob);
  // The answer to a GetBlob from `from`: the Blob, or a NotFound (not held, not a current
  // member, or its fetches of that blob used up).
  wire::Envelope fetch(const RunState& state, const net::PublicKey& from,
                       const wire::GetBlob& request);
  // The model state of relayed members, chunk by chunk (tensor_relay.h): a GetTensor naming a
  // holder, from `from` on the connection `route`; a holder's TensorData; and, every tick, the
  // forwarding and the timeouts. What they return, the service sends.
  std::vector<RelayOutgoing> fetch_tensor(const StateMachine& machine, const net::PublicKey& from,
                                          const std::string& route, const wire::GetTensor& get,
                                          double now);
  std::vector<RelayOutgoing> tensor_answer(const net::PublicKey& from, const wire::TensorData& data,
                                           double now);
  std::vector<RelayOutgoing> pump_tensors(double now) { return tensors_.pump(now); }
  // Starts the probes that are due and applies the answers that came in.
  Actions check_reachability(StateMachine& machine, double now);
  // Every few seconds: forgets departed members, and logs the uploads refused since the last.
  void sweep(const RunState& state);

  RelayStore& store() { return store_; }
  const TensorRelay& tensors() const { return tensors_; }

 private:
  RelayStore store_;
  TensorRelay tensors_;
  TensorRelay::Counters tensors_reported_;  // as of the last sweep
  Prober prober_;
  std::map<net::PublicKey, std::string> probed_;  // the endpoint each member was probed at
  std::map<net::PublicKey, double> reprobe_at_;   // unreachable members: when to ask again
  uint64_t refused_ = 0;                          // uploads not kept since the last sweep
  std::string refused_why_;
};

}  // namespace agora::coord
