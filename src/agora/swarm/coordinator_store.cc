#include "agora/swarm/coordinator_store.h"

#include <chrono>

#include "agora/core/error.h"

namespace agora {
namespace fs = std::filesystem;
using serve::Statement;
using serve::Transaction;

namespace {

constexpr const char* kSchemaVersion = "1";
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), state TEXT NOT NULL,
                                  clock TEXT NOT NULL, saved_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (step INTEGER NOT NULL, stage INTEGER NOT NULL, key BLOB NOT NULL,
                                   payload BLOB NOT NULL, PRIMARY KEY (step, stage, key));
)sql";

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string meta_value(sqlite3* db, const fs::path& path, const char* key) {
  Statement get(db, path, "SELECT value FROM meta WHERE key = ?");
  get.bind_text(1, key);
  return get.step() ? get.text(0) : "";
}

void put_meta(sqlite3* db, const fs::path& path, const char* key, const std::string& value) {
  Statement put(db, path, "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
  put.bind_text(1, key).bind_text(2, value).run();
}

// The saved phase, or "" when nothing is saved.
std::string saved_phase(sqlite3* db, const fs::path& path) {
  Statement get(db, path, "SELECT state FROM state WHERE id = 1");
  if (!get.step()) return "";
  const nlohmann::json state = nlohmann::json::parse(get.text(0), nullptr, false);
  return state.is_object() ? state.value("phase", "?") : "?";
}

}  // namespace

SwarmStore::SwarmStore(const fs::path& dir, const std::string& fingerprint)
    : path_(dir / "state.db") {
  fs::create_directories(dir);
  db_ = serve::open_database(path_);
  Transaction transaction(db_.get(), path_, "BEGIN IMMEDIATE");
  serve::run_sql(db_.get(), path_, kSchema);
  const std::string version = meta_value(db_.get(), path_, "schema_version");
  const std::string phase = saved_phase(db_.get(), path_);
  if (version.empty()) {
    put_meta(db_.get(), path_, "schema_version", kSchemaVersion);
  } else if (version != kSchemaVersion) {
    fail("{} has schema version {}; this agora reads version {} (use another --out)",
         path_.string(), version, kSchemaVersion);
  } else if (meta_value(db_.get(), path_, "fingerprint") != fingerprint && !phase.empty() &&
             phase != "finished") {
    fail(
        "{} holds an unfinished swarm run started with another run config or schedule; start "
        "the coordinator again with those (to resume it), or give another --out",
        path_.string());
  }
  if (phase == "finished" || meta_value(db_.get(), path_, "fingerprint") != fingerprint) {
    serve::run_sql(db_.get(), path_, "DELETE FROM state; DELETE FROM rounds;");
  }
  put_meta(db_.get(), path_, "fingerprint", fingerprint);
  transaction.commit();
}

std::optional<SwarmStore::Saved> SwarmStore::load() {
  Statement get(db_.get(), path_, "SELECT state, clock, saved_at FROM state WHERE id = 1");
  if (!get.step()) return std::nullopt;
  Saved saved;
  try {
    saved.durable.state = nlohmann::json::parse(get.text(0));
    saved.durable.clock = nlohmann::json::parse(get.text(1));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the saved swarm state is not JSON ({})", path_.string(), e.what());
  }
  saved.age_seconds = std::max(0.0, wall_seconds() - get.real(2));
  Statement rounds(db_.get(), path_, "SELECT step, stage, key, payload FROM rounds");
  while (rounds.step()) {
    saved.rounds.push_back({rounds.uint64(0), rounds.int64(1), rounds.blob(2), rounds.blob(3)});
  }
  return saved;
}

void SwarmStore::save(const SwarmSchedule::Durable& durable,
                      const std::vector<SwarmSchedule::Contribution>& arrived) {
  Transaction transaction(db_.get(), path_, "BEGIN IMMEDIATE");
  Statement put(db_.get(), path_,
                "INSERT OR REPLACE INTO state (id, state, clock, saved_at) VALUES (1, ?, ?, ?)");
  put.bind_text(1, durable.state.dump())
      .bind_text(2, durable.clock.dump())
      .bind(3, wall_seconds())
      .run();
  Statement add(db_.get(), path_,
                "INSERT OR IGNORE INTO rounds (step, stage, key, payload) VALUES (?, ?, ?, ?)");
  for (const SwarmSchedule::Contribution& c : arrived) {
    add.bind(1, c.step).bind(2, c.stage).bind_blob(3, c.key).bind_blob(4, c.payload).run();
  }
  // The rounds a restart needs: the current step's and the last completed one's.
  const nlohmann::json& s = durable.state;
  const uint64_t keep = s.value("have_completed", false) ? s.value("completed_step", uint64_t{0})
                                                         : s.value("step", uint64_t{0});
  Statement forget(db_.get(), path_, "DELETE FROM rounds WHERE step < ?");
  forget.bind(1, keep).run();
  transaction.commit();
}

}  // namespace agora
