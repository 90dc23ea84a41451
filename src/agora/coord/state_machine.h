// StateMachine: the coordinator's rules, as a pure function of (state, event, time).
//
// No sockets, no clocks, no files: the service hands in what a peer sent (already authenticated
// by the transport) or a tick, with `now` in wall-clock seconds since the epoch, and gets back
// the messages to send and the lines to log. The same sequence of calls gives the same state and
// actions, which is what makes it testable transition by transition, replayable, and usable in a
// simulator. State lives in RunState (run_state.h) so the service can persist it after every call
// and resume() after a crash.
//
// What it promises (docs/architecture.md, "The life of one round"):
//   - every sequence id is trained into a final payload exactly once: ids of a missed deadline,
//     a departed member or a payload that did not become final go back to the queue and are
//     handed out first in the next round;
//   - steps finalize strictly in order; the ledger only grows, except when every member has left
//     and a joiner cannot hold the newest state: then the run goes back to its newest
//     checkpoint (restart_from_checkpoint, counted in Counters::restarts);
//   - a message that breaks the rules (bad signature, wrong step, from a stranger...) never
//     changes what is trusted: it is dropped, counted and logged, or answered with Refused;
//   - it never throws for anything a peer sends; Error only for a caller's bug (a bad Options).
//
// Rounds. Opening round t takes train.batch_size ids from the queue and splits them among the
// kActive members in proportion to their throughput (assignment.h). The commit phase closes
// when every assigned member still active with a non-empty share has committed, or at the
// deadline; the committed set is then collected (Collect) and witnessed (Witness). Step t is
// final when all expected witnesses reported or at the witness deadline; a payload is final when
// more than network.quorum x the other witnesses that answered hold it, and more than
// network.quorum x all expected witnesses with its author (docs/protocol.md section 7: the
// author's own claim is never the evidence). With overlap 0 round t + 1 opens when step t is
// final; with overlap 1 when round t closed and step t - 1 is final.
//
// Strikes. A missed deadline, or a committed payload that a strict majority of the other
// expected witnesses reported missing (unless the author's reachability is still being probed,
// or it was found unreachable after that step opened), costs its member one strike; a final payload resets the count, so max_strikes means
// consecutive failures.
//
// Checkpointers. network.checkpointers current members hold the role; when a holder leaves, is
// dropped or goes silent, it passes to the longest-serving active member without it (RoundStart
// and Finished say who holds it). A checkpoint report that skips a multiple of
// train.checkpoint_interval since the run's previous checkpoint is logged as a gap.
//
// Finishing. When the last step is final the run is kFinished and every current member hears
// Finished. Members are released (a Finished without `linger`) only when every current member
// has applied every step and, with network.checkpointers > 0, a checkpoint of the final state
// was reported, or network.finish_grace_seconds after finishing: until then members stay and
// serve payloads to those still catching up, and a checkpointer lost at the end is replaced.
//
// Trust. Nothing one member says is believed alone: a state record is handed to joiners or used
// for a Resync only when more than quorum x the active members reported it; reports no honest
// peer would send are refused; everything kept per member (reports, records, events, departed
// members) is bounded (docs/protocol.md sections 3, 8 and 16).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/coord/run_state.h"
#include "agora/coord/spot_checks.h"
#include "agora/obs/log.h"
#include "agora/wire/agora.pb.h"

namespace agora::coord {

// Built by the service from the RunConfig; fixed for the run.
struct Options {
  std::string run_id;           // random hex string made at first start
  std::string run_config_toml;  // handed to every joiner
  uint64_t total_steps = 0;     // train.steps
  uint64_t batch_size = 0;      // train.batch_size: sequences per step (global batch)
  NetworkConfig network;
  std::set<net::PublicKey> allowlist;  // empty = open run (anyone may join)
  uint64_t tst_switch_step = 0;        // RunConfig::tst_switch_step(): logged when it opens
  uint64_t checkpoint_interval = 0;    // train.checkpoint_interval: for gap reports (0 = none)
  // Spot checks (spot_checks.h); rate 0 = none. Commits must carry a strategy commitment when
  // rate > 0.
  VerifyConfig verify{.rate = 0};
  // 32 unpredictable bytes per draw; empty = libsodium's generator (tests pass a script).
  std::function<std::string()> random_seed = {};
};

// One message to one member. What many members get alike (a Collect, Finalized, the member
// lists of a RoundStart) is built once and shared: `shared` holds it and `message` only what is
// this member's own (a RoundStart's assignment and deadline), or nothing. On the wire the
// member receives shared's encoding followed by message's; protobuf parses a concatenation of
// two encodings as their merge, so it reads one Envelope. At 1000 members a round's Collect
// was 1000 copies of a 197 KB message (docs/scaling.md); shared, it is one.
struct Outgoing {
  net::PublicKey to;
  wire::Envelope message;
  std::shared_ptr<const wire::Envelope> shared = nullptr;

