// The replica process of swarm_peer.h, one class split by concern over three files:
// swarm_peer.cc (set-up, the coordinator, the step's sync), swarm_peer_stage.cc (the stage's
// parameters between replicas and the disk: serving, fetching, restoring) and swarm_peer_work.cc
// (micro-batches: routing, forwards, backwards, sending again, the pace). Not an interface: only
// those files include it.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/data/sampler.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/event_log.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/pipeline/boundary.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_checkpoint.h"
#include "agora/pipeline/stage_files.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/subspace.h"
#include "agora/serve/rate_gate.h"
#include "agora/swarm/router.h"
#include "agora/swarm/schedule.h"
#include "agora/swarm/swarm_peer.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"
#include "agora/train/parameter_hash.h"

namespace agora::swarm_detail {

using Clock = std::chrono::steady_clock;

// Forwards waiting to be computed, per replica: a sender races ahead of this bound at a loss.
inline constexpr size_t kMaxWaiting = 256;

// The id a replica's key has in a SwarmRouter.
uint64_t router_id(const std::string& key);

class SwarmPeer {
 public:
  SwarmPeer(const RunConfig& config, const net::Identity& identity, const SwarmPeerOptions& o);
  SwarmPeerSummary run();
  void failed(const std::string& what);

 private:
  // ---- set-up, the stage, the coordinator --------------------------------------------------

  // What each connection may receive: from the coordinator (views with a stage's DeMo round),
  // over the micro-batch links (one hop), from a replica it fetches its stage from (one tensor).
  static net::DecodeLimits coordinator_limits();
  static net::DecodeLimits hop_limits(const RunConfig& config);
  net::DecodeLimits fetch_limits() const;
  static double seconds_since(Clock::time_point t);
  double now() const { return seconds_since(born_); }

  void hello();

  // A fresh stage at the seeded start: version 0 is every replica's, so it is ready at step 0.
  void take_stage(int64_t stage);
  SwarmRouterOptions router_options() const;
  void new_momentum();
  // Drops the work of the step (forwards that wait too, unless keep_forwards: a joiner keeps
  // those that arrived while it fetched) and the gradients.
  void forget_work(bool keep_forwards = false);
  bool poll_if_due();
  void on_view(const wire::SwarmView& v);
  // The coordinator's refusal: a peer it lost joins again; any other ends the process.
  void on_refused(const wire::Refused& r);

  // The next stage's serving replicas (routing), and what a lost member means for the
  // micro-batches in flight.
  void members(const wire::SwarmView& v);
  // The previous stage's members, whose forwards this replica takes; forwards that came from
  // other keys before this view are taken or dropped by it.
  void admit(const wire::SwarmView& v);

  // ---- the step's end ----------------------------------------------------------------------

  void contribute();
  void apply_round(const wire::SwarmView& v);
  void save_state();

  // ---- joining: the stage's parameters at the step ------------------------------------------

  void fetch_or_restore(const wire::SwarmView& v);
  void on_tensor(const wire::Envelope& reply);

  // Every replica of the stage died: the copy this peer saved, at the step (when the stage's
  // hash there is known) or at the step before (when the replicas died before reporting the
  // round's result: the coordinator then hands this peer the round to apply).
  void restore(const std::string& previous_hash);
  void become_ready(uint64_t step, const std::string& hash, const char* how, double seconds);

  // ---- serving: forwards in, GetTensor, backwards ------------------------------------------

  void serve(const net::Incoming& in);
  void answer_tensor(const net::Incoming& in);
  bool pump();
  void wait_for_messages();

  // One piece of work: a backward first (it frees memory and finishes micro-batches), then a
  // forward that waits, then (stage 0) a new micro-batch or one to send again.
  bool compute();
  torch::Tensor windows(uint64_t step, uint32_t j) const;
  BoundaryPosition position(uint64_t step, uint32_t j, int64_t stage) const;

  // Sleeps out what a slower machine would still be computing, and measures.
  double pace(Clock::time_point started, double share);
  void measured(double seconds);

  // Sends `bytes` on to the next stage by the router; false when no replica is there.
  bool send_on(uint64_t step, uint32_t j, uint32_t attempt, const std::string& bytes,
               std::string* replica);
  void start(uint32_t j);

  // Stage 0: a micro-batch goes again, to another replica when there is one, when the replica it
  // went to left the next stage, when it was out as a member was lost and did not return within
  // two round trips (at least a second: it went through the lost one), or after timeout_seconds.
  // Only the replica that left is skipped by the router: a loss may be any later stage's.
  bool resend_due();
  // Middle stages: a forward sent on and not answered within timeout_seconds is given up, and
  // the replica it went to is failed (skipped) by the router.
  void expire_held();
  // A send to `replica` timed out: it is named to the coordinator as having dropped the work
  // once stages after it had the time to say the loss was theirs (a `lost` answer), at once
  // when it is the last stage (schedule.h, "Work dropped").
  void send_timed_out(uint32_t j, uint32_t attempt, const std::string& replica);
  // An answer from `from` to attempt `attempt` of micro-batch `j` did not decode: `from` is
  // skipped by the router and named at once as having dropped the work.
  void garbled(const std::string& from, uint32_t j, uint32_t attempt);
  // A `lost` answer from `from`: the micro-batch went missing past it. Stage 0 sends it again
  // at once; a middle stage gives it up and tells its own sender the same.
  void lost_past(const std::string& from, const wire::SwarmHop& hop);
  // Moves the timed-out sends now due into the next poll's `dropped`.
  void name_drops();

