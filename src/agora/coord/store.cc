#include "agora/coord/store.h"

#include <sqlite3.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "agora/coord/run_state_json.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/serve/sqlite.h"

namespace agora::coord {
namespace {

using nlohmann::json;

using serve::run_sql;
using serve::sqlite_fail;
using serve::Statement;
using serve::Transaction;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS finalized_steps (step INTEGER PRIMARY KEY, payloads INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
  step INTEGER NOT NULL, position INTEGER NOT NULL, author BLOB NOT NULL,
  payload_hash BLOB NOT NULL, signature BLOB NOT NULL, PRIMARY KEY (step, position));
CREATE TABLE IF NOT EXISTS members (
  key BLOB PRIMARY KEY, endpoint TEXT NOT NULL, agent TEXT NOT NULL, state INTEGER NOT NULL,
  drop_reason INTEGER NOT NULL, strikes INTEGER NOT NULL, sequences_per_second REAL NOT NULL,
  last_seen REAL NOT NULL, applied_steps INTEGER NOT NULL, checkpointer INTEGER NOT NULL,
  joined_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS state_reports (
  applied_steps INTEGER NOT NULL, reporter BLOB NOT NULL, state_hash BLOB NOT NULL,
  resync_sent INTEGER NOT NULL, PRIMARY KEY (applied_steps, reporter));
CREATE TABLE IF NOT EXISTS state_records (
  applied_steps INTEGER NOT NULL, state_hash BLOB NOT NULL, tensor_names TEXT NOT NULL,
  tensor_hashes TEXT NOT NULL, PRIMARY KEY (applied_steps, state_hash));
CREATE TABLE IF NOT EXISTS checkpoints (
  position INTEGER PRIMARY KEY, applied_steps INTEGER NOT NULL, state_hash BLOB NOT NULL,
  path TEXT NOT NULL, reporter BLOB NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, at REAL NOT NULL, text TEXT NOT NULL,
  kind TEXT NOT NULL DEFAULT 'other');
CREATE TABLE IF NOT EXISTS step_stats (
  step INTEGER PRIMARY KEY, at REAL NOT NULL, loss REAL, val_loss REAL, learning_rate REAL,
  tokens_per_second REAL, payload_bytes REAL, allreduce_bytes REAL, peers INTEGER NOT NULL,
  sequences INTEGER NOT NULL, seconds REAL);
)sql";

}  // namespace

// ---- Store -------------------------------------------------------------------------------------

Store Store::open(const std::filesystem::path& path) {
  serve::DatabaseHandle handle = serve::open_database(path);
  sqlite3* db = handle.get();
  Store store(path, handle.release());  // closes db on every way out
  Transaction transaction(db, path, "BEGIN IMMEDIATE");
  store.exec(kSchema);
  {
    // Databases written before events had a kind gain the column; their old rows read "other".
    Statement columns(db, path,
                      "SELECT COUNT(*) FROM pragma_table_info('events') WHERE name = 'kind'");
    columns.step();
    if (columns.int64(0) == 0) {
      store.exec("ALTER TABLE events ADD COLUMN kind TEXT NOT NULL DEFAULT 'other'");
    }
  }
  Statement get(db, path, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (get.step()) {
    const std::string version = get.text(0);
    if (version != std::to_string(kSchemaVersion)) {
      fail(
          "coordinator database {} has schema version {}; this agora reads version {} (use "
          "the agora release that wrote it, or start the run with a new network.state_db)",
          path.string(), version, kSchemaVersion);
    }
  } else {
    Statement put(db, path, "INSERT INTO meta (key, value) VALUES ('schema_version', ?)");
    put.bind_text(1, std::to_string(kSchemaVersion)).run();
  }
  transaction.commit();
  return store;
}

Store::Store(Store&& other) noexcept
    : path_(std::move(other.path_)), db_(std::exchange(other.db_, nullptr)) {}

Store& Store::operator=(Store&& other) noexcept {
  if (this != &other) {
    if (db_ != nullptr) sqlite3_close(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}

Store::~Store() {
  if (db_ != nullptr) sqlite3_close(db_);
}

void Store::exec(const char* sql) const {
  run_sql(db_, path_, sql);
}

std::optional<StoredRun> Store::run() const {
  Statement get(db_, path_,
                "SELECT key, value FROM meta WHERE key IN ('run_id', 'run_config_toml')");
  StoredRun run;
  bool found = false;
  while (get.step()) {
    if (get.text(0) == "run_id") {
      run.run_id = get.text(1);
      found = true;
    } else {
      run.run_config_toml = get.text(1);
    }
  }
  if (!found) return std::nullopt;
  return run;
}

void Store::bind(const std::string& run_id, const std::string& run_config_toml) {
  if (run_id.empty())
    fail("coordinator database {}: cannot bind to an empty run id", path_.string());
  if (auto existing = run()) {
    if (existing->run_id != run_id) {
      fail(
          "coordinator database {} belongs to run {}, not run {} (point network.state_db at "
          "another file to start a new run)",
          path_.string(), existing->run_id, run_id);
    }
    return;
  }
  Transaction transaction(db_, path_, "BEGIN IMMEDIATE");
  Statement put(db_, path_, "INSERT INTO meta (key, value) VALUES (?, ?)");
  put.bind_text(1, "run_id").bind_text(2, run_id).run();
  put.bind_text(1, "run_config_toml").bind_text(2, run_config_toml).run();
  crash_point("store.bind.before_commit");
  transaction.commit();
}

std::optional<RunState> Store::load() const {
  // One read transaction, so the parts come from the same save.
  Transaction transaction(db_, path_, "BEGIN");
  RunState s;
  {
    Statement get(db_, path_, "SELECT value FROM run WHERE key = 'state'");
    if (!get.step()) {
      transaction.commit();
      return std::nullopt;
    }
    try {
      volatile_from(json::parse(get.text(0)), s);
    } catch (const json::exception& e) {
      fail("coordinator database {}: the saved run state is damaged: {}", path_.string(), e.what());
    }
  }
  {
    Statement steps(db_, path_, "SELECT step, payloads FROM finalized_steps ORDER BY step");
    while (steps.step()) {
      if (steps.uint64(0) != s.finalized.size()) {
        fail("coordinator database {}: the ledger skips from step {} to step {}", path_.string(),
             s.finalized.size(), steps.uint64(0));
      }
      s.finalized.emplace_back().reserve(steps.uint64(1));
    }
    Statement rows(db_, path_,
                   "SELECT step, author, payload_hash, signature FROM ledger "
                   "ORDER BY step, position");
    while (rows.step()) {
      const uint64_t step = rows.uint64(0);
      if (step >= s.finalized.size()) {
        fail("coordinator database {}: a ledger row names step {}, which is not final",
             path_.string(), step);
      }
      s.finalized[step].push_back({rows.blob(1), step, rows.blob(2), rows.blob(3)});
    }
  }
  {
    Statement rows(db_, path_,
                   "SELECT key, endpoint, agent, state, drop_reason, strikes, "
                   "sequences_per_second, last_seen, applied_steps, checkpointer, joined_at "
                   "FROM members");
    while (rows.step()) {
      MemberRecord m;
      m.key = rows.blob(0);
      m.endpoint = rows.text(1);
      m.agent = rows.text(2);
      m.state = static_cast<MemberState>(rows.int64(3));
      m.drop_reason = static_cast<DropReason>(rows.int64(4));
      m.strikes = rows.int64(5);
      m.sequences_per_second = rows.real(6);
      m.last_seen = rows.real(7);
      m.applied_steps = rows.uint64(8);
      m.checkpointer = rows.int64(9) != 0;
      m.joined_at = rows.real(10);
      s.members[m.key] = std::move(m);
    }
  }
  {
    Statement rows(db_, path_,
                   "SELECT applied_steps, reporter, state_hash, resync_sent FROM state_reports");
    while (rows.step()) {
      HashReports& r = s.state_reports[rows.uint64(0)];
      r.reported[rows.blob(1)] = rows.blob(2);
      if (rows.int64(3) != 0) r.resynced.insert(rows.blob(1));
    }
    Statement records(db_, path_,
                      "SELECT applied_steps, state_hash, tensor_names, tensor_hashes "
                      "FROM state_records");
    while (records.step()) {
      StateRecord record;
      record.applied_steps = records.uint64(0);
      record.state_hash = records.blob(1);
      try {
        record.tensor_names = json::parse(records.text(2)).get<std::vector<std::string>>();
        for (const json& h : json::parse(records.text(3))) {
          record.tensor_hashes.push_back(
              hex_decode(h.get<std::string>(), "a tensor hash of a state record"));
        }
      } catch (const json::exception& e) {
        fail("coordinator database {}: a state record is damaged: {}", path_.string(), e.what());
      }
      s.state_reports[record.applied_steps].records[record.state_hash] = std::move(record);
    }
  }
  {
    Statement rows(db_, path_,
                   "SELECT applied_steps, state_hash, path, reporter, at FROM checkpoints "
                   "ORDER BY position");
    while (rows.step()) {
      s.checkpoints.push_back(
          {rows.uint64(0), rows.blob(1), rows.text(2), rows.blob(3), rows.real(4)});
    }
  }
  {
    Statement rows(db_, path_,
                   "SELECT seq, at, text, kind FROM (SELECT seq, at, text, kind FROM events "
                   "ORDER BY seq DESC LIMIT ?) ORDER BY seq");
    rows.bind(1, static_cast<int64_t>(kMaxEvents));
    while (rows.step()) {
      s.events.push_back(
          {rows.uint64(0), rows.real(1), rows.text(2), event_kind_from(rows.text(3))});
    }
  }
  transaction.commit();
  return s;
}

std::vector<StepRow> Store::step_rows() const {
  Statement get(db_, path_,
                "SELECT step, at, loss, val_loss, learning_rate, tokens_per_second, "
                "payload_bytes, allreduce_bytes, peers, sequences, seconds FROM step_stats "
                "ORDER BY step");
  std::vector<StepRow> rows;
  while (get.step()) {
    rows.push_back({get.uint64(0), get.real(1), get.real_or_nan(2), get.real_or_nan(3),
                    get.real_or_nan(4), get.real_or_nan(5), get.real_or_nan(6), get.real_or_nan(7),
                    get.uint64(8), get.uint64(9), get.real_or_nan(10)});
  }
  return rows;
}

void Store::save(const RunState& s, bool allow_rollback, const std::vector<StepRow>& rows) {
  if (!run()) {
    fail("coordinator database {}: bind it to a run before saving a state", path_.string());
  }
  // The crash points (core/crash_point.h) let tests kill the process between any two parts of
  // the transaction: a restart must find the previous state or this one, whole.
  crash_point("store.save.begin");
  Transaction transaction(db_, path_, "BEGIN IMMEDIATE");
  crash_point("store.save.after_begin");
  {
    Statement put(db_, path_, "INSERT OR REPLACE INTO run (key, value) VALUES ('state', ?)");
    put.bind_text(1, volatile_json(s).dump()).run();
  }
  crash_point("store.save.after_state");
  {
    // The ledger only grows: insert the steps the file does not hold yet.
    Statement count(db_, path_, "SELECT COUNT(*) FROM finalized_steps");
    count.step();
    const uint64_t on_disk = count.uint64(0);
    if (on_disk > s.finalized.size() && allow_rollback) {
      // The run went back to a checkpoint (every member had left): the undone steps go.
      Statement drop_steps(db_, path_, "DELETE FROM finalized_steps WHERE step >= ?");
      drop_steps.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
      Statement drop_rows(db_, path_, "DELETE FROM ledger WHERE step >= ?");
      drop_rows.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
      Statement drop_stats(db_, path_, "DELETE FROM step_stats WHERE step >= ?");
      drop_stats.bind(1, static_cast<uint64_t>(s.finalized.size())).run();
    } else if (on_disk > s.finalized.size()) {
      fail(
          "coordinator database {} holds {} finalized steps but the state to save has {}: "
          "the ledger never shrinks (is this the state of another run?)",
          path_.string(), on_disk, s.finalized.size());
    }
    Statement step(db_, path_, "INSERT INTO finalized_steps (step, payloads) VALUES (?, ?)");
    Statement row(db_, path_,
                  "INSERT INTO ledger (step, position, author, payload_hash, signature) "
                  "VALUES (?, ?, ?, ?, ?)");
    for (uint64_t t = std::min<uint64_t>(on_disk, s.finalized.size()); t < s.finalized.size();
         ++t) {
      step.bind(1, t).bind(2, static_cast<int64_t>(s.finalized[t].size())).run();
      for (size_t i = 0; i < s.finalized[t].size(); ++i) {
        const CommitRecord& c = s.finalized[t][i];
        row.bind(1, t)
            .bind(2, static_cast<int64_t>(i))
            .bind_blob(3, c.author)
            .bind_blob(4, c.payload_hash)
            .bind_blob(5, c.signature)
            .run();
      }
    }
  }
  {
    Statement put(db_, path_,
                  "INSERT OR REPLACE INTO step_stats (step, at, loss, val_loss, learning_rate, "
                  "tokens_per_second, payload_bytes, allreduce_bytes, peers, sequences, "
                  "seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const StepRow& r : rows) {
      put.bind(1, r.step)
          .bind(2, r.at)
          .bind_real(3, r.loss)
          .bind_real(4, r.val_loss)
          .bind_real(5, r.learning_rate)
          .bind_real(6, r.tokens_per_second)
          .bind_real(7, r.payload_bytes)
          .bind_real(8, r.allreduce_bytes)
          .bind(9, r.peers)
          .bind(10, r.sequences)
          .bind_real(11, r.seconds)
          .run();
    }
  }
  crash_point("store.save.after_ledger");
  exec("DELETE FROM members");
  {
    Statement row(db_, path_,
                  "INSERT INTO members (key, endpoint, agent, state, drop_reason, strikes, "
                  "sequences_per_second, last_seen, applied_steps, checkpointer, joined_at) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const auto& [key, m] : s.members) {
      row.bind_blob(1, key)
          .bind_text(2, m.endpoint)
          .bind_text(3, m.agent)
          .bind(4, static_cast<int64_t>(m.state))
          .bind(5, static_cast<int64_t>(m.drop_reason))
          .bind(6, m.strikes)
          .bind(7, m.sequences_per_second)
          .bind(8, m.last_seen)
          .bind(9, m.applied_steps)
          .bind(10, static_cast<int64_t>(m.checkpointer ? 1 : 0))
          .bind(11, m.joined_at)
          .run();
    }
  }
  crash_point("store.save.after_members");
  exec("DELETE FROM state_reports");
  exec("DELETE FROM state_records");
  {
    Statement report(db_, path_,
                     "INSERT INTO state_reports (applied_steps, reporter, state_hash, "
                     "resync_sent) VALUES (?, ?, ?, ?)");
    Statement record(db_, path_,
                     "INSERT INTO state_records (applied_steps, state_hash, tensor_names, "
                     "tensor_hashes) VALUES (?, ?, ?, ?)");
    for (const auto& [k, r] : s.state_reports) {
      for (const PublicKey& key : r.resynced) {
        if (!r.reported.contains(key)) {
          fail("coordinator database {}: member {} was resynced for step {} without a report",
               path_.string(), hex_encode(key), k);
        }
      }
      for (const auto& [key, hash] : r.reported) {
        report.bind(1, k)
            .bind_blob(2, key)
            .bind_blob(3, hash)
            .bind(4, static_cast<int64_t>(r.resynced.contains(key) ? 1 : 0))
            .run();
      }
      for (const auto& [hash, rec] : r.records) {
        json hashes = json::array();
        for (const std::string& h : rec.tensor_hashes) hashes.push_back(hex_encode(h));
        record.bind(1, k)
            .bind_blob(2, hash)
            .bind_text(3, json(rec.tensor_names).dump())
            .bind_text(4, hashes.dump())
            .run();
      }
    }
  }
  crash_point("store.save.after_reports");
  exec("DELETE FROM checkpoints");
  {
    Statement row(db_, path_,
                  "INSERT INTO checkpoints (position, applied_steps, state_hash, path, "
                  "reporter, at) VALUES (?, ?, ?, ?, ?, ?)");
    for (size_t i = 0; i < s.checkpoints.size(); ++i) {
      const CheckpointRecord& c = s.checkpoints[i];
      row.bind(1, static_cast<int64_t>(i))
          .bind(2, c.applied_steps)
          .bind_blob(3, c.state_hash)
          .bind_text(4, c.path)
          .bind_blob(5, c.reporter)
          .bind(6, c.at)
          .run();
    }
  }
  {
    // Events are history: append the ones newer than the file's newest.
    Statement newest(db_, path_, "SELECT COALESCE(MAX(seq), 0) FROM events");
    newest.step();
    const uint64_t last = newest.uint64(0);
    Statement row(db_, path_, "INSERT INTO events (seq, at, text, kind) VALUES (?, ?, ?, ?)");
    for (const Event& e : s.events) {
      if (e.seq > last) {
        row.bind(1, e.seq).bind(2, e.at).bind_text(3, e.text).bind_text(4, to_string(e.kind)).run();
      }
    }
  }
  crash_point("store.save.before_commit");
  transaction.commit();
  crash_point("store.save.after_commit");
}

}  // namespace agora::coord
