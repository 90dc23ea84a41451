// Monitor: what the coordinator shows over HTTP (its web page, the JSON API, /metrics), without
// letting the HTTP threads near the state machine.
//
// The state machine is single-threaded and pure, so the HTTP threads never read RunState. The
// service loop publishes an immutable RunView (a copy of the few parts worth showing) after
// handling messages, at most every 200 ms and whenever a step finalizes or the phase changes;
// a request takes a shared_ptr to the newest view under a mutex held only for that pointer
// copy, and renders from it. Step rows (the history) are append-only and kept here as well
// (loaded from the store at start, so the history survives a restart). A scrape therefore
// never blocks the coordinator's loop for longer than a pointer swap or a row append.
//
// The JSON API (all GET, application/json):
//   /api/run      {run_id, phase, step (finalized steps), total_steps, loss, val_loss (absent
//                 until a checkpointer reported one), learning_rate, tokens_per_second,
//                 payload_bytes_per_step, allreduce_bytes_per_step (newest step), peers
//                 {syncing, active, left, dropped}, counters {...RunState counters...},
//                 started_at (this process, unix seconds), uptime_seconds,
//                 model {preset, parameters, optimizer, batch_size, seq_len}}
//   /api/peers    [{key (64 hex), short, state, drop_reason (null unless dropped), endpoint,
//                 agent, sequences_per_second, share (of the open round, else the last one),
//                 strikes, last_seen_seconds_ago, applied_steps, checkpointer, payload_bytes
//                 and commits (accepted commits since this coordinator process started)}]
//   /api/history?since=S&events_since=Q
//                 {"steps": [{step, loss, val_loss?, lr, tokens_per_second, payload_bytes,
//                 allreduce_bytes, peers, seconds, at}] (steps > S, oldest first, at most
//                 kMaxHistoryRows: "more": true says to ask again from the last one),
//                 "events": [{seq, at, text, kind}] (seq > Q, the newest 256 at most; kind is
//                 join, leave, drop, checkpoint, rejection, resync, restart, phase or other)}
// Numbers that are unknown (a loss of a step committed before a restart) are null.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agora/coord/run_state.h"
#include "agora/coord/store.h"
#include "agora/obs/http_server.h"
#include "agora/obs/metrics.h"

namespace agora::coord {

// Fixed for the coordinator process.
struct RunInfo {
  std::string run_id;
  std::string preset;
  std::string optimizer;
  int64_t parameters = 0;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  uint64_t total_steps = 0;
  double started_at = 0;  // this process
};

// A member as shown, with what the service saw of it beyond RunState.
struct MemberView {
  MemberRecord member;
  double share = 0;  // of the open round's sequences, else of the newest round's
  uint64_t payload_bytes = 0;
  uint64_t commits = 0;
};

// One published moment of the run. Immutable once published.
struct RunView {
  double at = 0;  // when it was taken
  Phase phase = Phase::kWaitingForPeers;
  uint64_t finalized_steps = 0;
  Counters counters;
  std::vector<MemberView> members;
  std::deque<Event> events;
  // The coordinator's socket.
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::map<std::string, uint64_t> drops_by_reason;
  uint64_t messages_throttled = 0;  // dropped by the service's per-member rate limit
  // RoundStarts not sent again: the last one to that member still waited in the send queue.
  uint64_t round_starts_held = 0;
};

class Monitor {
 public:
  static constexpr size_t kMaxHistoryRows = 5000;

  Monitor(RunInfo info, std::vector<StepRow> history);

  // ---- the service loop ----
  void publish(std::shared_ptr<const RunView> view);
  // Rows of newly finalized steps; a row for a step already held replaces it and every later
  // one (a rollback re-finalized it).
  void add_rows(const std::vector<StepRow>& rows);
  void truncate(uint64_t finalized_steps);
  void observe_round(double seconds);

  // ---- any thread ----
  std::string run_json() const;
  std::string peers_json() const;
  std::string history_json(uint64_t since, bool has_since, uint64_t events_since) const;
  obs::Registry& registry() { return registry_; }
  // Routes /metrics, /api/run, /api/peers, /api/history and the page's assets.
  void add_routes(obs::HttpServer& server);

 private:
  std::shared_ptr<const RunView> view() const;
  void collect(obs::Registry& r);
  double newest_val_loss() const;

  RunInfo info_;
  mutable std::mutex mutex_;  // guards view_ and history_ (and the sums beside it)
  std::shared_ptr<const RunView> view_;
  std::vector<StepRow> history_;
  double payload_bytes_total_ = 0, allreduce_bytes_total_ = 0;
  obs::Registry registry_;
  obs::Histogram* round_duration_ = nullptr;
};

}  // namespace agora::coord
