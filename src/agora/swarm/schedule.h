// SwarmSchedule: the swarm coordinator's state and decisions (docs/swarm.md section 4): which
// stage each peer serves, which micro-batches of the step each first-stage replica works on,
// when a step's micro-batches are all done, each stage group's round of DeMo contributions, who
// is lost, and when one peer moves to the bottleneck. Torch-free and socket-free: the server
// (coordinator_server.h) feeds it hellos, polls and the time, and sends back what it answers, so
// tests drive it with a made-up clock.
//
// A step, for S stages, M = train.batch_size / train.micro_batch_size micro-batches:
//   training  the M micro-batches are handed to the stage-0 replicas that ask (each asks for as
//             many as it has room for, so stage 0 is balanced by pulling); each one goes through
//             a replica of every stage and back; a stage-0 replica reports it done with its
//             loss. A replica lost with micro-batches in hand gives them back to the pool.
//   syncing   every replica of stage s that was ready at the step sends its DeMo contribution;
//             the round of stage s is complete when every one of them that is still alive has
//             (one that dies is dropped from it). When all S rounds are complete, each replica
//             receives its stage's contributions, ordered by key, and applies them: every replica
//             of a stage ends the step with the same bits (optim/decoupled_momentum.h).
//   then the next step, or finished after train.steps.
// waiting: some stage has no replica that serves it (ready at the step, or about to apply the
//   round that brings it there), so no micro-batch can cross it. The run stays where it is,
//   with the pool kept, until a replica of that stage is ready at the step again: a live
//   replica's joiner fetches it, or, when every replica died, a peer that saved the stage at
//   this step brings it back (swarm_peer.h, --state-dir). /api/swarm says which stage it waits
//   for. The run also waits before it starts, until `start_peers` peers are ready and every
//   stage has one.
//
// Membership. A peer says hello with its key and endpoint and gets a stage: the one it asked for,
// else balance.h's stage_for_joiner. It is ready once it reports holding the stage at the step
// (the seeded start at step 0; later, parameters fetched from a ready replica of the stage, named
// in its view as `source`, and checked against the stage's hash). A peer silent for peer_timeout
// seconds is lost: its micro-batches go back to the pool, it leaves its round, and the epoch
// (in every answer) grows. What a lost replica held in flight is lost; the stage-0 replicas send
// again what was out at that moment and does not come back (swarm_peer.h).
// A hello from a known key is a restart: the old incarnation is lost first.
//
// Hashes. Every ready replica reports its stage's parameter hash at its version. The stage's
// hash at the step is the one a strict majority of its ready replicas report; a replica whose
// hash is outvoted is diverged: no longer ready, it fetches the stage again. Without a strict
// majority (a stage of two that disagrees: a tie) the stage has no hash at the step: nobody is
// outvoted, nobody refetches, and a joiner is named no source, so no single member decides
// what the others hold (docs/security.md, "The swarm").
//
// Deadlines and strikes (no member stalls the step). A stage-0 replica that holds a
// micro-batch longer than the hold deadline loses what it holds past it (back to the pool, for
// the others), and earns a strike when it finished no micro-batch in that time; a replica expected
// in a round that has not sent its contribution by the round deadline leaves the round and earns a
// strike; a contribution that check_contribution refuses (not a well-formed DeMo payload of its
// stage and step) earns one. Both deadlines are max(min_deadline, deadline_factor x a measured
// time): for micro-batches, the lower median over stage-0 replicas of each one's median time from
// hand-out to done (its last 8), for rounds, the median over the last 8 rounds of each round's
// lower median time from the round's start to a contribution, so one member's slowness is one vote
// and never the measure (before anything is measured, min_deadline x deadline_factor). max_strikes
// strikes ban the key for the rest of the run (take_banned(); a banned key's hello is refused).
// Work dropped: only a sender sees a micro-batch it routed time out or come back as bytes that
// do not decode, so senders report the replica (SwarmReport::dropped; a replica whose own next
// stage let it down says so upstream and is not named, swarm_peer.h). At the end of a step, a
// replica that at least two and a strict majority of the previous stage's replicas ready at the
// step named earns a strike: no single sender can strike anyone, and in a previous stage of one
// nobody is struck for drops. A replica lost during the step (crashed, stopped, restarted) is not
// judged.
//
// Rebalancing (rebalance_seconds > 0): at the end of a step, once that long since the last
// move, balance.h's plan_move over the ready replicas' measured seconds per sample and the
// stages' costs; the moved peer stops serving its stage and fetches the new one.
//
// Bounds: members by max_members; micro-batches held per stage-0 replica by max_hold; a
// contribution per ready replica per round, of the size check_contribution allows; the round in
// one answer per member a second at most; banned keys kept, 4 x max_members at most; a reported
// done counts only for a micro-batch that replica holds. What a peer reports can only move its own
// standing.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agora/config/model_config.h"

