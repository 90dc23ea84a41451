// The learner's state and its parts, shared by learner_server.cc (the loop and the updates),
// learner_messages.cc (what each worker message does) and learner_status.cc (the page, the API
// and the metrics). Private to those files: the interface is learner_server.h.
#pragma once

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "agora/core/token_bucket.h"
#include "agora/data/tokenizer.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/http_server.h"
#include "agora/obs/metrics.h"
#include "agora/rl/learner_server.h"
#include "agora/rl/policy_versions.h"
#include "agora/rl/rollout.h"
#include "agora/rl/rollout_intake.h"
#include "agora/rl/slot_pool.h"
#include "agora/rl/task.h"
#include "agora/train/published_policy.h"

namespace agora::learner_detail {

using Clock = std::chrono::steady_clock;

// A worker silent this long is forgotten (its slots go back, a banned one's ban stays).
inline constexpr double kWorkerIdleSeconds = 120;
// Rollouts re-scored in one forward pass, at most.
inline constexpr size_t kRescoreBatch = 64;
// Hellos from keys the learner does not know yet, a second and at once.
inline constexpr double kHellosPerSecond = 20, kHelloBurst = 100;
// Replies waiting per connection: a receipt per rollout, so a step's worth and more.
inline constexpr int kReplyQueue = 16384;
// Text a worker sends that lands in logs (its agent string), at most.
inline constexpr size_t kMaxAgentBytes = 200;

// A worker that said hello, by the key it proved.
struct Worker {
  net::PublicKey key;  // ed25519
  std::string name;    // its key in hex: the intake's and the logs' name for it
  TokenBucket rate;
  int64_t accepted = 0, refused = 0;
  double joined_s = 0, last_seen_s = 0;
  bool ban_logged = false;
  // Policy bytes queued to it and not yet written: one worker that never reads cannot hold the
  // policy back from the others.
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
};

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
  void on_get_policy(const net::Incoming& in, Worker& w);
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
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
  // The encoded RlPolicy envelope that moves version v - 1 to v, for the newest versions.
  std::map<uint64_t, std::shared_ptr<const std::string>> deltas_;
  std::shared_ptr<const std::string> whole_;  // of the newest version, made when first asked
  std::map<std::string, Worker> workers_;     // by curve key
  TokenBucket hellos_;                        // from keys not in workers_, all together
  std::vector<Pending> pending_;
  std::map<SlotId, std::pair<std::string, Rollout>> filled_;  // slot -> (worker, rollout)
  std::mt19937_64 rescore_draw_;

  uint64_t cursor_ = 0;
  int64_t step_ = 0;  // updates done
  std::vector<Problem> problems_;
  std::map<uint64_t, std::vector<TokenId>> prompts_;  // the open problems' prompt tokens
  double step_opened_ = 0;
  int64_t submitted_ = 0, refused_ = 0;  // this step's
  int64_t rollouts_ = 0;                 // all submissions so far
  std::map<std::string, int64_t> receipts_;  // by verdict, every receipt sent
  double last_held_out_ = 0;
  GrpoTrainSummary summary_;
  std::ofstream events_;
  const Clock::time_point started_ = Clock::now();

  obs::Registry metrics_;
  std::mutex status_mutex_;
  nlohmann::json status_;
  std::vector<GrpoStepStats> history_;
  std::unique_ptr<obs::HttpServer> http_;
};

}  // namespace agora::learner_detail
