// RunState: everything the coordinator must remember to resume a run after a crash.
//
// A plain value: public fields, no behaviour beyond a few read-only helpers. The state machine
// (coord/state_machine.h) is the only writer; the store (coord/store.h) persists it and gives it
// back equal (operator==), field for field. Times are wall-clock seconds since the epoch, as the
// service passed them in, so absolute deadlines stay meaningful across a restart.
//
// Keys (net::PublicKey) and hashes are raw bytes in std::string, as on the wire.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agora/data/sequence_range.h"
#include "agora/net/identity.h"

namespace agora::coord {

using net::PublicKey;

// Where the run is. Transitions are driven by the state machine only; see state_machine.h.
enum class Phase {
  // Fewer than network.min_peers members are kActive and no round has opened yet. Joins are
  // welcomed; nothing trains.
  kWaitingForPeers,
  // min_peers are active; the coordinator waits network.warmup_seconds (from phase_since) so
  // that peers starting together all make step 0. Falling below min_peers goes back to
  // kWaitingForPeers.
  kWarmup,
  // Rounds run: at most one round is open for commits, and at most overlap + 1 closed steps
  // wait for witnesses.
  kTraining,
  // Training had started, but when the next round was due fewer than min_peers members were
  // active. No warmup on the way back: reaching min_peers reopens rounds at once. Steps already
  // collecting keep finalizing.
  kPaused,
  // finalized steps == total_steps. Terminal: every message gets Finished back.
  kFinished,
};

// A member's standing. Only kActive members are assigned data; kActive and kSyncing members
// receive Finalized, count as witnesses when active at a close, and are watched for silence.
enum class MemberState {
  // Joined (or re-joined) and catching up: loading the parameters and replaying finalized steps.
  // Becomes kActive once it reports applied_steps + network.overlap >= finalized steps. A joiner
  // of a run with no finalized step is kActive at once.
  kSyncing,
  // Trains: assigned a share of every round, expected to commit and to witness.
  kActive,
  // Said Leave. No strike for the round it walked out of (its data is requeued). May join again.
  kLeft,
  // Removed by the coordinator; drop_reason says why. A member dropped for strikes is refused
  // for the rest of the run; one dropped for silence may join again (it probably restarted).
  kDropped,
};

enum class DropReason {
  kNone,              // not dropped
  kStrikes,           // reached network.max_strikes consecutive strikes
  kHeartbeatTimeout,  // silent for network.heartbeat_timeout_seconds
  // verify.max_failures confirmed failures in spot checks (spot_checks.h): a contribution that
  // was not the work assigned, or a verdict that accused an honest author. Barred, like kStrikes.
  kFailedVerification,
};

// Dropped for what it did (not for silence): refused for the rest of the run.
inline bool barred(DropReason reason) {
  return reason == DropReason::kStrikes || reason == DropReason::kFailedVerification;
}

std::string to_string(Phase phase);
std::string to_string(MemberState state);
std::string to_string(DropReason reason);

// An author's signed "my payload for `step` has hash `payload_hash`" (wire::CommitRecord).
struct CommitRecord {
  PublicKey author;
  uint64_t step = 0;
  std::string payload_hash;  // 32 bytes
  std::string signature;     // 64 bytes, verified before the record was stored
  bool operator==(const CommitRecord&) const = default;
};

// The parameters after `applied_steps` finalized steps, as a peer reported them.
struct StateRecord {
  uint64_t applied_steps = 0;
  std::string state_hash;
  std::vector<std::string> tensor_names;
  std::vector<std::string> tensor_hashes;
  bool operator==(const StateRecord&) const = default;
};

// The coordinator's record of one member (wire::Member is what travels: its key and endpoint).
struct MemberRecord {
  PublicKey key;
  std::string endpoint;  // "tcp://host:port": where it serves payloads and model state
  std::string agent;     // what it said it runs, for the operator
  MemberState state = MemberState::kSyncing;
  DropReason drop_reason = DropReason::kNone;
  int64_t strikes = 0;                // consecutive: a payload that becomes final resets it
  double sequences_per_second = 0.0;  // throughput EMA; 0 = unknown
  double last_seen = 0.0;             // when any message from it last arrived
  uint64_t applied_steps = 0;         // the finalized steps it last said it has applied
  bool checkpointer = false;          // asked (in Welcome) to write checkpoints
  double joined_at = 0.0;             // its latest Join
  bool operator==(const MemberRecord&) const = default;
};

// The round open for commits.
struct OpenRound {
  uint64_t step = 0;
  uint64_t apply_through = 0;  // peers apply every finalized step < apply_through first
  bool report_state = false;   // step % hash_interval == 0
  double opened_at = 0.0;
  double deadline = 0.0;  // absolute; the commit phase closes here at the latest
  // Every member the round was handed to (the kActive members at opening), with its share, in
  // sequence order. An empty share is possible; such a member is not waited for.
  std::map<PublicKey, std::vector<SequenceRange>> assignments;
  std::map<PublicKey, CommitRecord> commits;  // accepted commits, one per assigned author
  bool operator==(const OpenRound&) const = default;
};

// A step whose commit phase closed and that waits for witnesses before it finalizes.
struct CollectingStep {
  uint64_t step = 0;
  std::vector<CommitRecord> commits;  // C_t, sorted by author key
  // The data each committed author trained: consumed if its payload becomes final, requeued if
  // not.
  std::map<PublicKey, std::vector<SequenceRange>> ranges;
  std::set<PublicKey> expected;  // witnesses: the kActive members when the commit phase closed
  // The expected members whose Witness arrived, each with the commits it said it holds: one bit
  // per commit, in `commits` order (core/list_bits.h). The author holds its own implicitly; its
  // own bit counts for nothing. Bits, not a set of keys per payload hash: at 10,000 members the
  // sets took gigabytes, the bits 12.5 MB.
  std::map<PublicKey, std::string> witnessed;
  double deadline = 0.0;  // absolute; the step finalizes here at the latest
  bool operator==(const CollectingStep&) const = default;
};

// The sequence ids not yet trained into a final payload.
struct DataQueue {
  // Ranges handed out whose payload never became final, sorted by first id and merged; handed
  // out again before any fresh id (lowest id first), so no data is silently skipped.
  std::vector<SequenceRange> pending;
  uint64_t next_fresh = 0;  // every id >= next_fresh has never been handed out
  bool operator==(const DataQueue&) const = default;
};

// What members reported for one applied_steps value k.
struct HashReports {
  std::map<PublicKey, std::string> reported;   // reporter -> state hash (the latest report)
  std::map<std::string, StateRecord> records;  // state hash -> the first record naming it
  std::set<PublicKey> resynced;                // members already sent a Resync for k
  bool operator==(const HashReports&) const = default;
};

struct CheckpointRecord {
  uint64_t applied_steps = 0;
  std::string state_hash;
  std::string path;  // on the reporter's machine
  PublicKey reporter;
  double at = 0.0;
  bool operator==(const CheckpointRecord&) const = default;
};

// What an event records, so that the page, the --json rows and tests read a key rather than the
// sentence. to_string() gives the lower-case name ("join", "caught_up", ...).
enum class EventKind {
  kJoin,        // a member joined or rejoined
  kCaughtUp,    // a syncing member reached the run and is active
  kLeave,       // a member said Leave
  kStrike,      // a member missed a deadline or authored a payload nobody could use
  kDrop,        // a member was removed (strikes or silence)
  kRejection,   // a commit, payload or join was refused, or a witness rejected a payload
  kIgnored,     // a message that came too late or from someone not expected; no effect
  kCheckpoint,  // a checkpointer reported a checkpoint
  kResync,      // a member's state differs from the majority's: it was told to resync
  kRestart,     // nobody holds the parameters: the run went back to a checkpoint
  kPhase,       // the run's phase changed, it resumed after a coordinator restart, or finished
  kRound,       // a round opened or closed, or a step became final (one of each per step)
  kTstSwitch,   // token superposition ended
  kVerify,      // a spot check was drawn, assigned, answered or resolved (spot_checks.h)
  kOther,       // rows of databases written before events had a kind
};

std::string to_string(EventKind kind);
// The inverse of to_string(); kOther for a name it does not know.
EventKind event_kind_from(std::string_view name);

// One line of the run's history, for the operator and a dashboard.
struct Event {
  uint64_t seq = 0;  // 1, 2, 3, ... over the whole run (Counters::events)
  double at = 0.0;
  std::string text;
  EventKind kind = EventKind::kOther;
  bool operator==(const Event&) const = default;
};

struct Counters {
  uint64_t joins = 0;
  uint64_t refusals = 0;
  uint64_t leaves = 0;
  uint64_t drops = 0;
  uint64_t strikes = 0;
  uint64_t rounds_opened = 0;
  uint64_t commits_accepted = 0;
  uint64_t commits_rejected = 0;  // malformed, unsigned, unassigned, wrong step: dropped
  uint64_t commits_late = 0;      // for a round already closed: ignored
  uint64_t witnesses = 0;
  uint64_t rejections_reported = 0;  // payloads witnesses said failed verification
  uint64_t payloads_final = 0;
  uint64_t payloads_not_final = 0;
  uint64_t resyncs_sent = 0;
  uint64_t restarts = 0;  // times every member left and the run went back to a checkpoint
  uint64_t deadline_misses = 0;  // assigned members with a non-empty share and no commit at a close
  uint64_t checkpoints = 0;      // checkpoint reports accepted
  uint64_t checkpoints_refused = 0;    // ahead of the ledger, not a checkpointer, wrong hash
  uint64_t state_reports_refused = 0;  // ahead, off schedule, malformed or inconsistent
  uint64_t witnesses_repeated = 0;     // a second Witness for the same step: ignored
  // Witness reports (held or missing) that the payload's outcome contradicted.
  uint64_t witness_disagreements = 0;
  uint64_t events_suppressed = 0;  // beyond kMaxMemberEventsPerRound for one member
  uint64_t events = 0;  // the seq of the newest event
  bool operator==(const Counters&) const = default;
};

inline constexpr size_t kMaxEvents = 256;          // events kept in memory
inline constexpr size_t kMaxStateReportSteps = 4;  // applied_steps values whose reports are kept
inline constexpr size_t kMaxCheckpoints = 32;      // newest checkpoint reports kept
inline constexpr size_t kMaxStateTensors = 16384;  // tensors a state record may list
// Ignored or rejected events recorded per member per round; the rest are only counted.
inline constexpr size_t kMaxMemberEventsPerRound = 16;
inline constexpr size_t kMaxRejectionEvents = 8;    // per Witness; the rest are one summary event
inline constexpr size_t kMaxTensorNameChars = 256;  // characters of one tensor's name

struct RunState {
  Phase phase = Phase::kWaitingForPeers;
  double phase_since = 0.0;                       // when `phase` was entered (the warmup clock)
  std::map<PublicKey, MemberRecord> members;      // everyone who ever joined, whatever their state
  uint64_t next_step = 0;                         // the step the next round to open will train
  std::optional<OpenRound> round;                 // the round open for commits, if any
  std::map<uint64_t, CollectingStep> collecting;  // closed, not yet final; keyed by step
  // The ledger: finalized[t] is F_t, the payloads of step t every member applies, in order.
  std::vector<std::vector<CommitRecord>> finalized;
  DataQueue queue;
  std::map<uint64_t, HashReports> state_reports;  // keyed by applied_steps; the newest few
  std::vector<CheckpointRecord> checkpoints;      // oldest first; the newest kMaxCheckpoints
  std::deque<Event> events;                       // oldest first; the newest kMaxEvents
  Counters counters;

  uint64_t finalized_steps() const { return finalized.size(); }
  bool operator==(const RunState&) const = default;
};

}  // namespace agora::coord