namespace agora {

// The relative compute of each stage's forward and backward per sample (its layers' parameters,
// and the output head's on the last stage), from pipeline/partition.h's cut, normalised to a
// mean of 1: balance.h's costs, and the pace of a replica that plays a slower machine.
std::vector<double> swarm_stage_costs(const ModelConfig& model, int64_t stages);

enum class SwarmPhase { kWaiting, kTraining, kSyncing, kFinished };

// The refusal of a poll from a key that is not a member (never said hello, or was lost): the
// peer says hello again.
inline constexpr const char* kNotAMember = "not a member: say hello first";
const char* phase_name(SwarmPhase phase);

struct SwarmScheduleOptions {
  int64_t stages = 2;
  int64_t steps = 1;
  int64_t micro_batches = 1;     // M per step
  int64_t micro_batch_size = 1;  // samples per micro-batch (for throughput)
  std::vector<double> costs;     // per stage (balance.h); empty = 1 each
  int64_t start_peers = 1;       // ready peers before the first step
  double peer_timeout = 5;       // seconds of silence before a peer is lost
  double rebalance_seconds = 0;  // 0 = never
  double min_gain = 0.05;        // balance.h plan_move
  int64_t max_members = 64;
  int64_t max_hold = 16;       // micro-batches one stage-0 replica holds at once
  double min_deadline = 10;    // seconds: the least hold and round deadline
  double deadline_factor = 8;  // times the measured time (see "Deadlines and strikes")
  int64_t max_strikes = 3;     // strikes that ban a key
  // Empty when `payload` is a contribution stage `stage` may send at `step`, else why not (the
  // server decodes it against the stage's DeMo layout). Unset: every payload is taken.
  std::function<std::string(int64_t stage, uint64_t step, const std::string& payload)>
      check_contribution;
};

// What a peer reports in a poll (SwarmPoll).
struct SwarmReport {
  int64_t stage = 0;  // the stage it holds or loads
  uint64_t version = 0;
  std::string state_hash;
  bool ready = false;
  double seconds_per_sample = 0;
  int64_t wants = 0;
  std::vector<std::pair<uint32_t, float>> done;  // (micro-batch, loss)
  std::optional<std::string> payload;
  int64_t retried = 0;
  std::vector<std::string> dropped;  // next-stage replicas that let its sends time out
};

struct SwarmPeerRef {
  std::string key, endpoint;
  int64_t stage = 0;
};

// What the coordinator answers (SwarmView).
struct SwarmAnswer {
  uint64_t step = 0;
  SwarmPhase phase = SwarmPhase::kWaiting;
  int64_t stage = 0;
  std::vector<SwarmPeerRef> next, prev;  // next: serving the next stage (serves())
  std::vector<SwarmPeerRef> peers;       // the other members of its stage (who may fetch it)
  std::vector<uint32_t> micro_batches;
  uint64_t round_step = 0;
  std::vector<std::pair<std::string, std::string>> round;  // (key, contribution), by key
  std::string stage_hash, previous_hash;  // the stage's at the step, and at the step before
  std::optional<SwarmPeerRef> source;
  std::string refused;
  uint64_t epoch = 0;
  std::string waiting_for;
};

class SwarmSchedule {
 public:
  // Throws Error for options a run cannot have (named, with what is allowed).
  explicit SwarmSchedule(SwarmScheduleOptions options);

  // A peer's hello: `stage` < 0 lets the coordinator choose. Returns the answer (refused says why
  // when the swarm is full or the stage does not exist).
  SwarmAnswer hello(const std::string& key, const std::string& endpoint, int64_t stage, double now);
  // A known peer's poll; an unknown key is refused ("say hello first").
  SwarmAnswer poll(const std::string& key, const SwarmReport& report, double now);
  // Loses silent peers and moves the phase on; call it often.
  void tick(double now);

  SwarmPhase phase() const { return phase_; }
  uint64_t step() const { return step_; }
  uint64_t epoch() const { return epoch_; }
  bool knows(const std::string& key) const { return members_.count(key) != 0; }
  bool banned(const std::string& key) const { return banned_.count(key) != 0; }
  // The keys banned since the last call (the server bans them in its member table too).
  std::vector<std::string> take_banned();
  // The deadlines in force now (seconds; see "Deadlines and strikes").
  double hold_deadline() const;
  double round_deadline() const;
  // The events since the last call (JSON objects with "event"), for the events file.
  std::vector<nlohmann::json> take_events();
  // The run for /api/swarm: phase, step, stages with their replicas, throughput so far.
  nlohmann::json status(double now) const;
  // The summary written at the end: samples/s, the ideal, efficiency, steps, losses, moves...
  nlohmann::json summary(double now) const;

