#include "agora/async/outer_store.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>
#include <utility>

#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace fs = std::filesystem;
using serve::Statement;
using serve::Transaction;

namespace {

constexpr const char* kSchemaVersion = "1";
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS saves (id INTEGER PRIMARY KEY CHECK (id = 1), sequence INTEGER NOT NULL,
                                  state TEXT NOT NULL, tensors TEXT NOT NULL);
)sql";

// The groups of OuterTensors, by the prefix of their names in the file.
constexpr std::pair<const char*, std::vector<torch::Tensor> OuterTensors::*> kGroups[] = {
    {"theta", &OuterTensors::theta},
    {"momentum", &OuterTensors::momentum},
    {"published", &OuterTensors::published},
    {"round_sum", &OuterTensors::round_sum}};

std::string meta_value(sqlite3* db, const fs::path& path, const char* key) {
  Statement get(db, path, "SELECT value FROM meta WHERE key = ?");
  get.bind_text(1, key);
  return get.step() ? get.text(0) : "";
}

// Removes the files of `dir` whose names `doomed` picks (listed first: no removal while iterating).
void remove_files(const fs::path& dir, const std::function<bool(const std::string&)>& doomed) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (doomed(entry.path().filename().string())) files.push_back(entry.path());
  }
  for (const fs::path& f : files) fs::remove(f);
}

void put_meta(sqlite3* db, const fs::path& path, const char* key, const std::string& value) {
  Statement put(db, path, "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
  put.bind_text(1, key).bind_text(2, value).run();
}

}  // namespace

OuterStore::OuterStore(const fs::path& dir, const std::string& fingerprint)
    : dir_(dir), db_path_(dir / "state.db") {
  fs::create_directories(dir_);
  db_ = serve::open_database(db_path_);
  Transaction transaction(db_.get(), db_path_, "BEGIN IMMEDIATE");
  serve::run_sql(db_.get(), db_path_, kSchema);
  const std::string version = meta_value(db_.get(), db_path_, "schema_version");
  if (version.empty()) {
    put_meta(db_.get(), db_path_, "schema_version", kSchemaVersion);
    put_meta(db_.get(), db_path_, "fingerprint", fingerprint);
  } else if (version != kSchemaVersion) {
    fail("{} has schema version {}; this agora reads version {} (use another --out)",
         db_path_.string(), version, kSchemaVersion);
  } else if (meta_value(db_.get(), db_path_, "fingerprint") != fingerprint) {
    // Another run's folder: free to take when that run finished (or never saved).
    Statement get(db_.get(), db_path_, "SELECT state FROM saves WHERE id = 1");
    bool unfinished = false;
    if (get.step()) {
      // A state that does not say it finished (or cannot be read) is kept: refusing is safe.
      const nlohmann::json state = nlohmann::json::parse(get.text(0), nullptr, false);
      unfinished = !state.is_object() || !state.value("finished", false);
    }
    if (unfinished) {
      fail(
          "{} holds the state of an unfinished run started with another run config, method or "
          "options; start it again with those (to resume it), or give another --out",
          db_path_.string());
    }
    serve::run_sql(db_.get(), db_path_, "DELETE FROM saves");
    put_meta(db_.get(), db_path_, "fingerprint", fingerprint);
  }
  transaction.commit();
  Statement get(db_.get(), db_path_, "SELECT sequence, tensors FROM saves WHERE id = 1");
  if (get.step()) {
    sequence_ = get.int64(0);
    tensor_file_ = get.text(1);
  }
  // Tensor files no save names: left by a kill between writing one and committing its save, or
  // by a finished run whose folder a new run took.
  remove_files(dir_, [&](const std::string& name) {
    return name.rfind("tensors-", 0) == 0 && name != tensor_file_;
  });
}

std::optional<OuterSave> OuterStore::load() {
  Statement get(db_.get(), db_path_, "SELECT state FROM saves WHERE id = 1");
  if (!get.step()) return std::nullopt;
  OuterSave save;
  try {
    save.state = nlohmann::json::parse(get.text(0));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the saved state is not JSON ({})", db_path_.string(), e.what());
  }
  if (tensor_file_.empty()) fail("{}: the saved state names no tensor file", db_path_.string());
  std::map<std::string, torch::Tensor> tensors = load_tensors(dir_ / tensor_file_);
  for (const auto& [prefix, group] : kGroups) {
    for (size_t i = 0;; ++i) {
      const auto it = tensors.find(fmt::format("{}.{}", prefix, i));
      if (it == tensors.end()) break;
      (save.tensors.*group).push_back(it->second);
    }
  }
  return save;
}

void OuterStore::save(const nlohmann::json& state, const OuterTensors* tensors) {
  std::string file = tensor_file_;
  if (tensors) {
    file = fmt::format("tensors-{}.safetensors", sequence_ + 1);
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& [prefix, group] : kGroups) {
      const std::vector<torch::Tensor>& list = tensors->*group;
      for (size_t i = 0; i < list.size(); ++i)
        named.emplace_back(fmt::format("{}.{}", prefix, i), list[i]);
    }
    save_tensors(dir_ / file, named, {{"format", "agora-async-state"}});
    crash_point("async_store.tensors_written");
  }
  Transaction transaction(db_.get(), db_path_, "BEGIN IMMEDIATE");
  Statement put(db_.get(), db_path_,
                "INSERT OR REPLACE INTO saves (id, sequence, state, tensors) VALUES (1, ?, ?, ?)");
  put.bind(1, sequence_ + 1)
      .bind_text(2, state.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .bind_text(3, file)
      .run();
  transaction.commit();
  ++sequence_;
  if (file != tensor_file_ && !tensor_file_.empty()) fs::remove(dir_ / tensor_file_);
  tensor_file_ = file;
}

void OuterStore::clear() {
  Transaction transaction(db_.get(), db_path_, "BEGIN IMMEDIATE");
  serve::run_sql(db_.get(), db_path_, "DELETE FROM saves");
  transaction.commit();
  remove_files(dir_, [](const std::string& name) {
    return name.rfind("tensors-", 0) == 0 || name.rfind("snapshot-", 0) == 0;
  });
  tensor_file_.clear();
}

fs::path OuterStore::snapshot_path(int64_t index) const {
  return dir_ / fmt::format("snapshot-{}.safetensors", index);
}

void OuterStore::save_snapshot(int64_t index, const std::vector<torch::Tensor>& theta) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < theta.size(); ++i)
    named.emplace_back(fmt::format("theta.{}", i), theta[i]);
  save_tensors(snapshot_path(index), named, {{"format", "agora-async-snapshot"}});
}

std::vector<torch::Tensor> OuterStore::load_snapshot(int64_t index) const {
  std::map<std::string, torch::Tensor> tensors = load_tensors(snapshot_path(index));
  std::vector<torch::Tensor> theta;
  for (size_t i = 0;; ++i) {
    const auto it = tensors.find(fmt::format("theta.{}", i));
    if (it == tensors.end()) break;
    theta.push_back(it->second);
  }
  return theta;
}

}  // namespace agora
