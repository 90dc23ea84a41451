#include "agora/peer/peer_network.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <thread>

#include "agora/core/error.h"
#include "agora/obs/log.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/peer/peer_network_detail.h"
#include "agora/serve/poll.h"

namespace agora::peer {

using detail::connection_id;
using detail::deadline_after;
using detail::now_seconds;
using detail::traffic_of;

PeerNetwork::PeerNetwork(const net::Identity& identity, PeerNetworkOptions options)
    : identity_(identity), options_(std::move(options)) {
  server_ = std::make_unique<PeerServer>(
      context_, identity_, options_.listen, options_.server,
      [this](const wire::GetTensor& get) { return find_snapshot(get); },
      [this](const std::string& hash) -> std::shared_ptr<const std::string> {
        MutexLock lock(mutex_);
        const auto it = strategy_states_.find(hash);
        if (it == strategy_states_.end()) return nullptr;
        // Aliases the state: the manifest lives as long as the reply needs it.
        return {it->second, &it->second->manifest};
      },
      [this](Traffic kind, bool sent, uint64_t bytes) { count(kind, sent, bytes); });
  endpoint_ = options_.advertise.empty() ? server_->bound_endpoint() : options_.advertise;
  if (endpoint_.find("0.0.0.0") != std::string::npos) {
    // A wildcard bind is not dialable; loopback is the right guess only on one machine, so
    // real runs pass --advertise (docs/running.md).
    endpoint_.replace(endpoint_.find("0.0.0.0"), 7, "127.0.0.1");
  }
  {
    MutexLock lock(mutex_);
    reply_limits_ = options_.limits;
  }
  net::DecodeLimits control{net::kMaxControlBytes, net::kMaxControlBytes};
  coordinator_ = std::make_unique<net::Client>(context_, identity_, options_.coordinator,
                                               options_.coordinator_key, control);
  if (options_.metrics != nullptr) {
    using obs::metric::kPeerFetchDuration;
    payload_fetch_ = &obs::histogram(*options_.metrics, kPeerFetchDuration, obs::seconds_buckets(),
                                     {{"kind", "payload"}});
    state_fetch_ = &obs::histogram(*options_.metrics, kPeerFetchDuration, obs::seconds_buckets(),
                                   {{"kind", "state"}});
  }
  thread_ = std::thread([this] { run(); });
}

PeerNetwork::~PeerNetwork() {
  stop_.store(true);
  thread_.join();
  clients_.clear();
  coordinator_.reset();
  server_.reset();
}

void PeerNetwork::configure(LinkSettings settings) {
  // Replies on fetch connections: a NotFound names at most a tensor; a Blob or TensorData holds
  // at most the run's largest payload or tensor (plus the envelope's few bytes).
  net::DecodeLimits limits = options_.limits;
  limits.max_control = std::min<size_t>(limits.max_control, 4096);
  const uint64_t largest = std::max(settings.max_payload_bytes, settings.max_tensor_bytes);
  if (largest > 0) limits.max_data = std::min<size_t>(limits.max_data, largest + 4096);
  MutexLock lock(mutex_);
  settings_ = std::move(settings);
  reply_limits_ = limits;
}

void PeerNetwork::send_to_coordinator(wire::Envelope message) {
  MutexLock lock(mutex_);
  to_coordinator_.push_back(std::move(message));
}

std::optional<wire::Envelope> PeerNetwork::next_from_coordinator(double timeout_seconds) {
  const auto deadline = deadline_after(timeout_seconds);
  MutexLock lock(mutex_);
  while (from_coordinator_.empty()) {
    if (arrived_.wait_until(mutex_, deadline) == std::cv_status::timeout) break;
  }
  if (from_coordinator_.empty()) return std::nullopt;
  wire::Envelope message = std::move(from_coordinator_.front());
  from_coordinator_.pop_front();
  return message;
}

void PeerNetwork::set_status(uint64_t applied_steps, uint64_t next_round) {
  MutexLock lock(mutex_);
  applied_steps_ = applied_steps;
  next_round_ = next_round;
}

void PeerNetwork::publish_snapshot(uint64_t applied_steps,
                                   std::shared_ptr<const Snapshot> snapshot) {
  MutexLock lock(mutex_);
  snapshots_[applied_steps] = std::move(snapshot);
  // The newest two, and one older that a joiner is still fetching: a large model through a
  // slow link or the relay takes longer than two reports apart, and a snapshot dropped
  // mid-fetch sent the joiner back for a newer one that went the same way.
  const double now = now_seconds();
  uint64_t pinned = 0;  // the older step most recently asked for within kSnapshotPinSeconds
  double pinned_at = 0;
  for (const auto& [steps, used] : snapshot_used_) {
    if (now - used <= kSnapshotPinSeconds && used > pinned_at) {
      pinned = steps;
      pinned_at = used;
    }
  }
  while (snapshots_.size() > 2) {
    auto oldest = snapshots_.begin();
    if (pinned_at > 0 && oldest->first == pinned) {
      if (snapshots_.size() == 3) break;
      ++oldest;
    }
    snapshot_used_.erase(oldest->first);
    snapshots_.erase(oldest);
  }
  for (auto it = snapshot_used_.begin(); it != snapshot_used_.end();) {
    it = snapshots_.contains(it->first) ? std::next(it) : snapshot_used_.erase(it);
  }
}

void PeerNetwork::publish_strategy_state(std::shared_ptr<const StrategyState> state, size_t keep) {
  MutexLock lock(mutex_);
  const std::string hash = state->hash;
  if (strategy_states_.emplace(hash, std::move(state)).second) strategy_order_.push_back(hash);
  while (strategy_order_.size() > keep) {
    strategy_states_.erase(strategy_order_.front());
    strategy_order_.pop_front();
  }
}

void PeerNetwork::serve_data(std::function<std::optional<std::string>(const std::string&)> lookup) {
  server_->serve_data(std::move(lookup));
}

NetworkCounters PeerNetwork::counters() const {
  MutexLock lock(mutex_);
  NetworkCounters c = counters_;  // dropped_* come from sync_socket_counters()
  c.bytes_sent = c.bytes_received = 0;
  for (size_t k = 0; k < 3; ++k) {
    c.bytes_sent += c.sent_by_kind[k] = sent_[k].load();
    c.bytes_received += c.received_by_kind[k] = received_[k].load();
  }
  for (size_t r = 0; r < 4; ++r) c.rejected_by_reason[r] = rejected_[r].load();
  c.refused_by_reason = server_->refusals();
  return c;
}

void PeerNetwork::count(Traffic kind, bool sent, uint64_t bytes) {
  (sent ? sent_ : received_)[static_cast<size_t>(kind)].fetch_add(bytes);
}

void PeerNetwork::reject(Rejection why) {
  rejected_[static_cast<size_t>(why)].fetch_add(1);
}

void PeerNetwork::bump(uint64_t NetworkCounters::*field) {
  MutexLock lock(mutex_);
  ++(counters_.*field);
}

void PeerNetwork::sync_socket_counters() {
  // The sockets belong to this thread; copy their drop tallies out when they change.
  net::Server& server = server_->socket_owner();
  uint64_t dropped = server.dropped() + coordinator_->dropped() + dropped_closed_;
  for (const auto& [id, c] : clients_) dropped += c.client->dropped();
  if (dropped == dropped_seen_) return;
  dropped_seen_ = dropped;
  std::map<std::string, uint64_t> by_reason = drops_closed_;
  for (const auto& [reason, n] : server.drops_by_reason()) by_reason[reason] += n;
  for (const auto& [reason, n] : coordinator_->drops_by_reason()) by_reason[reason] += n;
  for (const auto& [id, c] : clients_) {
    for (const auto& [reason, n] : c.client->drops_by_reason()) by_reason[reason] += n;
  }
  MutexLock lock(mutex_);
  counters_.dropped_messages = dropped;
  counters_.dropped_by_reason = std::move(by_reason);
}

net::Client* PeerNetwork::client_for(const wire::Member& member) {
  const std::string id = connection_id(member);
  auto it = clients_.find(id);
  if (it == clients_.end()) {
    if (clients_.size() >= kMaxClients) make_room();
    // Every connection has a request in flight: the caller asks again once one is answered.
    if (clients_.size() >= kMaxClients) return nullptr;
    net::DecodeLimits limits;
    {
      MutexLock lock(mutex_);
      limits = reply_limits_;
    }
    // Few replies wait unread: a member streaming unsolicited data is slowed by TCP, not
    // buffered here (a joiner's many tensor replies still flow, read as they come).
    Connection c{std::make_unique<net::Client>(context_, identity_, member.endpoint(), member.key(),
                                               limits, /*receive_queue=*/16),
                 member.key(), 0};
    it = clients_.emplace(id, std::move(c)).first;
  }
  it->second.last_used = now_seconds();
  return it->second.client.get();
}

std::set<std::string> PeerNetwork::waited_on(bool earlier_sources) const {
  std::set<std::string> out;
  for (const auto& job : jobs_) {
    for (const Want& want : job->wants) {
      if (want.done) continue;
      if (!want.asked.empty()) out.insert(want.asked);
      if (earlier_sources) out.insert(want.asked_before.begin(), want.asked_before.end());
    }
  }
  return out;
}

std::map<std::string, PeerNetwork::Connection>::iterator PeerNetwork::close_client(
    std::map<std::string, Connection>::iterator it) {
  dropped_closed_ += it->second.client->dropped();
  for (const auto& [reason, n] : it->second.client->drops_by_reason()) drops_closed_[reason] += n;
  return clients_.erase(it);
}

void PeerNetwork::make_room() {
  // Nothing was answered or given up since every connection was last found waited on: none is
  // free yet.
  // (Without this, each of the requests waiting for a connection rescanned every want.)
  if (full_at_events_ == pool_events_) return;
  // Only the sources being asked now count: a want that waits for a connection while its earlier
  // sources (kept for a late answer) pinned every one would wait for ever.
  const std::set<std::string> busy = waited_on(/*earlier_sources=*/false);
  auto idlest = clients_.end();
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (busy.count(it->first)) continue;
    if (idlest == clients_.end() || it->second.last_used < idlest->second.last_used) idlest = it;
  }
  if (idlest == clients_.end()) {
    full_at_events_ = pool_events_;
    return;
  }
  close_client(idlest);
}