  // Durability (schedule_durable.cc; the server saves before it answers, coordinator_store.h).
  // `state` is what a restart resumes from: the step, the phase, the members with their stages,
  // the micro-batches done, the rounds awaited and the stages' hashes; it changes only when the
  // schedule decided something, so the server saves when it differs from the last save. `clock`
  // holds the throughput accounting, saved with it. The round contributions are not in either:
  // take_contributions() hands each over once, as it arrives.
  struct Durable {
    nlohmann::json state, clock;
  };
  Durable durable(double now) const;
  struct Contribution {
    uint64_t step = 0;
    int64_t stage = 0;
    std::string key, payload;
  };
  std::vector<Contribution> take_contributions();
  // Resumes from a save made `down_seconds` ago (counted as waiting) with the contributions of
  // its step and of the completed round. The clock goes on from the save's: `now` must be the
  // save's clock["now"] + down_seconds (the server's clock restarts there). The members come back
  // as they were saved, not ready until they report again, with `now` as the last time heard from;
  // the micro-batches they held go back to the pool (their reports may have been lost with the old
  // process). Throws Error naming what does not fit this schedule's options.
  void restore(const Durable& saved, const std::vector<Contribution>& rounds, double now,
               double down_seconds);
  std::vector<std::string> member_keys() const;

 private:
  struct Member {
    std::string endpoint;
    int64_t stage = 0;
    bool ready = false;  // holds `stage` at `version` (as reported, hash not outvoted)
    uint64_t version = 0;
    std::string hash;
    double seconds_per_sample = 0;
    double last_heard = 0;
    double hello_at = 0;  // its last hello: another within peer_timeout is no restart
    std::map<uint32_t, double> holding;  // stage 0: micro-batches given, not done: when given
    std::deque<double> latencies;        // stage 0: hand-out to done, its last 8
    double progress_at = 0;              // stage 0: its last done, or its first hand-out after none
    int64_t strikes = 0;
    uint64_t round_sent_for = 0;  // 1 + the step of the round last put in its answer
    double round_sent_at = 0;
    int64_t micro_batches = 0;  // done, over the run (stage 0)
    uint64_t id = 0;            // order of joining, for balance.h
  };

  bool ready_at(const Member& m, uint64_t version) const;
  bool serves(const Member& m, int64_t stage) const;
  bool gets_round(const Member& m) const;
  void lose(const std::string& key, const char* why, double now);
  void strike(const std::string& key, const std::string& why, double now);
  void enforce_deadlines(double now);
  // At a step's end: strikes the replicas enough of their senders named (see "Work dropped").
  void judge_drops(double now);
  // The lower median: of two, the smaller, so one of two members cannot raise it.
  static double lower_median(std::vector<double> v);
  static constexpr size_t kDeadlineWindow = 8;  // latencies per member, rounds remembered
  void advance(double now);
  void start_sync(double now);
  bool rounds_complete() const;
  void finish_step(double now);
  void rebalance(double now);
  void refresh_hash(int64_t stage);
  std::vector<double> throughputs() const;
  void account(double now);
  void event(nlohmann::json e) { events_.push_back(std::move(e)); }

  SwarmScheduleOptions o_;
  std::map<std::string, Member> members_;
  uint64_t next_id_ = 0;
  SwarmPhase phase_ = SwarmPhase::kWaiting;
  uint64_t step_ = 0, epoch_ = 0;
  std::string waiting_for_;
  std::vector<uint32_t> pool_;  // micro-batches of the step not given out, ascending
  std::map<uint32_t, float> done_;
  // Syncing: per stage, the replicas whose contribution the round waits for, and what came.
  std::vector<std::set<std::string>> expected_;
  std::vector<std::map<std::string, std::string>> contributions_;
  // This step: replica -> the replicas of the stage before it that reported it dropped work.
  // Members only, both ways, so at most max_members x max_members entries.
  std::map<std::string, std::set<std::string>> dropped_by_;
  // The last complete round, per stage, for replicas still to apply it.
  uint64_t completed_step_ = 0;
  bool have_completed_ = false;
  std::vector<std::vector<std::pair<std::string, std::string>>> completed_;
  std::vector<std::string> stage_hash_;     // per stage, at step_ (kept when every replica dies)
  std::vector<std::string> previous_hash_;  // per stage, at step_ - 1
  // Throughput: from the first step's start; the ideal integrated over time.
  double started_ = -1, step_started_ = 0, last_account_ = 0, ideal_integral_ = 0;
  double last_rebalance_ = 0, finished_at_ = -1;
  // At the end of the last finished step: a run stopped mid-step is measured up to there.
  double last_step_end_ = -1, ideal_at_step_end_ = 0;
  int64_t samples_done_ = 0, retried_ = 0, moves_ = 0, lost_ = 0, diverged_ = 0;
  double waiting_seconds_ = 0;
  std::vector<double> step_losses_;
  std::vector<nlohmann::json> events_;
  std::vector<Contribution> arrived_;  // contributions not yet taken by the server
  // Deadlines: when the round started, each contribution's delay in it, the last rounds' lower
  // medians of those.
  double sync_started_ = 0;
  std::vector<double> round_delays_;
  std::deque<double> past_round_delays_;
  // Banned keys, oldest first (at most 4 x max_members kept), and those not yet taken.
  std::deque<std::string> banned_order_;
  std::set<std::string> banned_;
  std::vector<std::string> newly_banned_;
  int64_t strikes_ = 0, bans_ = 0;
  int64_t restarts_ = 0;
};

}  // namespace agora
