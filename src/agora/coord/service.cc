#include "agora/coord/service.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "agora/coord/admit_batch.h"
#include "agora/coord/monitor.h"
#include "agora/coord/outbox.h"
#include "agora/coord/relay.h"
#include "agora/coord/run_data.h"
#include "agora/coord/state_machine.h"
#include "agora/coord/store.h"
#include "agora/core/clock.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/net/allowlist.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/log.h"
#include "agora/obs/progress.h"
#include "agora/serve/members.h"
#include "agora/serve/poll.h"
#include "agora/serve/rate_gate.h"

namespace agora::coord {
namespace fs = std::filesystem;
namespace {

// What the accepted commits of one step claimed, for its table row. Only the figures are kept,
// never the message: a commit may be up to the 1 MiB control limit.
struct CommitFigures {
  double loss = 0;
  uint64_t payload_bytes = 0;
  uint64_t sequences = 0;
  std::optional<double> val_loss;
};
struct StepCommits {
  std::map<net::PublicKey, CommitFigures> by_author;
};

// Per-member message budget (token bucket), keyed by the connection's authenticated curve key so
// that it also covers keys that never joined. An honest peer sends a heartbeat a second and a
// handful of messages per round; catching up it may ask GetFinalized once per step it replays.
// The burst covers that replay; the rate is two orders of magnitude above the steady need.
constexpr double kThrottleRate = 100.0;    // messages per second, sustained
constexpr double kThrottleBurst = 1000.0;  // messages at once
constexpr double kThrottleLogSeconds = 10.0;
// At most this many messages (or kBatchSeconds of handling) before the loop ticks and saves:
// deadlines fire however fast messages arrive, and a burst costs one save.
constexpr size_t kMaxBatch = 512;
constexpr double kBatchSeconds = 0.05;

// The median of `values` (the mean of the middle two for an even count); NaN for none.
double median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

class Service {
 public:
  Service(const RunConfig& config, const net::Identity& identity, const ServiceOptions& options)
      : config_(config), identity_(identity), options_(options) {}

  uint64_t run(const std::atomic<bool>& stop);

 private:
  // Persists the state once, then logs and sends what `actions` (a whole batch) produced.
  void deliver(Actions actions);
  // Hands a member's message to the state machine, noting what the monitor shows of it; what
  // it produced is appended to `batch`.
  void handle(const net::PublicKey& from, const wire::Envelope& m, Actions& batch);
  // Whether the sender of `in` is within its message budget; counts the excess.
  bool admit(const net::Incoming& in, double now);
  // Every kThrottleLogSeconds: logs who was throttled, forgets idle buckets and the keys of
  // non-members.
  void sweep(double now);
  // The relay's messages: to a fetcher's connection, or to a member on its own.
  void send_relayed(const std::vector<RelayOutgoing>& messages);
  StepRow row_of(uint64_t step, double now, double seconds);
  void print_row(const StepRow& row);
  void refuse(const net::Incoming& in, const std::string& reason, bool may_rejoin = false);

  void log(const std::string& text) const {
    obs::log_info(
        {machine_ ? std::optional(machine_->state().finalized_steps()) : std::nullopt, ""}, text);
  }
  void start_http(const std::string& run_id);
  // Publishes a new view for the HTTP threads when `force` or 200 ms passed since the last.
  void publish(bool force);

  RunConfig config_;  // a copy: serve_run_data() records the data's identity in it
  const net::Identity& identity_;
  ServiceOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StateMachine> machine_;
  std::unique_ptr<net::Context> context_;
  std::unique_ptr<net::Server> server_;
  std::map<std::string, net::PublicKey> key_of_curve_;
  std::unique_ptr<Outbox> outbox_;  // what goes to each member, and how (outbox.h)
  std::map<uint64_t, StepCommits> commits_;
  // Members' budgets by curve key; every key that has not joined shares one.
  serve::RateGate gate_{{kThrottleRate, kThrottleBurst}, {kThrottleRate, kThrottleBurst}};
  std::unique_ptr<Relay> relay_;  // for members nobody can dial (relay.h)
  // The run's token folder, for members without a copy (serve/data_mount.h); null when this
  // machine has no data.dir.
  std::unique_ptr<serve::DataService> data_;
  double throttle_logged_at_ = 0;
  uint64_t printed_ = 0;
  uint64_t saved_steps_ = 0;  // finalized steps in the database
  double last_final_at_ = 0;
  bool header_printed_ = false;