  // The Envelope the member reads: shared merged with message (a copy, for tests and the
  // rare paths that need the whole).
  wire::Envelope merged() const;
  wire::Envelope::BodyCase body_case() const {
    return shared ? shared->body_case() : message.body_case();
  }
};

// One human line, what it records, and the member it is about (its short key; "" when it
// concerns the run).
struct LogLine {
  std::string text;
  std::string peer;
  EventKind kind = EventKind::kOther;
  // The event's figures, as keys of their own in JSON (obs/log.h): a drop's "reason", a strike's
  // "strikes" and "max_strikes", a rejected payload's "author" and "for_step", a round's "round",
  // a restart's "to_step". Never "event", "kind", "text", "step" or "peer".
  std::vector<obs::LogField> fields;
};

struct Actions {
  std::vector<Outgoing> send;
  // One human line per notable event (join, drop, strike, round closed, finalized, ...). The
  // same lines are appended to RunState::events.
  std::vector<LogLine> log;
};

class StateMachine {
 public:
  // `state` = RunState{} for a fresh run, or what the store loaded (then call resume()).
  // Throws Error when `options` cannot run (batch_size 0, min_peers < 1, overlap not 0 or 1,
  // quorum outside [0, 1), max_strikes < 1, hash_interval < 1).
  StateMachine(Options options, RunState state);

  // Any message a peer sent; `from` is the key the transport authenticated.
  Actions handle(const net::PublicKey& from, const wire::Envelope& message, double now);
  // Called about ten times a second: silence timeouts, commit and witness deadlines, warmup.
  Actions tick(double now);
  // Once after loading a persisted state: every current member's last_seen becomes `now` (the
  // coordinator, not they, was away), deadlines that passed or are about to are pushed to at
  // least a minimum phase from now (commits and witnesses sent while the coordinator was down
  // were lost), the open round's RoundStart is re-sent to assigned members that have not
  // committed, and Collect to expected witnesses that have not witnessed.
  Actions resume(double now);

  const RunState& state() const { return state_; }
  // The run finished and its members were released (see Finishing above): the service may exit.
  bool released() const { return released_; }

  // What the service's probe (reachability.h) found: a current member nobody can dial is
  // marked relayed in every member list (its payloads come from the coordinator's relay, it is
  // no source of state); one that answers again is not. Logs the change; runtime only, not
  // persisted (a restarted coordinator probes again).
  Actions set_relayed(const PublicKey& key, bool relayed, const std::string& why, double now);
  bool is_relayed(const PublicKey& key) const { return relayed_.contains(key); }
  // The service started probing `key`: until set_relayed() gives the answer, a payload of its
  // that witnesses could not fetch costs it no strike (it may be unreachable, not withholding).
  void set_probing(const PublicKey& key);
  const Options& options() const { return options_; }

