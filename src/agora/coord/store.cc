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
#include "agora/core/list_bits.h"
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
CREATE TABLE IF NOT EXISTS round_commits (
  author BLOB PRIMARY KEY, step INTEGER NOT NULL, payload_hash BLOB NOT NULL,
  signature BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS witness_holdings (
  step INTEGER NOT NULL, witness BLOB NOT NULL, held BLOB NOT NULL, PRIMARY KEY (step, witness));
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

Store::Store(std::filesystem::path path, sqlite3* db) : path_(std::move(path)), db_(db) {}

Store::Store(Store&& other) noexcept
    : path_(std::move(other.path_)),
      db_(std::exchange(other.db_, nullptr)),
      saved_(std::move(other.saved_)) {}

Store& Store::operator=(Store&& other) noexcept {
  if (this != &other) {
    if (db_ != nullptr) sqlite3_close(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
    saved_ = std::move(other.saved_);
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
      const json core = json::parse(get.text(0));
      if (is_split(core)) {
        core_from(core, s);
        load_in_flight(s);
      } else {
        volatile_from(core, s);  // a file written before saves were split
      }
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

void Store::load_in_flight(RunState& s) const {
  {
    Statement get(db_, path_, "SELECT key, value FROM run WHERE key IN ('round', 'collecting')");
    while (get.step()) {
      const json j = json::parse(get.text(1));
      if (get.text(0) == "round") {
        if (!j.is_null()) s.round = round_header_from(j);
      } else {
        for (const json& c : j) {
          CollectingStep step = collecting_header_from(c);
          const uint64_t t = step.step;
          s.collecting[t] = std::move(step);
        }
      }
    }
  }
  {
    Statement rows(db_, path_, "SELECT author, step, payload_hash, signature FROM round_commits");
    while (rows.step()) {
      if (!s.round || rows.uint64(1) != s.round->step) {
        fail(
            "coordinator database {}: a commit of the open round names step {}, and the open "
            "round is {}",
            path_.string(), rows.uint64(1),
            s.round ? std::to_string(s.round->step) : std::string("none"));
      }
      s.round->commits[rows.blob(0)] = {rows.blob(0), rows.uint64(1), rows.blob(2), rows.blob(3)};
    }
  }
  Statement rows(db_, path_, "SELECT step, witness, held FROM witness_holdings");
  while (rows.step()) {
    auto step = s.collecting.find(rows.uint64(0));
    const std::string held = rows.blob(2);
    if (step == s.collecting.end() || !list_bits_valid(held, step->second.commits.size())) {
      fail(
          "coordinator database {}: a witness's holdings for step {} do not match that step's "
          "commits",
          path_.string(), rows.uint64(0));
    }
    step->second.witnessed[rows.blob(1)] = held;
  }
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

}  // namespace agora::coord