void PeerNetwork::close_idle_clients(double now) {
  // A connection a want still waits on stays; of the rest, those idle for long, those of
  // members no longer admitted (they left or were dropped), and, past kMaxClients, the idlest.
  const std::set<std::string> busy = waited_on(/*earlier_sources=*/true);
  for (auto it = clients_.begin(); it != clients_.end();) {
    const Connection& c = it->second;
    bool member = true;
    try {
      member = server_->admitted(net::curve_public_of(c.member_key), now);
    } catch (const Error&) {
      member = false;
    }
    const bool idle = now - c.last_used > kClientIdleSeconds;
    it = !busy.count(it->first) && (idle || !member) ? close_client(it) : std::next(it);
  }
  while (clients_.size() >= kMaxClients) {
    auto idlest = clients_.end();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      if (busy.count(it->first)) continue;
      if (idlest == clients_.end() || it->second.last_used < idlest->second.last_used) idlest = it;
    }
    if (idlest == clients_.end()) break;
    close_client(idlest);
  }
}

std::shared_ptr<const Snapshot> PeerNetwork::find_snapshot(const wire::GetTensor& get) {
  MutexLock lock(mutex_);
  if (!get.strategy_hash().empty()) {
    const auto it = strategy_states_.find(get.strategy_hash());
    return it == strategy_states_.end() ? nullptr : it->second->tensors;
  }
  const auto it = snapshots_.find(get.applied_steps());
  if (it == snapshots_.end()) return nullptr;
  snapshot_used_[it->first] = now_seconds();
  return it->second;
}

