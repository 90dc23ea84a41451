// Store: the coordinator's SQLite file, so a run survives a coordinator crash.
//
// What it promises:
//   - save() writes a whole RunState in ONE transaction: a kill at any moment leaves the file
//     with the previous state or the new one, never a mix;
//   - load() gives back a RunState equal (operator==) to the last one saved;
//   - the finalized ledger is append-only on disk: a save inserts only steps the file does not
//     hold yet, and refuses a state whose ledger is shorter than the file's, unless the caller
//     says the run went back to a checkpoint (allow_rollback);
//   - a file belongs to one run (bind()) and one schema version; opening another version, or
//     binding to another run, is an Error that names the file and both values.
//
// Journal mode WAL (readers, such as an operator's sqlite3 shell, never block the coordinator)
// with synchronous=FULL: every save is on disk when it returns. NORMAL would be faster but may
// lose the last transactions on a power cut, and the service sends a step's Finalized right
// after saving it; forgetting a step that peers already applied could finalize it again with a
// different set and split the run.
//
// Tables (schema version 1): meta (schema_version, run_id, run_config_toml), ledger and
// finalized_steps (the finalized sets, one row per payload / per step), members, state_reports
// and state_records (hash reports), checkpoints, events (append-only history; the newest
// kMaxEvents load back), run (key 'state': the in-flight parts as JSON: phase, the open
// round, collecting steps, the data queue, counters), and step_stats (a StepRow per finalized
// step; added without a version change: older files get the table on open).
//
// What a save writes: only what differs from the previous save of this process (the first
// writes everything). The parts that are O(members) or more are rows of their own, each written
// once when it changes: a member, a state report, a commit of the open round, and a witness's
// holdings for a collecting step (one bit per committed payload, in the step's commit order).
// The JSON in `run` is split to match: 'state' (phase, queue, counters: every save), 'round'
// (the open round without its commits) and 'collecting' (the steps without their witnesses),
// each written when it changed. Before this, every save rewrote every member and every witness's
// holdings: at 1000 members, 1.4 GB of SQLite writes per round (docs/scaling.md). A file
// written before the split (one 'state' holding everything) still loads.
//
// Not thread-safe; one Store per file per process, and no other writer of the file while it
// is open (the differences are taken against what this process wrote).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agora/coord/run_state.h"

struct sqlite3;

namespace agora::coord {

// What the service measured of one finalized step (its table row), kept for the dashboard's
// history (GET /api/history). Not part of RunState: the state machine never reads it.
struct StepRow {
  uint64_t step = 0;
  double at = 0;                 // wall-clock seconds when it became final
  double loss = 0;               // median of the final payloads' claimed losses; NaN if unknown
  double val_loss = 0;           // checkpointers' validation loss at this step; NaN if none
  double learning_rate = 0;      // the schedule's, at this step
  double tokens_per_second = 0;  // sequences x seq_len since the previous row
  double payload_bytes = 0;      // mean payload size
  double allreduce_bytes = 0;    // 4 bytes x parameters: an fp32 all-reduce's share per peer
  uint64_t peers = 0;            // payloads in the final set
  uint64_t sequences = 0;        // trained into the final set (of the commits this process saw)
  double seconds = 0;            // since the previous row; 0 for the first after a start
  bool operator==(const StepRow&) const = default;
};

// The run a store file belongs to.
struct StoredRun {
  std::string run_id;
  std::string run_config_toml;
};

class Store {
 public:
  static constexpr int kSchemaVersion = 1;

  // Opens `path`, creating the file and its tables when missing. Throws Error naming the file
  // when it cannot be opened, is not an agora coordinator database, or has another schema
  // version.
  static Store open(const std::filesystem::path& path);

  Store(Store&& other) noexcept;
  Store& operator=(Store&& other) noexcept;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();

  const std::filesystem::path& path() const { return path_; }

  // The run this file belongs to; nullopt for a file never bound.
  std::optional<StoredRun> run() const;
  // Binds a fresh file to a run. On a bound file: checks that it is the same run_id and throws
  // Error naming both ids otherwise (the config text is not compared: a restarted coordinator
  // may carry harmless edits; the service decides).
  void bind(const std::string& run_id, const std::string& run_config_toml);

  // The last state saved; nullopt when none was.
  std::optional<RunState> load() const;
  // Replaces the saved state with `state` in one transaction. Throws Error when the file is not
  // bound to a run, when state's ledger is shorter than the file's, or on any SQLite error (the
  // transaction is rolled back and the previous state stays).
  // `allow_rollback`: the state's ledger may be shorter than the file's because the run went
  // back to a checkpoint (StateMachine after every member left); the undone steps are deleted.
  // `rows`: step rows to record with it (INSERT OR REPLACE); a rollback also deletes the rows
  // of the undone steps.
  void save(const RunState& state, bool allow_rollback = false,
            const std::vector<StepRow>& rows = {});
  // Every step row recorded, by step.
  std::vector<StepRow> step_rows() const;

 private:
  // What this process last wrote to the file (store_save.cc): a save writes what differs.
  struct Saved {
    std::optional<OpenRound> round;                 // with its commits
    std::map<uint64_t, CollectingStep> collecting;  // with the witnesses whose holdings are rows
    std::map<PublicKey, MemberRecord> members;
    std::map<uint64_t, HashReports> reports;
    std::vector<CheckpointRecord> checkpoints;
  };

  Store(std::filesystem::path path, sqlite3* db);
  void exec(const char* sql) const;
  // The open round and the collecting steps of a file whose core is split (run_state_json.h).
  void load_in_flight(RunState& s) const;
  // The parts of save() (store_save.cc).
  void save_ledger(const RunState& s, bool allow_rollback);
  void save_in_flight(const RunState& s);
  void save_members(const RunState& s);
  void save_reports(const RunState& s);
  void save_checkpoints_and_events(const RunState& s, const std::vector<StepRow>& rows);

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
  std::optional<Saved> saved_;  // none until this process saved once: that save writes all
};

}  // namespace agora::coord
