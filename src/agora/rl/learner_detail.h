// The learner's state and its parts, shared by learner_server.cc (the loop and the updates),
// learner_messages.cc (what each worker message does) and learner_status.cc (the page, the API
// and the metrics). Private to those files: the interface is learner_server.h.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/event_log.h"
#include "agora/obs/metrics.h"
#include "agora/rl/learner_server.h"
#include "agora/rl/policy_versions.h"
#include "agora/rl/rollout.h"
#include "agora/rl/rollout_intake.h"
#include "agora/rl/slot_pool.h"
#include "agora/rl/task.h"
#include "agora/serve/members.h"
#include "agora/serve/param_feed.h"
#include "agora/serve/status_server.h"
#include "agora/train/published_policy.h"

namespace agora::learner_detail {

using Clock = std::chrono::steady_clock;

// Rollouts re-scored in one forward pass, at most.
inline constexpr size_t kRescoreBatch = 64;
// Replies waiting per connection: a receipt per rollout, so a step's worth and more.
inline constexpr int kReplyQueue = 16384;
// Text a worker sends that lands in logs (its agent string), at most.
inline constexpr size_t kMaxAgentBytes = 200;

// What the learner keeps of a worker beyond what every member has (serve/members.h: its key,
// name, rate, joined_at, last_seen, banned). Its strikes and ban live in the intake, by name.
struct WorkerState {
  int64_t accepted = 0, refused = 0;
  bool ban_logged = false;
  // Policy bytes queued to it and not yet written: one worker that never reads cannot hold the
  // policy back from the others.
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
};
using Worker = serve::Member<WorkerState>;

// A rollout past the intake, waiting for re-scoring (done in batches, one per version).
struct Pending {
  std::string curve, route;
  Rollout rollout;
};

// See learner_server.h. One thread runs everything but the HTTP handlers, which read only
// status_ (under status_mutex_) and the metrics registry (thread-safe).
class Learner {
 public:
  Learner(LoadedCheckpoint base, const net::Identity& identity, const LearnerOptions& options);
  GrpoTrainSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  void open_step();
  void handle(const net::Incoming& in);
  void on_hello(const net::Incoming& in);
  void on_get_params(const net::Incoming& in, Worker& w);
  void on_get_work(const net::Incoming& in, Worker& w);
  void on_rollout(const net::Incoming& in, Worker& w);
  void receipt(const std::string& route, const Rollout* rollout, std::string_view verdict,
               const std::string& reason, Worker& w);
  void rescore_pending();
  void rescore(uint64_t version, std::vector<Pending>& batch);
  // Forgets workers not heard from for kWorkerIdleSeconds (their ban stays in the intake).
  void evict_idle();
  void train_step();
  bool step_ready() const;
  void start_http();
  // Copies what the page, /api/rl and /metrics show; after every update and once a second.
  void publish_status();
  void log_event(nlohmann::json row);
  // Restarts (learner_durable.cc): the options that must match to resume, a save of what a
  // restart needs, and resuming from the newest save (false: none, or a finished run's).
  std::string fingerprint() const;
  void save_resume(bool finished);
  bool resume();

  LearnerOptions options_;
  LoadedCheckpoint base_;
  Llama& live_;  // the model trained (base_.model)
  std::unique_ptr<Tokenizer> tokenizer_;
  TokenId eot_;
  std::unique_ptr<Task> task_;
  torch::optim::AdamW optimizer_;
  PublishedPolicy published_;
  PolicyVersions versions_;
  std::string base_hash_;
  std::string key_hex_;  // the learner's public key, which workers are given
  RolloutIntake intake_;
  SlotPool pool_;
  net::Context context_;
  net::Server server_;
  serve::ParamFeed feed_;  // published_'s versions to the workers
  serve::Members<WorkerState> workers_;
  std::vector<Pending> pending_;
  std::map<SlotId, std::pair<std::string, Rollout>> filled_;  // slot -> (worker, rollout)
  std::mt19937_64 rescore_draw_;

  uint64_t cursor_ = 0;
  int64_t step_ = 0;  // updates done
  std::vector<Problem> problems_;
  std::map<uint64_t, std::vector<TokenId>> prompts_;  // the open problems' prompt tokens
  double step_opened_ = 0;
  int64_t submitted_ = 0, refused_ = 0;      // this step's
  int64_t rollouts_ = 0;                     // all submissions so far
  std::map<std::string, int64_t> receipts_;  // by verdict, every receipt sent
  double last_held_out_ = 0;
  GrpoTrainSummary summary_;
  obs::EventLog events_;
  const Clock::time_point started_ = Clock::now();

  obs::Registry metrics_;
  std::vector<GrpoStepStats> history_;
  bool resumed_ = false;
  std::unique_ptr<serve::StatusServer> http_;  // --http: /metrics, /api/rl, web/rl.html
};

}  // namespace agora::learner_detail