bool PeerNetwork::on_coordinator(const wire::Envelope& m) {
  if (m.has_get_tensor()) {
    answer_relayed(m.get_tensor());
    return true;
  }
  // The coordinator's lists are who this peer's server answers (peer_server.h).
  const double now = now_seconds();
  if (m.has_round_start()) {
    server_->admit(m.round_start().members(), /*replace=*/true, now);
    server_->admit(m.round_start().joining(), /*replace=*/false, now);
  } else if (m.has_collect()) {
    server_->admit(m.collect().members(), /*replace=*/false, now);
    MutexLock lock(mutex_);
    collect_arrived_[m.collect().step()] = now;
    while (collect_arrived_.size() > 16) collect_arrived_.erase(collect_arrived_.begin());
  } else if (m.has_welcome()) {
    server_->admit(m.welcome().holders(), /*replace=*/false, now);
  } else if (m.has_resync()) {
    server_->admit(m.resync().holders(), /*replace=*/false, now);
  } else if (m.has_admit()) {
    server_->admit(m.admit().joining(), /*replace=*/false, now);
  }
  return false;
}

void PeerNetwork::pump_commands() {
  std::deque<wire::Envelope> outgoing;
  std::deque<std::shared_ptr<Job>> jobs;
  {
    MutexLock lock(mutex_);
    outgoing.swap(to_coordinator_);
    jobs.swap(new_jobs_);
  }
  const double now = now_seconds();
  for (auto& job : jobs) {
    for (Want& want : job->wants) {
      if (!want.done) advance(want, now);
    }
    jobs_.push_back(std::move(job));
  }
  for (const auto& message : outgoing) {
    count(Traffic::kControl, true, message.ByteSizeLong());
    coordinator_->send(message);
  }
}