 private:
  // Message handlers; the member exists and is kActive or kSyncing unless noted.
  void on_join(const net::PublicKey& from, const wire::Join& join,
               double now);  // anyone; state_machine_join.cc
  void on_heartbeat(MemberRecord& member, const wire::Heartbeat& heartbeat, double now);
  // Every member left: back to the newest checkpoint (or step 0); in-flight data is requeued.
  void restart_from_checkpoint();
  void on_leave(MemberRecord& member);
  void on_commit(MemberRecord& member, const wire::Commit& commit, double now);
  // Throughput (state_machine_throughput.cc): the EMA after an accepted commit; the rounds a
  // member missed, remembered at the close so that its late commit still measures it; and the
  // arrival times of the open round's commits, for the close's log line.
  void update_throughput(MemberRecord& member, const OpenRound& round, const wire::Commit& commit,
                         double now);
  void remember_missed(const MemberRecord& member, const OpenRound& round);
  // A commit for a round that already closed: a throughput sample when it is signed and for a
  // round the member missed (each missed round measures once), which also takes back that
  // round's strike. Returns the new EMA, or nullopt when the commit measured nothing.
  std::optional<double> learn_from_late_commit(MemberRecord& member, const wire::Commit& commit,
                                               double now);
  std::vector<obs::LogField> commit_timing(const OpenRound& round, double now) const;
  void on_witness(MemberRecord& member, const wire::Witness& witness);
  void on_state_report(MemberRecord& member, const wire::StateReport& report);
  void on_checkpoint_report(MemberRecord& member, const wire::CheckpointReport& report, double now);
  void on_get_finalized(MemberRecord& member, const wire::GetFinalized& request);
  // Spot checks (state_machine_verify.cc): a commit's strategy commitment (nullopt when it is
  // acceptable; else why not), the draw at a close, a verdict, and acting on what they decided.
  std::optional<std::string> check_strategy_commitment(const MemberRecord& member,
                                                        const wire::Commit& commit) const;
  void draw_spot_checks(const OpenRound& round, const CollectingStep& step, double now);
  void on_verdict(MemberRecord& member, const wire::Verdict& verdict, double now);
  void act_on(SpotChecks::Output output);

  // Everything that follows from the state without the passage of time (plus warmup expiry):
  // phase changes by member count, closing a round everyone committed to, finalizing steps,
  // opening the next round, finishing.
  void progress(double now);
  void set_phase(Phase phase, double now);
  void open_round(double now);
  void close_round(double now);
  // Finalizes collecting steps in order while the lowest one is ready (all expected witnesses
  // still active reported, or its deadline passed, or nothing to witness).
  void finalize_ready(double now);
  void finalize(CollectingStep& step);
  void finish();
  // In kFinished: the messages a current member may still send (heartbeats, sets it lacks,
  // checkpoint reports, leave); anything else is answered with Finished.
  void handle_finished(MemberRecord& member, const wire::Envelope& message, double now);
  // Releases the members once nobody is behind and the final checkpoint is on record, or the
  // grace period passed.
  void maybe_release(double now);
  wire::Envelope finished_for(const MemberRecord& member) const;
  // Hands the checkpointer role to active members until network.checkpointers current ones
  // hold it (a finished run tells a new holder at once, so it writes the final checkpoint).
  void keep_checkpointers();

  void strike(MemberRecord& member, const std::string& why);
  void drop(MemberRecord& member, DropReason reason, const std::string& why);
  void mark_caught_up(MemberRecord& member);
  // What a heartbeat says the member applied (self-reported, never past the ledger), and the
  // caught-up check it allows.
  void record_applied(MemberRecord& member, uint64_t applied_steps);
  void check_hashes(uint64_t applied_steps);

  // Runs an entry point's `body`; what it sends and logs is collected in the Actions returned.
  template <typename Body>
  Actions collect_actions(double now, Body&& body);

  // True when `key` is a member that is kActive or kSyncing.
  bool is_current(const PublicKey& key) const;
  // Members by state; kActive only unless `syncing_too`.
  std::vector<const MemberRecord*> active_members(bool syncing_too = false) const;
  size_t active_count() const;
  void add_members(google::protobuf::RepeatedPtrField<wire::Member>* out,
                   const std::vector<PublicKey>& keys) const;
  // A RoundStart in two parts: what every member of the round reads alike (its step, members
  // and joiners), and what is `key`'s own (its assignment, the time left, its role).
  std::shared_ptr<const wire::Envelope> round_start_common();
  wire::Envelope round_start_own(const PublicKey& key, double now) const;
  void send_round_start(const PublicKey& key, double now,
                        const std::shared_ptr<const wire::Envelope>& common);
  wire::Envelope collect_for(const CollectingStep& step) const;
  // The record at `applied_steps` a quorum stands behind: its hash has more reporters than
  // network.quorum x the kActive members (`except` not counted); nullptr when none has.
  // `holders` receives the kActive members (not `except`) that reported it.
  const StateRecord* trusted_record(uint64_t applied_steps, const PublicKey* except,
                                    std::vector<PublicKey>* holders) const;
  // What a joiner is handed: the newest trusted record, with its holders; the seed's state
  // (applied 0, no hash) when nothing was reported or nothing is final; nullopt when reports
  // exist but none is trusted (the joiner is asked to come back later).
  std::optional<StateRecord> newest_state(const PublicKey& joiner,
                                          std::vector<PublicKey>* holders) const;

