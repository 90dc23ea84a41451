#include "agora/serve/sqlite.h"

#include <fmt/format.h>

#include "agora/core/error.h"

namespace agora::serve {

void sqlite_fail(sqlite3* db, const std::filesystem::path& path, std::string_view what) {
  fail("database {}: {} failed: {}", path.string(), what,
       db != nullptr ? sqlite3_errmsg(db) : "out of memory");
}

void run_sql(sqlite3* db, const std::filesystem::path& path, const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string text = message != nullptr ? message : sqlite3_errmsg(db);
    sqlite3_free(message);
    fail("database {}: '{}' failed: {}", path.string(), std::string_view(sql).substr(0, 60), text);
  }
}

DatabaseHandle open_database(const std::filesystem::path& path) {
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  DatabaseHandle db(raw);  // closed on every way out, including a failed open
  if (rc != SQLITE_OK) sqlite_fail(raw, path, "opening");
  if (sqlite3_busy_timeout(raw, 5000) != SQLITE_OK)
    sqlite_fail(raw, path, "setting a busy timeout");
  {
    Statement wal(raw, path, "PRAGMA journal_mode=WAL");
    if (!wal.step() || wal.text(0) != "wal") {
      fail(
          "database {}: could not switch to WAL journal mode (is it on a file system without "
          "shared memory, such as some network mounts?)",
          path.string());
    }
  }
  run_sql(raw, path, "PRAGMA synchronous=FULL");
  return db;
}

Statement::Statement(sqlite3* db, const std::filesystem::path& path, const char* sql)
    : db_(db), path_(path), sql_(sql) {
  if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
    sqlite_fail(db, path, fmt::format("preparing '{}'", sql));
  }
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  sqlite_fail(db_, path_, fmt::format("running '{}'", sql_));
}

void Statement::run() {
  while (step()) {
  }
  check(sqlite3_reset(stmt_));
  check(sqlite3_clear_bindings(stmt_));
}

std::string Statement::text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : "";
}

std::string Statement::blob(int col) const {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : "";
}

Statement& Statement::check(int rc) {
  if (rc != SQLITE_OK) sqlite_fail(db_, path_, fmt::format("binding '{}'", sql_));
  return *this;
}

Transaction::Transaction(sqlite3* db, const std::filesystem::path& path, const char* begin)
    : db_(db), path_(path) {
  run_sql(db, path, begin);
}

Transaction::~Transaction() {
  if (!committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  run_sql(db_, path_, "COMMIT");
  committed_ = true;
}

}  // namespace agora::serve
