// The outer server's state and its parts, shared by outer_server.cc (the loop, theta and the
// validation) and outer_messages.cc (what each worker message does). Private to those files: the
// interface is outer_server.h.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agora/async/outer_server.h"
#include "agora/async/outer_store.h"
#include "agora/async/rules.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/event_log.h"
#include "agora/obs/metrics.h"
#include "agora/optim/async_outer.h"
#include "agora/serve/data_service.h"
#include "agora/serve/members.h"
#include "agora/serve/param_feed.h"
#include "agora/serve/status_server.h"
#include "agora/train/published_policy.h"

namespace agora::outer_detail {

using Clock = std::chrono::steady_clock;

// Deltas kept for workers catching up; one further behind gets the whole parameters.
inline constexpr uint64_t kDeltasKept = 64;
// Copies of theta kept for validation after the run, at most.
inline constexpr double kMaxSnapshots = 1000;
inline constexpr double kMaxSnapshotBytes = 8e9;

struct Work {
  uint64_t id = 0;
  uint64_t version = 0;  // the parameters it starts from
  uint64_t first_sequence = 0;
  int64_t steps = 0;
  double handed_at = 0;
};

// What the server keeps of a worker beyond what every member has (serve/members.h: its key,
// name, rate, last_seen, banned).
struct WorkerState {
  int strikes = 0;
  int64_t accepted = 0;
  std::optional<Work> work;
  PaceEstimate pace;
  uint64_t delivered_round = UINT64_MAX;  // sync: the last version it delivered for
  // The newest version the feed sent it: work is handed out only to a worker this says holds
  // the newest, never on its word alone (have_version).
  uint64_t sent_version = 0;
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
};
using Worker = serve::Member<WorkerState>;

// The member limits of a run: a worker silent for two minutes is forgotten (its work lapses; a
// ban stays), hellos from strangers at most 20 a second.
serve::MemberLimits worker_limits(const OuterServerOptions& o);

// A copy of theta for validation after the run: on disk (OuterStore::save_snapshot), so it
// survives a restart and costs no memory.
struct Snapshot {
  OuterEvalPoint point;
  int64_t index = 0;
};

// See outer_server.h. One thread runs everything: the loop, the messages, the outer steps.
class Server {
 public:
  Server(const RunConfig& config, const net::Identity& identity, const OuterServerOptions& o);
  OuterServerSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  // The run started (its workers joined); a resumed run's start may lie before this process's.
  bool running() const { return !std::isnan(started_run_); }
  double run_seconds() const { return !running() ? 0 : now() - started_run_; }
  void handle(const net::Incoming& in);
  void on_hello(const net::Incoming& in);
  void on_get_params(const std::string& route, const wire::GetParams& ask, Worker& w);
  void on_get_work(const net::Incoming& in, Worker& w);
  void on_delivery(const net::Incoming& in, Worker& w);
  void receipt(const net::Incoming& in, uint64_t work_id, std::string_view verdict,
               const std::string& reason, Worker& w);
  void apply(const std::vector<torch::Tensor>& d);  // moves theta, publishes the new version
  // Nothing is sent before it is durable: answers wait in after_save_ until persist() saved
  // what they tell (outer_durable.cc).
  void reply(const std::string& route, wire::Envelope e);
  void persist();
  nlohmann::json durable_state(bool finished) const;
  void restore(const OuterSave& save);
  std::string fingerprint() const;
  void snapshot_due(bool force);
  void progress_line(bool force);
  void log(nlohmann::json row);
  int64_t serving() const { return workers_.serving(); }  // workers not banned
  // Drops the worker's work; under sync, a piece of the current round counts as resolved.
  void lapse(Worker& w);
  // sync: the round's deadline (OuterServerOptions::min_deadline), and what passing it does.
  double round_deadline() const;
  // The measured seconds per inner step of every worker not banned that has one, but `except`:
  // each worker one value however often it delivers.
  std::vector<double> paces(const Worker* except = nullptr) const;
  void enforce_round_deadline();
  void strike(Worker& w, const std::string& why);
  void start_http();
  // Copies what /api/async and /metrics show; once a second and at the end.
  void publish_status();

  RunConfig config_;
  OuterServerOptions o_;
  int64_t H_ = 0, sequences_per_step_ = 0;
  Llama live_;  // theta as a model, for publishing and the checkpoint
  AsyncOuter outer_;
  PublishedPolicy published_;
  std::string base_hash_;
  std::string key_hex_;  // the server's public key, which workers are given
  net::Context context_;
  net::Server server_;
  serve::ParamFeed feed_;  // published_'s versions to the workers
  serve::Members<WorkerState> workers_;
  // The run's data for workers without a copy (serve/data_mount.h); null when config_ names no
  // data.hash (a worker could not check what it fetched).
  std::unique_ptr<serve::DataService> data_;
  NormGuard guard_;
  uint64_t next_work_ = 1, next_sequence_ = 0;
  // sync: the round's accepted pseudo-gradients, summed, and how many.
  std::vector<torch::Tensor> round_sum_;
  int64_t round_accepted_ = 0, round_resolved_ = 0, round_handed_ = 0;
  double round_started_ = -1;   // the round's first hand-out (this process's clock), -1: none
  bool round_overdue_ = false;  // past its deadline: it closes with what was handed out
  std::vector<Snapshot> snapshots_;
  std::unique_ptr<OuterStore> store_;
  bool dirty_ = false;  // something a save must keep changed since the last one
  std::vector<std::function<void()>> after_save_;
  int64_t saved_updates_ = -1, saved_round_accepted_ = -1;
  bool resumed_ = false;
  double next_snapshot_ = 0;
  int64_t staleness_sum_ = 0, accepted_ = 0;
  OuterServerSummary summary_;
  obs::EventLog events_;
  const Clock::time_point started_ = Clock::now();
  double started_run_ = std::nan(""), last_progress_ = -10, last_status_ = -10;
  int64_t last_staleness_ = 0;

  obs::Registry metrics_;
  std::unique_ptr<serve::StatusServer> http_;  // --http: /metrics, /api/async, web/async.html
};

}  // namespace agora::outer_detail