  void arrived(const wire::SwarmHop& hop);
  void forward(const std::string& route, const wire::SwarmHop& hop);
  void reply(const std::string& route, const wire::SwarmHop& hop, const std::string& bytes,
             float loss, double seconds);
  void backward(const std::string& from, const wire::SwarmHop& hop);
  void event(nlohmann::json e);

  struct Origin {
    torch::Tensor output;
    std::string bytes, replica;
    uint32_t attempt = 0;
    bool sent = false;
    bool suspect = false;  // out when a member was lost
    Clock::time_point suspect_at;
    // Attempts sent before the current one, still out: attempt -> replica. An answer to one
    // frees the replica's share in the router (its work is not counted twice).
    std::map<uint32_t, std::string> earlier;
    double forward_seconds = 0;
    Clock::time_point sent_at;
  };
  struct Held {
    std::string route;
    uint32_t attempt = 0;  // the sender's
    torch::Tensor input, output;
    double forward_seconds = 0;
    std::string replica;        // sent on to ("" while unsent)
    Clock::time_point sent_at;  // when
  };
  struct PendingDrop {
    std::string replica;
    uint64_t version = 0;
    Clock::time_point due;
  };
  struct Unsent {
    uint32_t micro_batch = 0, attempt = 0;  // attempt: this replica's, the key in held_
    std::string bytes;
  };
  struct Fetch {
    uint64_t step = 0;
    std::string source, expected;
    std::set<std::string> missing;
    std::unique_ptr<net::Client> client;
    Clock::time_point started;
  };

  RunConfig config_;
  SwarmPeerOptions o_;
  const net::Identity& identity_;
  int64_t S_, M_, m_;
  std::vector<double> costs_;
  Sampler data_;
  std::string fingerprint_;
  Clock::time_point born_ = Clock::now();
  // Its server admits, at the CURVE handshake, only the previous stage's members and its own
  // stage's (admit(), from each view); nobody before the first view. Its clients dial out.
  net::Context context_{net::Admission{false, {}}};
  std::set<std::string> admitted_;
  net::Server server_;
  net::Client coordinator_;
  std::unique_ptr<SubspaceBasis> subspace_;
  std::optional<BoundaryCoder> coder_;
  obs::EventLog events_;  // --events, or closed

  // The stage.
  int64_t stage_ = -1;
  StageSpan span_;
  StageModel model_{nullptr};
  std::unique_ptr<DecoupledMomentum> demo_;
  uint64_t version_ = 0;
  bool ready_ = false;
  std::string hash_;  // raw, of the parameters at version_
  double seconds_per_sample_ = 0;
  int64_t measured_ = 0;

  // The coordinator's view.
  uint64_t step_ = 0, epoch_ = 0;
  std::string phase_ = "waiting", stage_hash_;
  bool finished_ = false;
  Clock::time_point last_view_, last_poll_, last_restore_try_, last_hello_;
  int polls_in_flight_ = 0;

  // Routing and work.
  SwarmRouter router_{SwarmRouterOptions{}};
  std::map<std::string, std::string> next_;  // key -> endpoint
  std::map<std::string, std::unique_ptr<net::Client>> clients_;
  std::map<uint64_t, std::string> by_id_;
  std::set<std::string> prev_curves_;
  std::deque<std::pair<std::string, wire::SwarmHop>> waiting_, backwards_;
  // Forwards from keys not (yet) among the previous stage's members: (curve key, forward).
  std::deque<std::pair<std::string, std::pair<std::string, wire::SwarmHop>>> strangers_;
  std::map<std::pair<uint32_t, uint32_t>, Held> held_;  // (micro-batch, attempt sent on)
  std::map<uint32_t, Origin> origin_;
  // Sends that timed out, by (micro-batch, attempt), until named or answered `lost`; and the
  // replicas to name in the next poll, for version dropped_version_.
  std::map<std::pair<uint32_t, uint32_t>, PendingDrop> pending_drops_;
  std::set<std::string> dropped_;
  uint64_t dropped_version_ = 0;
  std::deque<Unsent> unsent_;  // middle stages: forwards waiting for a next replica
  std::deque<uint32_t> assigned_;
  std::vector<std::pair<uint32_t, float>> done_;
  std::optional<std::string> payload_;
  bool round_seen_ = false, report_now_ = false;
  std::optional<Fetch> fetch_;
  uint32_t next_attempt_ = 1;
  double round_trip_ = 0;  // stage 0: moving average of a micro-batch's seconds out and back
  int64_t round_trips_ = 0;
  int64_t retried_ = 0;
  uint64_t ignored_ = 0;
  // GetTensor: the other members of this stage (curve keys, from the last view), each with its
  // own budget of requests; one shared budget for everyone else's (answered not_found).
  std::set<std::string> stage_curves_;
  // The members' budget follows the stage's tensor count (set_member_rate once the model is
  // built): four whole copies at once, one a second after.
  serve::RateGate tensor_rates_{{1, 4}, {20, 40}};
  SwarmPeerSummary summary_;
};

}  // namespace agora::swarm_detail
