// SQLite for servers that must survive a crash: the plumbing every durable role shares (the
// coordinator's store, the asynchronous server's state).
//
// open_database() opens or creates a file in WAL journal mode (readers, such as an operator's
// sqlite3 shell, never block the server) with synchronous=FULL: a committed transaction is on
// disk when commit() returns, which is what "nothing is sent before it is durable" needs.
// Every return code is checked; every error is an Error that names the file and the SQL.
// Not thread-safe: one thread uses a connection.
#pragma once

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace agora::serve {

[[noreturn]] void sqlite_fail(sqlite3* db, const std::filesystem::path& path,
                              std::string_view what);

// Runs SQL that returns no rows.
void run_sql(sqlite3* db, const std::filesystem::path& path, const char* sql);

struct CloseDatabase {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
using DatabaseHandle = std::unique_ptr<sqlite3, CloseDatabase>;

// Opens (creating) `path` in WAL mode with synchronous=FULL and a 5 s busy timeout.
DatabaseHandle open_database(const std::filesystem::path& path);

// A prepared statement, finalized when it goes out of scope.
class Statement {
 public:
  Statement(sqlite3* db, const std::filesystem::path& path, const char* sql);
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  Statement& bind(int i, int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& bind(int i, uint64_t v) { return bind(i, static_cast<int64_t>(v)); }
  Statement& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Statement& bind_text(int i, std::string_view v) {
    return check(
        sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Statement& bind_blob(int i, std::string_view v) {
    // A zero-length blob must still be a blob, not NULL.
    return check(sqlite3_bind_blob(stmt_, i, v.empty() ? "" : v.data(), static_cast<int>(v.size()),
                                   SQLITE_TRANSIENT));
  }
  // SQLite stores a bound NaN as NULL; it reads back as NaN.
  Statement& bind_real(int i, double v) {
    return check(std::isnan(v) ? sqlite3_bind_null(stmt_, i) : sqlite3_bind_double(stmt_, i, v));
  }

  // True while a row is available.
  bool step();
  // Runs a statement that returns no rows, ready to be bound and run again.
  void run();

  double real_or_nan(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? NAN : real(col);
  }
  int64_t int64(int col) const { return sqlite3_column_int64(stmt_, col); }
  uint64_t uint64(int col) const { return static_cast<uint64_t>(int64(col)); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const;
  std::string blob(int col) const;

 private:
  Statement& check(int rc);

  sqlite3* db_;
  const std::filesystem::path& path_;
  const char* sql_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Begins a transaction; one that ends without commit() (an exception, an early return) is
// rolled back, so the file never keeps half of a change.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::filesystem::path& path, const char* begin = "BEGIN");
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  sqlite3* db_;
  const std::filesystem::path& path_;
  bool committed_ = false;
};

}  // namespace agora::serve