  void send(const PublicKey& to, wire::Envelope message);
  void send(const PublicKey& to, std::shared_ptr<const wire::Envelope> shared);
  // `code`: a short token for the event's "reason" key ("full", "endpoint_taken", ...).
  void refuse(const PublicKey& to, const std::string& reason, bool may_rejoin = false,
              const std::string& code = "");
  // `about`: the member the line concerns, if one; logs carry its short key as their peer id.
  void log(EventKind kind, const std::string& line, const PublicKey* about = nullptr,
           std::vector<obs::LogField> fields = {});

  // log() without the per-member cap.
  void record(EventKind kind, const std::string& line, const PublicKey* about,
              std::vector<obs::LogField> fields);
  // Forgets the oldest records of members no longer current beyond network.max_members of them
  // (never one the open round or a collecting step still names).
  void prune_members();

  Options options_;
  RunState state_;
  // Ignored/rejected events per member in round events_round_ (not persisted: a restarted
  // coordinator starts counting afresh).
  std::map<PublicKey, size_t> member_events_;
  uint64_t events_round_ = 0;
  // Finishing (not persisted: a coordinator restarted after finishing waits for the members'
  // heartbeats and the grace period afresh).
  double finished_at_ = 0.0;
  bool released_ = false;
  std::set<PublicKey> relayed_;  // current members the probe could not dial
  // When a heartbeat last had the open round's RoundStart sent again to each member, and how
  // long the next must wait (runtime only): from kRoundStartHealSeconds, doubling, or a
  // coordinator whose sends queue up would answer every heartbeat with another copy and bury
  // itself (docs/scaling.md).
  std::map<PublicKey, std::pair<double, double>> round_start_healed_;
  // What follows from the members' states alone, kept until one changes (members_changed(),
  // called wherever a member joins, leaves, is dropped, catches up or becomes relayed; runtime
  // only). Recomputed per message, they were most of the state machine's time at 3000 members
  // (docs/scaling.md): the open round's RoundStart as every member reads it alike (rebuilt
  // per healed copy), the count of active members and the checkpointer roles (a scan of every
  // member per commit and witness).
  std::shared_ptr<const wire::Envelope> round_start_common_;
  mutable std::optional<size_t> active_count_;
  bool checkpointers_kept_ = false;
  void members_changed() {
    round_start_common_.reset();
    active_count_.reset();
    checkpointers_kept_ = false;
  }
  // Members whose missing payloads cost no strike in steps below the value: while the probe has
  // not answered (all steps), and once relayed, until the first round whose RoundStart told
  // them to upload.
  std::map<PublicKey, uint64_t> strike_free_below_;
  SpotChecks spot_checks_;  // runtime only, like relayed_
  // The rounds each current member missed, newest last, at most kMissedRoundsKept (runtime only:
  // a restarted coordinator measures from the next commits). Without them a member slower than
  // the deadline on the share it was first given would never be measured: its commits all
  // arrive late, and it would be struck until dropped.
  struct MissedRound {
    uint64_t step = 0;
    double opened_at = 0.0;
    uint64_t sequences = 0;
  };
  static constexpr size_t kMissedRoundsKept = 4;
  std::map<PublicKey, std::vector<MissedRound>> missed_;
  // Seconds from the open round's opening to each accepted commit, with its author, in arrival
  // order (runtime only; cleared when a round opens).
  std::vector<std::pair<double, PublicKey>> commit_times_;
  Actions* out_ = nullptr;  // the Actions of the call in progress
  double now_ = 0.0;        // the `now` of the call in progress (for event times)
};

}  // namespace agora::coord