  // What the monitor shows beyond RunState; see monitor.h.
  std::unique_ptr<Monitor> monitor_;
  std::unique_ptr<obs::HttpServer> http_;
  struct Totals {
    uint64_t payload_bytes = 0, commits = 0;
  };
  std::map<net::PublicKey, Totals> totals_;  // accepted commits since this process started
  std::map<net::PublicKey, double> shares_;  // of the newest round opened
  std::optional<uint64_t> open_round_;       // the open round last seen, to time its close
  double open_round_at_ = 0;
  double published_at_ = 0;
  Phase published_phase_ = Phase::kWaitingForPeers;
  uint64_t published_steps_ = 0;
};

void Service::refuse(const net::Incoming& in, const std::string& reason, bool may_rejoin) {
  server_->send(in.route, serve::refusal(reason, may_rejoin));
}

void Service::deliver(Actions actions) {
  const double now = unix_seconds();
  const uint64_t final_steps = machine_->state().finalized_steps();
  printed_ = std::min(printed_, final_steps);
  std::vector<StepRow> rows;
  if (final_steps > printed_) {
    // Steps that finalize together share the time since the previous finalization; before the
    // first one this process saw, the time is unknown (NaN), not zero.
    const double seconds =
        last_final_at_ > 0 ? (now - last_final_at_) / static_cast<double>(final_steps - printed_)
                           : NAN;
    last_final_at_ = now;
    for (uint64_t t = printed_; t < final_steps; ++t) rows.push_back(row_of(t, now, seconds));
  }
  // Persist first: a peer must never hear of a state a crash could forget. The crash points
  // (core/crash_point.h) let tests kill the process on either side of the save.
  crash_point("service.before_save");
  if (final_steps > saved_steps_) crash_point("service.final_unsaved");
  store_->save(machine_->state(), /*allow_rollback=*/final_steps < saved_steps_, rows);
  crash_point("service.after_save");
  if (final_steps > saved_steps_) crash_point("service.final_saved");
  if (final_steps < saved_steps_) monitor_->truncate(final_steps);
  saved_steps_ = final_steps;
  relay_->store().prune(final_steps);
  monitor_->add_rows(rows);
  for (const LogLine& line : actions.log) {
    if (options_.json_lines) {
      nlohmann::json j = {{"event", "log"},
                          {"time", now},
                          {"kind", to_string(line.kind)},
                          {"text", line.text},
                          {"step", final_steps}};
      if (!line.peer.empty()) j["peer"] = line.peer;
      for (const obs::LogField& f : line.fields) {
        if (!j.contains(f.key)) std::visit([&](const auto& v) { j[f.key] = v; }, f.value);
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      obs::log_info({final_steps, line.peer, to_string(line.kind), line.fields}, line.text);
    }
  }
  for (const StepRow& row : rows) print_row(row);
  printed_ = final_steps;
  std::fflush(stdout);
  // Time the round that just closed (the commit phase: opening to close).
  const auto& round = machine_->state().round;
  if (open_round_ && (!round || round->step != *open_round_)) {
    monitor_->observe_round(now - open_round_at_);
    open_round_.reset();
  }
  if (round && !open_round_) {
    open_round_ = round->step;
    open_round_at_ = round->opened_at;
    shares_.clear();
    uint64_t total = 0;
    for (const auto& [key, ranges] : round->assignments) {
      for (const SequenceRange& r : ranges) total += r.count;
    }
    for (const auto& [key, ranges] : round->assignments) {
      uint64_t mine = 0;
      for (const SequenceRange& r : ranges) mine += r.count;
      shares_[key] = total > 0 ? static_cast<double>(mine) / static_cast<double>(total) : 0.0;
    }
  }
  coalesce_admits(actions.send);
  outbox_->send(actions.send, [] { crash_point("service.mid_send"); });
  publish(false);
}

void Service::handle(const net::PublicKey& from, const wire::Envelope& m, Actions& batch) {
  const uint64_t accepted = machine_->state().counters.commits_accepted;
  Actions actions = machine_->handle(from, m, unix_seconds());
  // Only an accepted commit is the open round's and the first of its author: a rejected one
  // (another step, a second hash) must not feed the table, page or metrics.
  if (m.has_commit() && machine_->state().counters.commits_accepted > accepted) {
    Totals& t = totals_[from];
    ++t.commits;
    t.payload_bytes += m.commit().payload_bytes();
    const wire::Commit& c = m.commit();
    CommitFigures figures{c.loss(), c.payload_bytes(), c.sequences(), std::nullopt};
    if (c.has_val_loss() && std::isfinite(c.val_loss())) figures.val_loss = c.val_loss();
    commits_[c.record().step()].by_author[from] = figures;
  }
  for (auto& o : actions.send) batch.send.push_back(std::move(o));
  for (auto& l : actions.log) batch.log.push_back(std::move(l));
}

bool Service::admit(const net::Incoming& in, double now) {
  // A member's own bucket; every key that never joined shares one (serve/members.h), so a crowd
  // of fresh keys costs what one member may and leaves no entry behind.
  return gate_.take(in.curve_key, key_of_curve_.contains(in.curve_key), now);
}

void Service::send_relayed(const std::vector<RelayOutgoing>& messages) {
  for (const RelayOutgoing& o : messages) {
    if (!o.route.empty()) {
      server_->send(o.route, o.message);
    } else if (const std::string* route = outbox_->route(o.member)) {
      server_->send(*route, o.message);
    }
  }
}

void Service::sweep(double now) {
  if (now - throttle_logged_at_ < kThrottleLogSeconds) return;
  throttle_logged_at_ = now;
  // Keys the state machine no longer (or never) counts as members, such as refused joiners or
  // members it forgot, leave the service's maps too: a stream of fresh keys cannot grow them.
  const auto& members = machine_->state().members;
  std::erase_if(key_of_curve_, [&](const auto& item) { return !members.contains(item.second); });
  outbox_->forget_others(members);
  std::erase_if(totals_, [&](const auto& item) { return !members.contains(item.first); });
  relay_->sweep(machine_->state());
  for (const serve::RateGate::Dropped& d : gate_.report(now)) {
    if (d.key.empty()) {
      obs::log_warn(
          {machine_->state().finalized_steps(),
           "",
           "throttled",
           {{"messages", d.messages}, {"rate", kThrottleRate}, {"strangers", true}}},
          fmt::format("dropped {} messages from keys that never joined over the last {:.0f} "
                      "s: above {} messages a second (burst {}) for all of them together",
                      d.messages, kThrottleLogSeconds, kThrottleRate, kThrottleBurst));
      continue;
    }
    const auto key = key_of_curve_.find(d.key);
    const std::string who =
        key != key_of_curve_.end() ? net::short_key(key->second) : d.key.substr(0, 8);
    obs::log_warn({machine_->state().finalized_steps(),
                   who,
                   "throttled",
                   {{"messages", d.messages}, {"rate", kThrottleRate}}},
                  fmt::format("dropped {} messages from {} over the last {:.0f} s: above {} "
                              "messages a second (burst {})",
                              d.messages, who, kThrottleLogSeconds, kThrottleRate, kThrottleBurst));
  }
}

void Service::publish(bool force) {
  if (!monitor_) return;
  const RunState& state = machine_->state();
  const double now = unix_seconds();
  force = force || state.phase != published_phase_ || state.finalized_steps() != published_steps_;
  if (!force && now - published_at_ < 0.2) return;
  auto view = std::make_shared<RunView>();
  view->at = now;
  view->phase = state.phase;
  view->finalized_steps = state.finalized_steps();
  view->counters = state.counters;
  for (const auto& [key, member] : state.members) {
    const auto share = shares_.find(key);
    const auto totals = totals_.find(key);
    view->members.push_back({member, share != shares_.end() ? share->second : 0.0,
                             totals != totals_.end() ? totals->second.payload_bytes : 0,
                             totals != totals_.end() ? totals->second.commits : 0});
  }
  view->events = state.events;
  view->bytes_sent = server_->bytes_sent();
  view->bytes_received = server_->bytes_received();
  view->drops_by_reason = server_->drops_by_reason();
  view->messages_throttled = gate_.dropped_total();
  view->round_starts_held = outbox_->round_starts_held();
  monitor_->publish(std::move(view));
  published_at_ = now;
  published_phase_ = state.phase;
  published_steps_ = state.finalized_steps();
}

void Service::start_http(const std::string& run_id) {
  RunInfo info;
  info.run_id = run_id;
  info.preset = config_.model.preset;
  info.optimizer = config_.optimizer.name;
  info.parameters = config_.model.vocab_size > 0 ? config_.model.num_parameters() : 0;
  info.batch_size = config_.train.batch_size;
  info.seq_len = config_.data.seq_len;
  info.total_steps = static_cast<uint64_t>(config_.train.steps);
  info.started_at = unix_seconds();
  monitor_ = std::make_unique<Monitor>(std::move(info), store_->step_rows());
  if (!options_.http) return;
  http_ = std::make_unique<obs::HttpServer>(*options_.http);
  monitor_->add_routes(*http_);
  try {
    http_->start();
  } catch (const Error& e) {
    if (options_.http_required) throw;
    obs::log_warn({}, fmt::format("{}; running without the web page and /metrics (choose another "
                                  "address with --http HOST:PORT)",
                                  e.what()));
    http_.reset();
    return;
  }
  log(fmt::format("dashboard on {}/ (JSON API under /api/, Prometheus metrics at /metrics)",
                  http_->url()));
}

StepRow Service::row_of(uint64_t step, double now, double seconds) {
  const auto& set = machine_->state().finalized.at(step);
  const StepCommits& commits = commits_[step];
  std::vector<double> losses, val_losses;
  double bytes = 0;
  uint64_t sequences = 0;
  for (const CommitRecord& r : set) {
    const auto it = commits.by_author.find(r.author);
    if (it == commits.by_author.end()) continue;  // committed before a restart
    if (std::isfinite(it->second.loss)) losses.push_back(it->second.loss);
    bytes += static_cast<double>(it->second.payload_bytes);
    sequences += it->second.sequences;
    if (it->second.val_loss) val_losses.push_back(*it->second.val_loss);
  }
  const size_t counted = std::count_if(set.begin(), set.end(), [&](const CommitRecord& r) {
    return commits.by_author.contains(r.author);
  });
  if (counted > 0) bytes /= static_cast<double>(counted);
  const int64_t parameters = config_.model.vocab_size > 0 ? config_.model.num_parameters() : 0;
  StepRow row;
  row.step = step;
  row.at = now;
  // Losses are what members claim: the median, so that one member's claim cannot move the
  // run's figure (a mean would follow a single false value anywhere).
  row.loss = median(losses);
  row.val_loss = median(val_losses);
  row.learning_rate = config_.learning_rate(static_cast<int64_t>(step));
  row.tokens_per_second =
      seconds > 0 ? static_cast<double>(sequences * config_.data.seq_len) / seconds : NAN;
  row.payload_bytes = bytes;
  row.allreduce_bytes = parameters > 0 ? 4.0 * static_cast<double>(parameters) : NAN;
  row.peers = set.size();
  row.sequences = sequences;
  row.seconds = seconds;
  commits_.erase(commits_.begin(), commits_.upper_bound(step));
  return row;
}

void Service::print_row(const StepRow& row) {
  const double allreduce = std::isnan(row.allreduce_bytes) ? 0.0 : row.allreduce_bytes;
  if (options_.json_lines) {
    nlohmann::json authors = nlohmann::json::array();
    for (const CommitRecord& r : machine_->state().finalized.at(row.step)) {
      authors.push_back(net::short_key(r.author));
    }
    const nlohmann::json line = {
        {"event", "step"},
        {"time", row.at},
        {"authors", authors},
        {"step", row.step},
        {"loss", row.loss},
        {"val_loss",
         std::isfinite(row.val_loss) ? nlohmann::json(row.val_loss) : nlohmann::json(nullptr)},
        {"peers", row.peers},
        {"sequences", row.sequences},
        {"tokens_per_second", row.tokens_per_second},
        {"payload_bytes", row.payload_bytes},
        {"allreduce_bytes", allreduce},
        {"relay_bytes", relay_->store().bytes_for_step(row.step)}};
    std::printf("%s\n", line.dump().c_str());
  } else {
    if (!header_printed_) {
      std::printf("%8s  %8s  %5s  %10s  %12s  %14s\n", "step", "loss", "peers", "tokens/s",
                  "bytes/peer", "all-reduce");
      header_printed_ = true;
    }
    std::printf("%8llu  %8.4f  %5llu  %10.0f  %12s  %14s\n",
                static_cast<unsigned long long>(row.step), row.loss,
                static_cast<unsigned long long>(row.peers), row.tokens_per_second,
                format_bytes(row.payload_bytes).c_str(),
                allreduce > 0 ? format_bytes(allreduce).c_str() : "?");
  }
}

uint64_t Service::run(const std::atomic<bool>& stop) {
  const NetworkConfig& n = config_.network;
  check_decentralized(config_);
  const auto resolve = [&](const std::string& p) {
    return fs::path(p).is_absolute() ? fs::path(p) : options_.base_dir / p;
  };
  const fs::path allowlist_path = n.allowlist.empty() ? fs::path{} : resolve(n.allowlist);
  std::set<net::PublicKey> allowlist;
  const net::Admission admission =
      net::admission_for(allowlist_path, n.open, {"network.allowlist", "network.open"}, &allowlist);

  store_ = std::make_unique<Store>(Store::open(resolve(n.state_db)));
  data_ = serve_run_data(config_, [this](const std::string& text) { log(text); });
  const std::string toml = config_.to_toml();
  std::string run_id;
  RunState state;
  bool resumed = false;
  if (auto run = store_->run()) {
    if (run->run_config_toml != toml) {
      fail(
          "{} belongs to run {}, started with a different run config; restart with that config "
          "(the database holds it) or set network.state_db to a new file for a new run",
          store_->path().string(), run->run_id);
    }
    run_id = run->run_id;
    if (auto loaded = store_->load()) {
      state = std::move(*loaded);
      resumed = true;
    }
  } else {
    run_id = net::key_to_hex(net::Identity::generate().public_key()).substr(0, 16);
    store_->bind(run_id, toml);
  }
  Options options{run_id,
                  toml,
                  static_cast<uint64_t>(config_.train.steps),
                  static_cast<uint64_t>(config_.train.batch_size),
                  n,
                  allowlist};
  options.tst_switch_step = static_cast<uint64_t>(config_.tst_switch_step());
  options.checkpoint_interval =
      static_cast<uint64_t>(std::max<int64_t>(0, config_.train.checkpoint_interval));
  // Only DeMo's contributions are recomputed and compared (docs/verification.md).
  options.verify = config_.verify;
  if (config_.optimizer.name != "demo") options.verify.rate = 0;
  machine_ = std::make_unique<StateMachine>(options, std::move(state));
  printed_ = saved_steps_ = machine_->state().finalized_steps();
  // Members of a resumed run reconnect without joining again: their transport keys follow from
  // the ed25519 keys on record.
  for (const auto& [key, member] : machine_->state().members) {
    key_of_curve_[net::curve_public_of(key)] = key;
  }

  context_ = std::make_unique<net::Context>(admission);
  const net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};
  server_ = std::make_unique<net::Server>(*context_, identity_, n.listen, control);
  outbox_ = std::make_unique<Outbox>(*server_);
  // Uploads are kept as long as peers keep payloads (Round::settle).
  relay_ = std::make_unique<Relay>(*context_, identity_,
                                   4 * static_cast<uint64_t>(n.hash_interval) + 16);
  log(fmt::format(
      "coordinator {}: run {} {} on {} ({}); state in {}", net::key_to_hex(identity_.public_key()),
      run_id,
      resumed ? fmt::format("resumed at step {}", machine_->state().finalized_steps()) : "started",
      server_->bound_endpoint(), net::describe(admission), store_->path().string()));
  start_http(run_id);
  if (options_.on_listening)
    options_.on_listening(server_->bound_endpoint(), http_ ? http_->port() : 0);
  publish(true);
  if (resumed) deliver(machine_->resume(unix_seconds()));

  double finished_at = 0, next_tick = 0;
  uint64_t dropped_seen = 0, refused_seen = 0;
  while (!stop.load()) {
    const double wait = std::clamp(next_tick - unix_seconds(), 0.0, 0.1);
    serve::wait_readable(server_->socket(),
                         std::chrono::milliseconds(static_cast<int>(wait * 1000)));
    // One batch: at most kMaxBatch messages or kBatchSeconds, then the tick, then ONE save, and
    // only then are the batch's messages sent (nothing is sent before it is durable).
    Actions batch;
    size_t handled = 0;
    serve::drain(*server_, {kMaxBatch, kBatchSeconds}, [&](const net::Incoming& in) {
      if (!admit(in, unix_seconds())) return;
      const wire::Envelope& m = in.message;
      if (m.has_join()) {
        if (!serve::proves_key(m.join().key(), in.curve_key)) {
          refuse(in, "the join names a key that is not the one this connection authenticated");
          return;
        }
        key_of_curve_[in.curve_key] = m.join().key();
      }
      const auto key = key_of_curve_.find(in.curve_key);
      if (key == key_of_curve_.end()) {
        refuse(in, serve::kNotAMember, /*may_rejoin=*/true);
        return;
      }
      // Data, the relay's traffic: fetches on connections of their own, never seen by the
      // state machine, and they do not change where the member's messages go.
      if (data_ && m.has_get_blob() &&
          data_->answer(*server_, key->second, in.route, m.get_blob(), unix_seconds())) {
        return;
      }
      if (auto answers = relay_->handle(*machine_, key->second, in.route, m, unix_seconds())) {
        send_relayed(*answers);
        return;
      }
      outbox_->connected(key->second, in.route);
      handle(key->second, m, batch);
      ++handled;
    });
    if (server_->dropped() > dropped_seen) {
      dropped_seen = server_->dropped();
      obs::log_warn({}, fmt::format("dropped a malformed message ({}); {} so far",
                                    server_->last_drop_reason(), dropped_seen));
    }
    if (context_->refused() > refused_seen) {
      refused_seen = context_->refused();
      obs::log_warn({}, fmt::format("refused a connection whose key is not on the allowlist; {} "
                                    "so far",
                                    refused_seen));
    }
    const double now = unix_seconds();
    bool ticked = false;
    if (now >= next_tick) {
      Actions tick = machine_->tick(now);
      for (auto& o : tick.send) batch.send.push_back(std::move(o));
      for (auto& l : tick.log) batch.log.push_back(std::move(l));
      next_tick = now + 0.1;
      ticked = true;
      sweep(now);
      send_relayed(relay_->pump_tensors(now));
      Actions probed = relay_->check_reachability(*machine_, now);
      for (auto& o : probed.send) batch.send.push_back(std::move(o));
      for (auto& l : probed.log) batch.log.push_back(std::move(l));
    }
    // A tick that changed nothing has nothing to save; messages always may have (last_seen).
    if (handled > 0 || !batch.send.empty() || !batch.log.empty()) {
      deliver(std::move(batch));
    } else if (ticked) {
      publish(false);
    }
    // Finished and released (members caught up, final checkpoint reported, or the grace
    // passed): a few seconds more so that every peer hears its release.
    if (machine_->released()) {
      if (finished_at == 0) finished_at = now;
      if (now - finished_at > 3.0) break;
    }
  }
  publish(true);
  return machine_->state().finalized_steps();
}

}  // namespace

uint64_t run_coordinator(const RunConfig& config, const net::Identity& identity,
                         const ServiceOptions& options, const std::atomic<bool>& stop) {
  Service service(config, identity, options);
  return service.run(stop);
}

}  // namespace agora::coord
