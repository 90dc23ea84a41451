#include "agora/peer/peer_network.h"

#include <fmt/format.h>

#include <chrono>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/obs/metrics_catalogue.h"

namespace agora::peer {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

Traffic traffic_of(const wire::Envelope& m) {
  if (m.has_get_blob() || m.has_blob()) return Traffic::kPayload;
  if (m.has_get_tensor() || m.has_tensor_data()) return Traffic::kState;
  return Traffic::kControl;
}

}  // namespace

// One thing to fetch: a payload (by hash) or a snapshot tensor (by name).
struct PeerNetwork::Want {
  std::string key;
  wire::Envelope request;
  std::vector<wire::Member> sources;
  size_t next_source = 0;
  std::string asked;  // the endpoint asked now; "" = none
  double deadline = 0;
  double timeout = 10;
  double started = 0;  // when the first source was asked
  bool done = false, ok = false;
  std::string reason;
  wire::CommitRecord record;  // payloads
  std::string expected_hash;  // tensors
  TensorBytes tensor;         // tensors, once fetched
};

// A set of wants that finishes together: a step's collection, an ensure(), a state fetch.
struct PeerNetwork::Job {
  uint64_t step = 0;
  bool witness = false;
  std::vector<Want> wants;
  bool finished = false;   // under mutex_
  bool cancelled = false;  // under mutex_: the waiter gave up
};