void PeerNetwork::loop_once(double& next_heartbeat) {
  pump_commands();
  std::vector<zmq::pollitem_t> items = {
      {server_->socket_owner().socket().handle(), 0, ZMQ_POLLIN, 0},
      {coordinator_->socket().handle(), 0, ZMQ_POLLIN, 0}};
  for (auto& [id, c] : clients_) items.push_back({c.client->socket().handle(), 0, ZMQ_POLLIN, 0});
  serve::poll(items, std::chrono::milliseconds(5));
  // The coordinator first: its lists decide whom the server answers.
  bool any = false;
  while (auto m = coordinator_->recv()) {
    count(Traffic::kControl, false, m->ByteSizeLong());
    if (on_coordinator(*m)) continue;
    MutexLock lock(mutex_);
    from_coordinator_.push_back(std::move(*m));
    any = true;
  }
  if (any) arrived_.notify_all();
  server_->serve(blobs_, now_seconds());  // a bounded batch: the heartbeat below is never starved
  std::vector<std::string> ids;
  for (const auto& [id, c] : clients_) ids.push_back(id);
  for (const std::string& id : ids) {
    // on_reply may advance a want to a new source, which may open (never close) a connection.
    for (int n = 0; n < 64; ++n) {
      const auto it = clients_.find(id);
      if (it == clients_.end()) break;  // closed to make room for another
      auto m = it->second.client->recv();
      if (!m) break;
      count(traffic_of(*m), false, m->ByteSizeLong());
      ++pool_events_;
      on_reply(id, std::move(*m));
    }
  }
  sync_socket_counters();
  const double now = now_seconds();
  expire_wants(now);
  finish_jobs(now);
  if (now >= next_cleanup_) {
    close_idle_clients(now);
    next_cleanup_ = now + kCleanupSeconds;
    MutexLock lock(mutex_);
    counters_.connections_open = clients_.size();
  }
  bool joined;
  {
    MutexLock lock(mutex_);
    joined = !settings_.run_id.empty();
  }
  // Heartbeats start once the run is known: before its Join, the coordinator would refuse them.
  if (joined && now >= next_heartbeat) {
    wire::Envelope hb;
    {
      MutexLock lock(mutex_);
      hb.mutable_heartbeat()->set_applied_steps(applied_steps_);
      hb.mutable_heartbeat()->set_next_round(next_round_);
    }
    count(Traffic::kControl, true, hb.ByteSizeLong());
    coordinator_->send(hb);
    next_heartbeat = now + 1.0;
  }
}

void PeerNetwork::run() {
  double next_heartbeat = 0;
  while (!stop_.load()) {
    try {
      loop_once(next_heartbeat);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;  // the context is closing: nothing more can be sent
      // One socket's error (EINTR, a full queue, a connection torn down) must not end the
      // thread: a peer whose I/O thread dies stops heartbeating and is dropped.
      bump(&NetworkCounters::io_errors);
      obs::log_warn({}, fmt::format("network: {} (errno {}); carrying on", e.what(), e.num()));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (const std::exception& e) {
      bump(&NetworkCounters::io_errors);
      obs::log_warn({}, fmt::format("network: {}; carrying on", detail::printable(e.what(), 400)));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace agora::peer
