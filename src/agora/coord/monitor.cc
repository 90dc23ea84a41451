#include "agora/coord/monitor.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "agora/core/clock.h"
#include "agora/net/identity.h"
#include "agora/obs/metrics_catalogue.h"
#include "web/web_assets.h"

namespace agora::coord {
namespace {

using nlohmann::json;
namespace m = obs::metric;

// JSON has no NaN: unknown numbers are null.
json number(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

std::string dump(const json& j) {
  // Member agents and checkpoint paths are peer-supplied: never let bad UTF-8 break a reply.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

obs::HttpResponse json_response(std::string body) {
  return {200, "application/json", std::move(body)};
}

constexpr Phase kPhases[] = {Phase::kWaitingForPeers, Phase::kWarmup, Phase::kTraining,
                             Phase::kPaused, Phase::kFinished};
constexpr MemberState kStates[] = {MemberState::kSyncing, MemberState::kActive, MemberState::kLeft,
                                   MemberState::kDropped};

}  // namespace

Monitor::Monitor(RunInfo info, std::vector<StepRow> history) : info_(std::move(info)) {
  add_rows(history);
  view_ = std::make_shared<RunView>();
  round_duration_ = &obs::histogram(registry_, m::kRunRoundDuration, obs::seconds_buckets());
  obs::add_process_metrics(registry_);
  registry_.add_collector([this](obs::Registry& r) { collect(r); });
}

void Monitor::publish(std::shared_ptr<const RunView> view) {
  std::lock_guard lock(mutex_);
  view_ = std::move(view);
}

std::shared_ptr<const RunView> Monitor::view() const {
  std::lock_guard lock(mutex_);
  return view_;
}

void Monitor::add_rows(const std::vector<StepRow>& rows) {
  std::lock_guard lock(mutex_);
  for (const StepRow& row : rows) {
    // A row for a step already listed (a rollback re-finalized it) replaces the tail.
    while (!history_.empty() && history_.back().step >= row.step) history_.pop_back();
    history_.push_back(row);
    const double peers = static_cast<double>(row.peers);
    if (std::isfinite(row.payload_bytes)) payload_bytes_total_ += row.payload_bytes * peers;
    if (std::isfinite(row.allreduce_bytes)) allreduce_bytes_total_ += row.allreduce_bytes * peers;
  }
}

void Monitor::truncate(uint64_t finalized_steps) {
  std::lock_guard lock(mutex_);
  while (!history_.empty() && history_.back().step >= finalized_steps) history_.pop_back();
}

// Validation runs every train.eval_interval steps, so most rows have none: the newest that does.
// Called with mutex_ held. The scan stops at the newest validated row, so it is short whenever
// validation runs at all, and a truncation needs no bookkeeping.
double Monitor::newest_val_loss() const {
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (std::isfinite(it->val_loss)) return it->val_loss;
  }
  return NAN;
}

void Monitor::observe_round(double seconds) {
  round_duration_->observe(seconds);
}

std::string Monitor::run_json() const {
  const auto v = view();
  json j;
  j["run_id"] = info_.run_id;
  j["phase"] = to_string(v->phase);
  j["step"] = v->finalized_steps;
  j["total_steps"] = info_.total_steps;
  {
    std::lock_guard lock(mutex_);
    const StepRow* last = history_.empty() ? nullptr : &history_.back();
    j["loss"] = number(last ? last->loss : NAN);
    if (const double val = newest_val_loss(); std::isfinite(val)) j["val_loss"] = val;
    j["learning_rate"] = number(last ? last->learning_rate : NAN);
    j["tokens_per_second"] = number(last ? last->tokens_per_second : NAN);
    j["payload_bytes_per_step"] = number(last ? last->payload_bytes : NAN);
    j["allreduce_bytes_per_step"] = number(last ? last->allreduce_bytes : NAN);
  }
  json peers = {{"syncing", 0}, {"active", 0}, {"left", 0}, {"dropped", 0}};
  for (const MemberView& mv : v->members) {
    peers[to_string(mv.member.state)] = peers[to_string(mv.member.state)].get<int>() + 1;
  }
  j["peers"] = peers;
  const Counters& c = v->counters;
  j["counters"] = {{"joins", c.joins},
                   {"leaves", c.leaves},
                   {"drops", c.drops},
                   {"refusals", c.refusals},
                   {"strikes", c.strikes},
                   {"deadline_misses", c.deadline_misses},
                   {"rounds_opened", c.rounds_opened},
                   {"commits_accepted", c.commits_accepted},
                   {"commits_rejected", c.commits_rejected},
                   {"commits_late", c.commits_late},
                   {"payloads_final", c.payloads_final},
                   {"payloads_not_final", c.payloads_not_final},
                   {"rejections_reported", c.rejections_reported},
                   {"checkpoints", c.checkpoints},
                   {"checkpoints_refused", c.checkpoints_refused},
                   {"state_reports_refused", c.state_reports_refused},
                   {"witnesses_repeated", c.witnesses_repeated},
                   {"witness_disagreements", c.witness_disagreements},
                   {"events_suppressed", c.events_suppressed},
                   {"messages_throttled", v->messages_throttled},
                   {"round_starts_held", v->round_starts_held},
                   {"resyncs", c.resyncs_sent},
                   {"restarts", c.restarts}};
  j["started_at"] = info_.started_at;
  j["uptime_seconds"] = unix_seconds() - info_.started_at;
  j["model"] = {{"preset", info_.preset},
                {"parameters", info_.parameters},
                {"optimizer", info_.optimizer},
                {"batch_size", info_.batch_size},
                {"seq_len", info_.seq_len}};
  return dump(j);
}

std::string Monitor::peers_json() const {
  const auto v = view();
  const double now = unix_seconds();
  json out = json::array();
  for (const MemberView& mv : v->members) {
    const MemberRecord& mb = mv.member;
    out.push_back(
        {{"key", net::key_to_hex(mb.key)},
         {"short", net::short_key(mb.key)},
         {"state", to_string(mb.state)},
         {"drop_reason",
          mb.state == MemberState::kDropped ? json(to_string(mb.drop_reason)) : json(nullptr)},
         {"endpoint", mb.endpoint},
         {"agent", mb.agent},
         {"sequences_per_second", mb.sequences_per_second},
         {"share", mv.share},
         {"strikes", mb.strikes},
         {"last_seen_seconds_ago", std::max(0.0, now - mb.last_seen)},
         {"applied_steps", mb.applied_steps},
         {"checkpointer", mb.checkpointer},
         {"payload_bytes", mv.payload_bytes},
         {"commits", mv.commits}});
  }
  return dump(out);
}

std::string Monitor::history_json(uint64_t since, bool has_since, uint64_t events_since) const {
  const auto v = view();
  // Copy the rows under the lock and render them after it: the service loop takes the same lock
  // to append, and must not wait for thousands of rows to become JSON.
  std::vector<StepRow> rows;
  bool more = false;
  {
    std::lock_guard lock(mutex_);
    auto first = history_.begin();
    if (has_since) {
      first = std::upper_bound(history_.begin(), history_.end(), since,
                               [](uint64_t s, const StepRow& r) { return s < r.step; });
    }
    const size_t available = static_cast<size_t>(history_.end() - first);
    more = available > kMaxHistoryRows;
    rows.assign(first, first + static_cast<std::ptrdiff_t>(std::min(available, kMaxHistoryRows)));
  }
  json steps = json::array();
  {
    for (auto it = rows.begin(); it != rows.end(); ++it) {
      json row = {{"step", it->step},
                  {"loss", number(it->loss)},
                  {"lr", number(it->learning_rate)},
                  {"tokens_per_second", number(it->tokens_per_second)},
                  {"payload_bytes", number(it->payload_bytes)},
                  {"allreduce_bytes", number(it->allreduce_bytes)},
                  {"peers", it->peers},
                  {"seconds", number(it->seconds)},
                  {"at", it->at}};
      if (std::isfinite(it->val_loss)) row["val_loss"] = it->val_loss;
      steps.push_back(std::move(row));
    }
  }
  json events = json::array();
  for (const Event& e : v->events) {
    if (e.seq <= events_since) continue;
    events.push_back({{"seq", e.seq}, {"at", e.at}, {"text", e.text}, {"kind", to_string(e.kind)}});
  }
  json j = {{"steps", steps}, {"events", events}};
  if (more) j["more"] = true;
  return dump(j);
}

void Monitor::collect(obs::Registry& r) {
  const auto v = view();
  obs::gauge(r, m::kRunInfo,
             {{"run_id", info_.run_id}, {"preset", info_.preset}, {"optimizer", info_.optimizer}})
      .set(1);
  for (const Phase p : kPhases) {
    obs::gauge(r, m::kRunPhase, {{"phase", to_string(p)}}).set(v->phase == p ? 1 : 0);
  }
  obs::gauge(r, m::kRunFinalizedSteps).set(static_cast<double>(v->finalized_steps));
  obs::gauge(r, m::kRunTotalSteps).set(static_cast<double>(info_.total_steps));
  {
    std::lock_guard lock(mutex_);
    if (!history_.empty()) {
      const StepRow& last = history_.back();
      // A gauge that is not known yet is left out rather than exported as NaN.
      if (std::isfinite(last.loss)) obs::gauge(r, m::kRunLoss).set(last.loss);
      if (const double val = newest_val_loss(); std::isfinite(val)) {
        obs::gauge(r, m::kRunValLoss).set(val);
      }
      obs::gauge(r, m::kRunLearningRate).set(last.learning_rate);
      if (std::isfinite(last.tokens_per_second)) {
        obs::gauge(r, m::kRunTokensPerSecond).set(last.tokens_per_second);
      }
    }
    obs::counter(r, m::kRunPayloadBytes).set_total(payload_bytes_total_);
    obs::counter(r, m::kRunAllreduceBytes).set_total(allreduce_bytes_total_);
  }
  std::map<MemberState, int> by_state;
  for (const MemberView& mv : v->members) ++by_state[mv.member.state];
  for (const MemberState s : kStates) {
    obs::gauge(r, m::kRunPeers, {{"state", to_string(s)}}).set(by_state[s]);
  }
  const Counters& c = v->counters;
  const auto total = [&](const obs::MetricDef& d, uint64_t value, const obs::Labels& labels = {}) {
    obs::counter(r, d, labels).set_total(static_cast<double>(value));
  };
  total(m::kRunDeadlineMisses, c.deadline_misses);
  total(m::kRunJoins, c.joins);
  total(m::kRunLeaves, c.leaves);
  total(m::kRunDrops, c.drops);
  total(m::kRunRefusals, c.refusals);
  total(m::kRunCommits, c.commits_accepted, {{"result", "accepted"}});
  total(m::kRunCommits, c.commits_rejected, {{"result", "rejected"}});
  total(m::kRunCommits, c.commits_late, {{"result", "late"}});
  total(m::kRunPayloads, c.payloads_final, {{"result", "final"}});
  total(m::kRunPayloads, c.payloads_not_final, {{"result", "not_final"}});
  total(m::kRunRejectionsReported, c.rejections_reported);
  total(m::kRunCheckpoints, c.checkpoints);
  total(m::kRunResyncs, c.resyncs_sent);
  total(m::kRunRestarts, c.restarts);
  total(m::kRunMessagesThrottled, v->messages_throttled);
  total(m::kRunRoundStartsHeld, v->round_starts_held);
  total(m::kRunReportsRefused, c.state_reports_refused, {{"kind", "state"}});
  total(m::kRunReportsRefused, c.checkpoints_refused, {{"kind", "checkpoint"}});
  total(m::kRunWitnessesRepeated, c.witnesses_repeated);
  total(m::kRunWitnessDisagreements, c.witness_disagreements);
  total(m::kRunEventsSuppressed, c.events_suppressed);
  total(m::kNetworkBytes, v->bytes_sent, {{"direction", "sent"}, {"kind", "control"}});
  total(m::kNetworkBytes, v->bytes_received, {{"direction", "received"}, {"kind", "control"}});
  for (const auto& [reason, count] : v->drops_by_reason) {
    total(m::kNetworkDropped, count, {{"reason", reason}});
  }
}

void Monitor::add_routes(obs::HttpServer& server) {
  server.get("/metrics", [this](const obs::HttpRequest&) {
    return obs::HttpResponse{200, std::string(obs::kPrometheusContentType), registry_.render()};
  });
  server.get("/api/run", [this](const obs::HttpRequest&) { return json_response(run_json()); });
  server.get("/api/peers", [this](const obs::HttpRequest&) { return json_response(peers_json()); });
  server.get("/api/history", [this](const obs::HttpRequest& request) {
    const auto number_param = [&](const char* name, uint64_t* out) {
      const auto it = request.query.find(name);
      if (it == request.query.end()) return true;
      // from_chars, unlike stoull, refuses "-1" (which would wrap) and leading spaces.
      const std::string& text = it->second;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
      return error == std::errc() && end == text.data() + text.size() && !text.empty();
    };
    uint64_t since = 0, events_since = 0;
    if (!number_param("since", &since) || !number_param("events_since", &events_since)) {
      return obs::HttpResponse{400, "text/plain; charset=utf-8",
                               "since and events_since must be non-negative integers\n"};
    }
    return json_response(history_json(since, request.query.count("since") > 0, events_since));
  });
  server.fallback([](const obs::HttpRequest& request) {
    if (const web::Asset* asset = web::find_asset(request.path)) {
      return obs::HttpResponse{200, std::string(asset->content_type), std::string(asset->body)};
    }
    return obs::HttpResponse{404, "text/plain; charset=utf-8", "not found\n"};
  });
}

}  // namespace agora::coord
