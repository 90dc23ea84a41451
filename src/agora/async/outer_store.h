// OuterStore: the asynchronous server's state on disk, so that `agora async serve` killed at any
// moment (kill -9, a power cut) and started again with the same --out resumes where its workers
// last heard from it (docs/async.md section 2, "Restarts").
//
// What it promises:
//   - save() is atomic: a kill at any moment leaves the previous save or the new one. The
//     tensors go to a new file, tensors-<n>.safetensors, written (atomically) before the SQLite
//     transaction that names it commits; the file it replaces is deleted after the commit, and
//     files no save names are deleted when the store opens;
//   - load() gives back what the last save wrote;
//   - a store belongs to one run: opening it for another fingerprint (other run config, method
//     or options that change the numbers) is an Error naming the folder and what to do, unless
//     that run finished (its last save says "finished": true) or never saved: then the folder
//     is the new run's.
//
// Layout in `dir`: state.db (serve/sqlite.h: WAL, synchronous=FULL) with table meta (schema
// version, fingerprint) and table saves (one row: the server's scalars and its workers' ledger
// as JSON, the tensor file's name); the tensor files; snapshot-<k>.safetensors, the copies of
// theta taken for validation after the run (written when taken).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agora/serve/sqlite.h"

namespace agora {

struct OuterTensors {
  std::vector<torch::Tensor> theta, momentum, published;
  std::vector<torch::Tensor> round_sum;  // sync: the round's accepted pseudo-gradients, summed
};

struct OuterSave {
  nlohmann::json state;
  OuterTensors tensors;
};

class OuterStore {
 public:
  OuterStore(const std::filesystem::path& dir, const std::string& fingerprint);

  // The last save, or nothing for a new run.
  std::optional<OuterSave> load();
  // Saves `state`, with new tensors when `tensors` is given (else the last file stays named).
  void save(const nlohmann::json& state, const OuterTensors* tensors);
  // Forgets every save (a finished run's folder started again: a new run).
  void clear();

  // A copy of theta for validation, as file `index`; and reading it back.
  void save_snapshot(int64_t index, const std::vector<torch::Tensor>& theta);
  std::vector<torch::Tensor> load_snapshot(int64_t index) const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path snapshot_path(int64_t index) const;

  std::filesystem::path dir_, db_path_;
  serve::DatabaseHandle db_;
  std::string tensor_file_;  // named by the last save ("" for none)
  int64_t sequence_ = 0;     // saves so far: the next tensor file's number
};

}  // namespace agora