PeerNetwork::PeerNetwork(const net::Identity& identity, PeerNetworkOptions options)
    : identity_(identity), options_(std::move(options)) {
  server_ = std::make_unique<net::Server>(context_, identity_, options_.listen, options_.limits);
  endpoint_ = options_.advertise.empty() ? server_->bound_endpoint() : options_.advertise;
  if (endpoint_.find("0.0.0.0") != std::string::npos) {
    // A wildcard bind is not dialable; loopback is the right guess only on one machine, so
    // real runs pass --advertise (docs/running.md).
    endpoint_.replace(endpoint_.find("0.0.0.0"), 7, "127.0.0.1");
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

void PeerNetwork::configure(std::string run_id, PayloadValidator validator) {
  MutexLock lock(mutex_);
  run_id_ = std::move(run_id);
  validator_ = std::move(validator);
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

void PeerNetwork::collect(uint64_t step, std::vector<wire::CommitRecord> commits,
                          std::vector<wire::Member> members, bool witness) {
  submit(collect_job(step, std::move(commits), members, witness));
}

std::shared_ptr<PeerNetwork::Job> PeerNetwork::collect_job(uint64_t step,
                                                           std::vector<wire::CommitRecord> commits,
                                                           const std::vector<wire::Member>& members,
                                                           bool witness) {
  auto job = std::make_shared<Job>();
  job->step = step;
  job->witness = witness;
  for (auto& record : commits) {
    Want want;
    want.key = record.payload_hash();
    want.record = record;
    want.timeout = options_.blob_timeout_seconds;
    want.request.mutable_get_blob()->set_hash(record.payload_hash());
    // The author first, then everyone else in the members' order.
    for (const auto& m : members) {
      if (m.key() == record.author()) want.sources.push_back(m);
    }
    for (const auto& m : members) {
      if (m.key() != record.author() && m.key() != identity_.public_key()) {
        want.sources.push_back(m);
      }
    }
    if (blobs_.contains(want.key)) want.done = want.ok = true;
    job->wants.push_back(std::move(want));
  }
  return job;
}

bool PeerNetwork::wait_for(Job& job, double timeout_seconds) {
  const auto deadline = deadline_after(timeout_seconds);
  MutexLock lock(mutex_);
  while (!job.finished) {
    if (arrived_.wait_until(mutex_, deadline) == std::cv_status::timeout) break;
  }
  job.cancelled = !job.finished;
  return job.finished;
}

void PeerNetwork::submit(std::shared_ptr<Job> job) {
  MutexLock lock(mutex_);
  new_jobs_.push_back(std::move(job));
}

std::vector<std::string> PeerNetwork::ensure(uint64_t step,
                                             const std::vector<wire::CommitRecord>& set,
                                             std::vector<wire::Member> members,
                                             double timeout_seconds) {
  std::vector<wire::CommitRecord> missing;
  for (const auto& record : set) {
    if (!blobs_.contains(record.payload_hash())) missing.push_back(record);
  }
  if (missing.empty()) return {};
  const auto job = collect_job(step, missing, members, /*witness=*/false);
  submit(job);
  wait_for(*job, timeout_seconds);
  std::vector<std::string> still;
  for (const auto& record : missing) {
    if (!blobs_.contains(record.payload_hash())) still.push_back(record.payload_hash());
  }
  return still;
}

void PeerNetwork::publish_snapshot(uint64_t applied_steps,
                                   std::shared_ptr<const Snapshot> snapshot) {
  MutexLock lock(mutex_);
  snapshots_[applied_steps] = std::move(snapshot);
  while (snapshots_.size() > 2) snapshots_.erase(snapshots_.begin());
}

Snapshot PeerNetwork::fetch_state(const wire::StateRecord& state,
                                  const std::vector<wire::Member>& holders,
                                  double timeout_seconds) {
  if (state.tensor_names_size() != state.tensor_hashes_size()) {
    fail("the coordinator's state record lists {} tensors but {} hashes", state.tensor_names_size(),
         state.tensor_hashes_size());
  }
  std::vector<wire::Member> others;
  for (const auto& h : holders) {
    if (h.key() != identity_.public_key()) others.push_back(h);
  }
  if (others.empty()) fail("no member holds the parameters after step {}", state.applied_steps());
  const double started = now_seconds();
  auto job = std::make_shared<Job>();
  for (int i = 0; i < state.tensor_names_size(); ++i) {
    Want want;
    want.key = state.tensor_names(i);
    want.expected_hash = state.tensor_hashes(i);
    want.timeout = options_.tensor_timeout_seconds;
    auto* get = want.request.mutable_get_tensor();
    get->set_applied_steps(state.applied_steps());
    get->set_name(want.key);
    // Spread the tensors over the holders: tensor i starts at holder i.
    for (size_t k = 0; k < others.size(); ++k) {
      want.sources.push_back(others[(static_cast<size_t>(i) + k) % others.size()]);
    }
    job->wants.push_back(std::move(want));
  }
  submit(job);
  if (!wait_for(*job, timeout_seconds)) {
    fail("fetching the parameters after step {} took longer than {} s", state.applied_steps(),
         timeout_seconds);
  }
  Snapshot out;
  for (Want& want : job->wants) {
    if (!want.ok) {
      fail("tensor {} of the parameters after step {}: {}", want.key, state.applied_steps(),
           want.reason);
    }
    out[want.key] = std::move(want.tensor);
  }
  if (state_fetch_ != nullptr) state_fetch_->observe(now_seconds() - started);
  return out;
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
  return c;
}

void PeerNetwork::count(Traffic kind, bool sent, uint64_t bytes) {
  (sent ? sent_ : received_)[static_cast<size_t>(kind)].fetch_add(bytes);
}

void PeerNetwork::reject(Rejection why) {
  rejected_[static_cast<size_t>(why)].fetch_add(1);
}

void PeerNetwork::sync_socket_counters() {
  // The sockets belong to this thread; copy their drop tallies out when they change.
  uint64_t dropped = server_->dropped() + coordinator_->dropped();
  for (const auto& [endpoint, client] : clients_) dropped += client->dropped();
  if (dropped == dropped_seen_) return;
  dropped_seen_ = dropped;
  std::map<std::string, uint64_t> by_reason = server_->drops_by_reason();
  for (const auto& [reason, n] : coordinator_->drops_by_reason()) by_reason[reason] += n;
  for (const auto& [endpoint, client] : clients_) {
    for (const auto& [reason, n] : client->drops_by_reason()) by_reason[reason] += n;
  }
  MutexLock lock(mutex_);
  counters_.dropped_messages = dropped;
  counters_.dropped_by_reason = std::move(by_reason);
}

net::Client& PeerNetwork::client_for(const wire::Member& member) {
  auto& client = clients_[member.endpoint()];
  if (!client) {
    client = std::make_unique<net::Client>(context_, identity_, member.endpoint(), member.key(),
                                           options_.limits);
  }
  return *client;
}

void PeerNetwork::advance(Want& want, double now) {
  while (want.next_source < want.sources.size()) {
    const wire::Member& source = want.sources[want.next_source++];
    if (source.endpoint() == endpoint_) continue;
    try {
      client_for(source).send(want.request);
      count(traffic_of(want.request), true, want.request.ByteSizeLong());
      if (want.started == 0) want.started = now;
    } catch (const Error& e) {
      want.reason = e.what();
      continue;
    }
    want.asked = source.endpoint();
    want.deadline = now + want.timeout;
    return;
  }
  want.asked.clear();
  want.done = true;
  if (want.reason.empty()) want.reason = "no member could serve it";
  if (want.request.has_get_blob()) reject(Rejection::kUnavailable);
}

void PeerNetwork::on_reply(const std::string& source, wire::Envelope&& reply) {
  const double now = now_seconds();
  for (auto& job : jobs_) {
    for (Want& want : job->wants) {
      if (want.done || want.asked != source) continue;
      if (reply.has_not_found() && reply.not_found().what() == want.key) {
        want.reason = fmt::format("{} does not have it", source);
        advance(want, now);
        return;
      }
      if (reply.has_blob() && want.request.has_get_blob() && reply.blob().hash() == want.key) {
        std::string data = std::move(*reply.mutable_blob()->mutable_data());
        if (blake2b256_bytes(data) != want.key) {
          reject(Rejection::kHash);
          // A relay (or the author) sent bytes that are not the committed payload: ask another.
          want.reason = fmt::format("{} served bytes that do not match the committed hash", source);
          {
            MutexLock lock(mutex_);
            ++counters_.payloads_rejected;
          }
          advance(want, now);
          return;
        }
        std::string run_id;
        PayloadValidator validator;
        {
          MutexLock lock(mutex_);
          run_id = run_id_;
          validator = validator_;
        }
        const wire::CommitRecord& r = want.record;
        std::optional<std::string> invalid;  // why the payload is refused, if it is
        if (!net::verify_signature(
                r.author(), net::commit_signing_bytes(run_id, r.step(), want.key), r.signature())) {
          invalid = "the author's signature over the commitment does not verify";
          reject(Rejection::kSignature);
        } else if (validator && (invalid = validator(data))) {
          reject(Rejection::kLayout);
        }
        want.done = true;
        want.asked.clear();
        want.ok = !invalid;
        if (invalid) want.reason = std::move(*invalid);
        if (want.ok && payload_fetch_ != nullptr) payload_fetch_->observe(now - want.started);
        {
          MutexLock lock(mutex_);
          ++(want.ok ? counters_.payloads_fetched : counters_.payloads_rejected);
        }
        if (want.ok) blobs_.put(want.key, std::move(data), r.step());
        return;
      }
      if (reply.has_tensor_data() && want.request.has_get_tensor() &&
          reply.tensor_data().name() == want.key &&
          reply.tensor_data().applied_steps() == want.request.get_tensor().applied_steps()) {
        auto& t = *reply.mutable_tensor_data();
        if (blake2b256_bytes(t.data()) != want.expected_hash) {
          want.reason =
              fmt::format("{} served a tensor that does not match the majority's hash", source);
          advance(want, now);
          return;
        }
        want.tensor.dtype = t.dtype();
        want.tensor.shape.assign(t.shape().begin(), t.shape().end());
        want.tensor.data = std::move(*t.mutable_data());
        want.done = want.ok = true;
        want.asked.clear();
        return;
      }
    }
  }
}

void PeerNetwork::serve(net::Incoming&& in) {
  wire::Envelope reply;
  const wire::Envelope& m = in.message;
  count(traffic_of(m), false, m.ByteSizeLong());
  if (m.has_get_blob()) {
    if (auto bytes = blobs_.get(m.get_blob().hash())) {
      reply.mutable_blob()->set_hash(m.get_blob().hash());
      reply.mutable_blob()->set_data(std::move(*bytes));
    } else {
      reply.mutable_not_found()->set_what(m.get_blob().hash());
    }
  } else if (m.has_get_tensor()) {
    std::shared_ptr<const Snapshot> snapshot;
    {
      MutexLock lock(mutex_);
      const auto it = snapshots_.find(m.get_tensor().applied_steps());
      if (it != snapshots_.end()) snapshot = it->second;
    }
    const auto t = snapshot ? snapshot->find(m.get_tensor().name()) : Snapshot::const_iterator();
    if (snapshot && t != snapshot->end()) {
      auto* data = reply.mutable_tensor_data();
      data->set_applied_steps(m.get_tensor().applied_steps());
      data->set_name(t->first);
      data->set_dtype(t->second.dtype);
      for (int64_t d : t->second.shape) data->add_shape(d);
      data->set_data(t->second.data);
    } else {
      reply.mutable_not_found()->set_what(m.get_tensor().name());
    }
  } else {
    return;  // peers only ask for blobs and tensors; anything else is ignored
  }
  count(traffic_of(reply), true, reply.ByteSizeLong());
  server_->send(in.route, reply);
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

void PeerNetwork::finish_jobs() {
  std::vector<wire::Envelope> witnesses;
  {
    MutexLock lock(mutex_);  // Job::finished and Job::cancelled
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = **it;
      bool all = !job.cancelled;
      for (const Want& want : job.wants) all = all && want.done;
      if (!all && !job.cancelled) {
        ++it;
        continue;
      }
      if (job.witness && !job.cancelled) {
        wire::Envelope e;
        auto* w = e.mutable_witness();
        w->set_step(job.step);
        for (const Want& want : job.wants) {
          if (want.ok) {
            w->add_held(want.key);
          } else {
            auto* r = w->add_rejected();
            r->set_author(want.record.author());
            r->set_reason(want.reason);
          }
        }
        witnesses.push_back(std::move(e));
      }
      job.finished = true;
      it = jobs_.erase(it);
    }
  }
  arrived_.notify_all();
  for (const auto& w : witnesses) {
    count(Traffic::kControl, true, w.ByteSizeLong());
    coordinator_->send(w);
  }
}

void PeerNetwork::run() {
  double next_heartbeat = 0;
  while (!stop_.load()) {
    pump_commands();
    std::vector<zmq::pollitem_t> items = {{server_->socket().handle(), 0, ZMQ_POLLIN, 0},
                                          {coordinator_->socket().handle(), 0, ZMQ_POLLIN, 0}};
    std::vector<std::string> endpoints;
    for (auto& [endpoint, client] : clients_) {
      items.push_back({client->socket().handle(), 0, ZMQ_POLLIN, 0});
      endpoints.push_back(endpoint);
    }
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(5));
    } catch (const zmq::error_t&) {
      break;
    }
    while (auto in = server_->recv()) serve(std::move(*in));
    bool any = false;
    while (auto m = coordinator_->recv()) {
      count(Traffic::kControl, false, m->ByteSizeLong());
      MutexLock lock(mutex_);
      from_coordinator_.push_back(std::move(*m));
      any = true;
    }
    if (any) arrived_.notify_all();
    for (const std::string& endpoint : endpoints) {
      net::Client& client = *clients_.at(endpoint);
      while (auto m = client.recv()) {
        count(traffic_of(*m), false, m->ByteSizeLong());
        on_reply(endpoint, std::move(*m));
      }
    }
    sync_socket_counters();
    const double now = now_seconds();
    for (auto& job : jobs_) {
      for (Want& want : job->wants) {
        if (!want.done && !want.asked.empty() && now > want.deadline) {
          want.reason = fmt::format("{} did not answer within {} s", want.asked, want.timeout);
          advance(want, now);
        }
      }
    }
    finish_jobs();
    bool joined;
    {
      MutexLock lock(mutex_);
      joined = !run_id_.empty();
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
}

}  // namespace agora::peer
