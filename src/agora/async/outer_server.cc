#include "agora/async/outer_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/token_bucket.h"
#include "agora/data/data_meta.h"
#include "agora/data/sampler.h"
#include "agora/optim/async_outer.h"
#include "agora/optim/payload_tensors.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/published_policy.h"
#include "agora/train/step.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

// A worker silent this long is forgotten (its work lapses; a ban stays).
constexpr double kWorkerIdleSeconds = 120;
// Hellos from keys the server does not know yet, a second and at once.
constexpr double kHellosPerSecond = 20, kHelloBurst = 100;
// Deltas kept for workers catching up; one further behind gets the whole parameters.
constexpr uint64_t kDeltasKept = 64;
// Copies of theta kept for validation after the run, at most.
constexpr double kMaxSnapshots = 1000;
constexpr double kMaxSnapshotBytes = 8e9;

const std::vector<std::string>& methods() {
  static const std::vector<std::string> m = {"sync", "async", "dylu", "lookahead",
                                             "lookahead_discounted"};
  return m;
}

struct Work {
  uint64_t id = 0;
  uint64_t version = 0;  // the parameters it starts from
  uint64_t first_sequence = 0;
  int64_t steps = 0;
  double handed_at = 0;
};

struct Worker {
  net::PublicKey key;  // ed25519
  std::string name;    // its key in hex
  TokenBucket rate;
  double last_seen = 0;
  int strikes = 0;
  bool banned = false;
  std::optional<Work> work;
  PaceEstimate pace;
  uint64_t delivered_round = UINT64_MAX;  // sync: the last version it delivered for
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
};

struct Snapshot {
  OuterEvalPoint point;
  std::vector<torch::Tensor> theta;
};

class Server {
 public:
  Server(const RunConfig& config, const net::Identity& identity, const OuterServerOptions& o);
  OuterServerSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  double run_seconds() const { return started_run_ < 0 ? 0 : now() - started_run_; }
  void handle(const net::Incoming& in);
  void on_hello(const net::Incoming& in);
  void on_get_params(const net::Incoming& in, Worker& w);
  void on_get_work(const net::Incoming& in, Worker& w);
  void on_delivery(const net::Incoming& in, Worker& w);
  void receipt(const net::Incoming& in, uint64_t work_id, std::string_view verdict,
               const std::string& reason, Worker& w);
  void apply(const std::vector<torch::Tensor>& d);  // moves theta, publishes the new version
  void snapshot_due(bool force);
  void progress_line(bool force);
  void log(nlohmann::json row);
  int64_t serving() const;  // workers not banned

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
  std::map<uint64_t, std::shared_ptr<const std::string>> deltas_;  // version -> RlPolicy bytes
  std::shared_ptr<const std::string> whole_;
  uint64_t whole_version_ = UINT64_MAX;
  std::map<std::string, Worker> workers_;  // by curve key
  TokenBucket hellos_;
  NormGuard guard_;
  uint64_t next_work_ = 1, next_sequence_ = 0;
  // sync: the round's accepted pseudo-gradients, summed, and how many.
  std::vector<torch::Tensor> round_sum_;
  int64_t round_accepted_ = 0, round_resolved_ = 0, round_handed_ = 0;
  std::vector<Snapshot> snapshots_;
  double next_snapshot_ = 0;
  int64_t staleness_sum_ = 0, accepted_ = 0;
  OuterServerSummary summary_;
  std::ofstream events_;
  const Clock::time_point started_ = Clock::now();
  double started_run_ = -1, last_progress_ = -10;
};

std::vector<torch::Tensor> parameters_of(Llama& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach());
  return out;
}

Llama fresh_model(const RunConfig& config) {
  // The seed's initialisation, as every worker computes it.
  Learner learner = Learner::create(config, torch::kCPU);
  return learner.model;
}

net::DecodeLimits server_limits() {
  net::DecodeLimits limits;
  limits.max_control = 64 << 10;  // hellos and work requests are tiny
  return limits;                  // max_data: one pseudo-gradient
}

Server::Server(const RunConfig& config, const net::Identity& identity,
               const OuterServerOptions& o)
    : config_(config),
      o_(o),
      H_(o.inner_steps > 0 ? o.inner_steps : config.diloco.inner_steps),
      sequences_per_step_(config.train.batch_size / o.workers),
      live_(fresh_model(config)),
      outer_(parameters_of(live_),
             AsyncOuterOptions{o.method == "lookahead"              ? OuterRule::kLookahead
                               : o.method == "lookahead_discounted" ? OuterRule::kLookaheadDiscounted
                                                                    : OuterRule::kNesterov,
                               o.outer_lr > 0 ? o.outer_lr : config.diloco.outer_lr,
                               o.outer_momentum >= 0 ? o.outer_momentum
                                                     : config.diloco.outer_momentum}),
      published_(live_, 0),
      base_hash_(hash_parameters(live_).state_hash),
      key_hex_(net::key_to_hex(identity.public_key())),
      context_(o.admission),
      server_(context_, identity, o.listen, server_limits(), /*reply_queue=*/1024),
      guard_(o.norm_guard) {
  live_->eval();
  // The copies of theta wait in memory until the run ends: bound them.
  int64_t bytes = 0;
  for (const auto& p : live_->parameters()) bytes += p.numel() * 4;
  const double copies = std::floor(o_.seconds / o_.eval_every) + 2;
  if (copies * static_cast<double>(bytes) > kMaxSnapshotBytes) {
    fail("--seconds {} / --eval-every {} keeps {:.0f} copies of a {:.0f} MB model for validation, "
         "more than {:.0f} GB: validate less often",
         o_.seconds, o_.eval_every, copies, bytes / 1e6, kMaxSnapshotBytes / 1e9);
  }
  std::filesystem::create_directories(o_.out);
  events_.open(o_.out / "events.jsonl", std::ios::trunc);
  if (!events_) fail("cannot write {}", (o_.out / "events.jsonl").string());
}

int64_t Server::serving() const {
  int64_t n = 0;
  for (const auto& [curve, w] : workers_) n += w.banned ? 0 : 1;
  return n;
}

void Server::log(nlohmann::json row) {
  row["t"] = run_seconds();
  events_ << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
          << std::flush;
}

void Server::handle(const net::Incoming& in) {
  if (in.message.has_async_hello()) return on_hello(in);
  const auto it = workers_.find(in.curve_key);
  if (it == workers_.end()) return;  // say hello first
  Worker& w = it->second;
  w.last_seen = now();
  if (!w.rate.take(o_.worker_messages_per_second, o_.worker_burst, now())) return;
  if (w.banned) {
    if (in.message.has_async_get_work()) {
      wire::Envelope e;
      e.mutable_async_work()->set_refused(
          fmt::format("banned after {} strikes", w.strikes));
      server_.send(in.route, e);
    }
    return;
  }
  if (in.message.has_rl_get_policy()) return on_get_params(in, w);
  if (in.message.has_async_get_work()) return on_get_work(in, w);
  if (in.message.has_async_delivery()) return on_delivery(in, w);
}

void Server::on_hello(const net::Incoming& in) {
  const auto known = workers_.find(in.curve_key);
  TokenBucket& bucket = known != workers_.end() ? known->second.rate : hellos_;
  const bool ok_rate =
      known != workers_.end()
          ? bucket.take(o_.worker_messages_per_second, o_.worker_burst, now())
          : bucket.take(kHellosPerSecond, kHelloBurst, now());
  if (!ok_rate) return;
  const std::string& key = in.message.async_hello().key();
  bool matches = false;
  if (key.size() == net::kKeyBytes) {
    try {
      matches = net::curve_public_of(key) == in.curve_key;
    } catch (const Error&) {
      matches = false;
    }
  }
  wire::Envelope e;
  auto* run = e.mutable_async_run();
  if (!matches) {
    run->set_refused("AsyncHello.key is not the ed25519 key this connection authenticated with");
  } else if (known == workers_.end() && serving() >= o_.max_workers) {
    run->set_refused(fmt::format("the server serves at most {} workers", o_.max_workers));
  } else {
    auto [it, fresh] = workers_.try_emplace(in.curve_key);
    Worker& w = it->second;
    w.last_seen = now();
    if (fresh) {
      w.key = key;
      w.name = net::key_to_hex(key);
      log({{"event", "async_worker"}, {"worker", w.name}, {"state", "joined"}});
    }
    if (w.banned) run->set_refused(fmt::format("banned after {} strikes", w.strikes));
  }
  if (run->refused().empty()) {
    run->set_run_id(o_.run_id);
    run->set_method(o_.method);
    run->set_base_hash(base_hash_);
    run->set_version(published_.version());
    run->set_int8(o_.int8);
    run->set_sequences_per_step(static_cast<uint64_t>(sequences_per_step_));
  }
  server_.send(in.route, e);
}

void Server::on_get_params(const net::Incoming& in, Worker& w) {
  const auto& ask = in.message.rl_get_policy();
  const uint64_t newest = published_.version();
  if (ask.have_version() >= newest && !ask.whole()) return;
  int64_t queued = 0;
  for (const auto& [curve, other] : workers_) queued += other.in_flight->load();
  const auto send = [&](const std::shared_ptr<const std::string>& bytes) {
    const auto size = static_cast<int64_t>(bytes->size());
    if (queued + size > o_.max_param_bytes_in_flight && *w.in_flight > 0) return false;
    if (server_.send_shared(in.route, bytes, w.in_flight) != net::Server::SendResult::kQueued) {
      return false;
    }
    queued += size;
    return true;
  };
  if (!ask.whole() && deltas_.count(ask.have_version() + 1) > 0) {
    for (uint64_t v = ask.have_version() + 1; v <= newest; ++v) {
      if (!send(deltas_.at(v))) return;  // the worker asks again, from what it has
    }
    return;
  }
  if (whole_version_ != newest) {
    wire::Envelope e;
    auto* p = e.mutable_rl_policy();
    p->set_from_version(0);
    p->set_to_version(newest);
    p->set_whole(true);
    p->set_payload(published_.whole());
    p->set_state_hash(published_.state_hash());
    whole_ = std::make_shared<const std::string>(net::encode_envelope(e));
    whole_version_ = newest;
  }
  send(whole_);
}

void Server::on_get_work(const net::Incoming& in, Worker& w) {
  const uint64_t have = in.message.async_get_work().have_version();
  const uint64_t newest = published_.version();
  wire::Envelope e;
  auto* work = e.mutable_async_work();
  work->set_version(newest);
  const bool over = started_run_ >= 0 && run_seconds() >= o_.seconds;
  if (over) {
    work->set_finished(true);
  } else if (started_run_ < 0) {
    work->set_retry_ms(200);  // waiting for the run's workers to join
  } else if (have != newest) {
    // Every method hands out work from the newest parameters: the worker fetches them first.
    work->set_retry_ms(0);
  } else if (o_.method == "sync" &&
             (w.delivered_round == newest || round_handed_ >= serving())) {
    work->set_retry_ms(20);  // this round's work is out; the next round starts when it is in
  } else {
    if (w.work && o_.method == "sync") ++round_resolved_;  // its round work lapses
    Work next;
    next.id = next_work_++;
    next.version = newest;
    next.first_sequence = next_sequence_;
    next.steps = H_;
    if (o_.method == "dylu" && w.pace.known()) {
      double fastest = w.pace.seconds_per_step();
      for (const auto& [curve, other] : workers_) {
        if (!other.banned && other.pace.known()) {
          fastest = std::min(fastest, other.pace.seconds_per_step());
        }
      }
      next.steps = dylu_inner_steps(w.pace.seconds_per_step(), fastest, H_);
    }
    next.handed_at = now();
    next_sequence_ += static_cast<uint64_t>(next.steps * sequences_per_step_);
    if (o_.method == "sync") ++round_handed_;
    work->set_work_id(next.id);
    work->set_first_sequence(next.first_sequence);
    work->set_steps(static_cast<uint32_t>(next.steps));
    w.work = next;
  }
  server_.send(in.route, e);
}

void Server::receipt(const net::Incoming& in, uint64_t work_id, std::string_view verdict,
                     const std::string& reason, Worker& w) {
  ++summary_.verdicts[std::string(verdict)];
  if (strikes(verdict)) {
    ++w.strikes;
    if (w.strikes >= o_.max_strikes && !w.banned) {
      w.banned = true;
      w.work.reset();
      log({{"event", "async_worker"},
           {"worker", w.name},
           {"state", "banned"},
           {"strikes", w.strikes}});
    }
  }
  wire::Envelope e;
  auto* r = e.mutable_async_receipt();
  r->set_work_id(work_id);
  r->set_verdict(std::string(verdict));
  r->set_reason(reason);
  r->set_version(published_.version());
  server_.send(in.route, e);
}

void Server::on_delivery(const net::Incoming& in, Worker& w) {
  const auto& d = in.message.async_delivery();
  nlohmann::json row = {{"event", "async_delivery"}, {"worker", w.name}, {"work_id", d.work_id()}};
  const auto refuse = [&](std::string_view verdict, const std::string& reason) {
    row["verdict"] = verdict;
    row["reason"] = reason.substr(0, 300);
    log(row);
    receipt(in, d.work_id(), verdict, reason, w);
  };
  if (!w.work || w.work->id != d.work_id()) {
    return refuse(kUnassigned, fmt::format("work {} is not the work this worker holds", d.work_id()));
  }
  const Work work = *w.work;
  w.work.reset();
  if (o_.method == "sync") ++round_resolved_;
  if (!net::verify_signature(w.key, delivery_signing_bytes(o_.run_id, d.work_id(), d.payload()),
                             d.signature())) {
    return refuse(kBadSignature,
                  "the signature is not the worker's over delivery_signing_bytes(run, work, payload)");
  }
  Payload payload;
  try {
    payload = decode_payload(d.payload(), PublishedPolicy::layout(live_, /*whole=*/!o_.int8));
    if (payload.step != work.id) fail("the payload's step is {}, not the work id {}", payload.step, work.id);
  } catch (const Error& e) {
    return refuse(kMalformed, e.what());
  }
  const uint64_t staleness = published_.version() - work.version;
  row["staleness"] = staleness;
  row["steps"] = work.steps;
  if (static_cast<int64_t>(staleness) > o_.max_staleness) {
    return refuse(kStale, fmt::format("from version {}, {} versions behind (allowed: at most {})",
                                      work.version, staleness, o_.max_staleness));
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> delta;
  double sq = 0, theta_sq = 0;
  for (size_t i = 0; i < payload.tensors.size(); ++i) {
    delta.push_back(to_tensor(payload.tensors[i]));
    sq += delta.back().square().sum().item<double>();
    theta_sq += outer_.theta()[i].square().sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  row["norm"] = norm;
  if (const auto why = guard_.check(norm, std::sqrt(theta_sq), work.steps)) {
    return refuse(kOutlier, *why);
  }
  guard_.accept(norm, work.steps);
  w.pace.add((now() - work.handed_at) / static_cast<double>(work.steps));
  summary_.tokens += work.steps * sequences_per_step_ * config_.data.seq_len;
  summary_.bytes_per_delivery = static_cast<double>(d.payload().size());
  staleness_sum_ += static_cast<int64_t>(staleness);
  summary_.staleness_max = std::max<int64_t>(summary_.staleness_max, static_cast<int64_t>(staleness));
  ++accepted_;
  if (o_.method == "sync") {
    w.delivered_round = work.version;
    if (round_sum_.empty()) {
      round_sum_ = std::move(delta);
    } else {
      for (size_t i = 0; i < delta.size(); ++i) round_sum_[i].add_(delta[i]);
    }
    ++round_accepted_;
  } else {
    snapshot_due(false);  // copies due before this arrival see theta as it was
    apply(delta);
  }
  row["verdict"] = kAccepted;
  row["version"] = published_.version();
  log(row);
  receipt(in, d.work_id(), kAccepted, "", w);
}

void Server::apply(const std::vector<torch::Tensor>& d) {
  outer_.apply(d);
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& p : live_->parameters()) p.copy_(outer_.theta()[i++]);
  const std::string delta = published_.advance(live_);
  wire::Envelope e;
  auto* p = e.mutable_rl_policy();
  p->set_from_version(published_.version() - 1);
  p->set_to_version(published_.version());
  p->set_payload(delta);
  p->set_state_hash(published_.state_hash());
  deltas_[published_.version()] = std::make_shared<const std::string>(net::encode_envelope(e));
  while (deltas_.size() > kDeltasKept) deltas_.erase(deltas_.begin());
}

void Server::snapshot_due(bool force) {
  if (started_run_ < 0) return;
  const double t = run_seconds();
  while ((next_snapshot_ <= t && next_snapshot_ < o_.seconds) || force) {
    Snapshot s;
    s.point.seconds = force ? std::min(t, o_.seconds) : next_snapshot_;
    s.point.tokens = summary_.tokens;
    s.point.updates = outer_.updates();
    for (const auto& p : outer_.theta()) s.theta.push_back(p.clone());
    snapshots_.push_back(std::move(s));
    if (force) break;
    next_snapshot_ += o_.eval_every;
  }
}

void Server::progress_line(bool force) {
  if (!o_.progress || (!force && now() - last_progress_ < 5)) return;
  last_progress_ = now();
  int64_t refused = 0;
  for (const auto& [verdict, n] : summary_.verdicts) refused += verdict == kAccepted ? 0 : n;
  fmt::print(stderr, "async {} {:>6.1f}/{:g} s  workers {}  updates {}  accepted {}  refused {}  {:.0f} tok/s\n",
             o_.method, run_seconds(), o_.seconds, serving(), outer_.updates(), accepted_, refused,
             run_seconds() > 0 ? static_cast<double>(summary_.tokens) / run_seconds() : 0.0);
}

OuterServerSummary Server::run() {
  log({{"event", "async_start"},
       {"method", o_.method},
       {"workers", o_.workers},
       {"inner_steps", H_},
       {"sequences_per_step", sequences_per_step_},
       {"listen", server_.bound_endpoint()},
       {"key", key_hex_}});
  double finished_at = -1;
  const auto stopped = [&] { return o_.stop && o_.stop->load(); };
  while ((finished_at < 0 || now() - finished_at < o_.linger_seconds) && !stopped()) {
    zmq::pollitem_t item{server_.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
    for (int i = 0; i < 256; ++i) {
      std::optional<net::Incoming> in = server_.recv();
      if (!in) break;
      handle(*in);
    }
    if (started_run_ < 0) {
      if (serving() >= o_.workers) {
        started_run_ = now();
        log({{"event", "async_running"}, {"workers", serving()}});
      }
    }
    snapshot_due(false);
    // sync: the round ends when every piece of its work is resolved.
    // A banned or forgotten worker leaves the round smaller.
    if (o_.method == "sync" && round_handed_ > 0 && round_handed_ >= serving() &&
        round_resolved_ >= round_handed_) {
      if (round_accepted_ > 0) {
        for (auto& t : round_sum_) t.div_(static_cast<double>(round_accepted_));
        apply(round_sum_);
      }
      round_sum_.clear();
      round_accepted_ = round_resolved_ = round_handed_ = 0;
    }
    if (finished_at < 0 && started_run_ >= 0 && run_seconds() >= o_.seconds) {
      finished_at = now();
      log({{"event", "async_finishing"}});
    }
    for (auto it = workers_.begin(); it != workers_.end();) {
      const bool idle = now() - it->second.last_seen > kWorkerIdleSeconds;
      if (idle && !it->second.banned) {
        if (it->second.work && o_.method == "sync") ++round_resolved_;
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    progress_line(false);
  }
  progress_line(true);
  snapshot_due(true);

  // Validation of the copies, now that nobody is waiting.
  const Sampler val =
      Sampler::from_directory(config_.data.dir, "val", config_.data.seq_len, config_.seed);
  const int64_t windows = o_.eval_windows > 0 ? o_.eval_windows : config_.train.eval_windows;
  Llama evaluator = fresh_model(config_);
  evaluator->eval();
  for (const Snapshot& s : snapshots_) {
    {
      torch::NoGradGuard no_grad;
      size_t i = 0;
      for (auto& p : evaluator->parameters()) p.copy_(s.theta[i++]);
    }
    OuterEvalPoint point = s.point;
    point.val_loss = evaluate(evaluator, val, windows, config_.train.micro_batch_size).loss;
    summary_.curve.push_back(point);
    log({{"event", "async_eval"},
         {"seconds", point.seconds},
         {"tokens", point.tokens},
         {"updates", point.updates},
         {"val_loss", point.val_loss}});
  }
  summary_.updates = outer_.updates();
  summary_.final_val_loss = summary_.curve.empty() ? NAN : summary_.curve.back().val_loss;
  summary_.staleness_mean =
      accepted_ > 0 ? static_cast<double>(staleness_sum_) / static_cast<double>(accepted_) : 0;
  summary_.seconds = run_seconds();
  for (const auto& [curve, w] : workers_) {
    if (w.banned) summary_.banned[w.name] = w.strikes;
  }
  log({{"event", "async_summary"},
       {"method", o_.method},
       {"updates", summary_.updates},
       {"tokens", summary_.tokens},
       {"verdicts", summary_.verdicts},
       {"banned", summary_.banned},
       {"staleness_mean", summary_.staleness_mean},
       {"staleness_max", summary_.staleness_max},
       {"bytes_per_delivery", summary_.bytes_per_delivery},
       {"final_val_loss", summary_.final_val_loss},
       {"seconds", summary_.seconds}});

  const DataMeta data = read_data_meta(config_.data.dir);
  CheckpointMeta meta;
  meta.step = outer_.updates();
  meta.tokens_seen = static_cast<uint64_t>(summary_.tokens);
  meta.eot_id = data.eot_id;
  meta.val_loss = summary_.final_val_loss;
  save_checkpoint(o_.out / "final", live_, meta, data.tokenizer_spec, config_.to_toml(),
                  std::nullopt);
  return summary_;
}

}  // namespace

void validate(const OuterServerOptions& o, const RunConfig& config) {
  if (std::find(methods().begin(), methods().end(), o.method) == methods().end()) {
    fail("async method '{}' is not known (allowed: sync, async, dylu, lookahead, "
         "lookahead_discounted)",
         o.method);
  }
  if (o.workers < 1 || config.train.batch_size % o.workers != 0) {
    fail("async workers = {} must be >= 1 and divide train.batch_size = {}", o.workers,
         config.train.batch_size);
  }
  const int64_t per = config.train.batch_size / o.workers;
  if (per % std::min(per, config.train.micro_batch_size) != 0) {
    fail("each worker trains {} sequences a step, not a multiple of train.micro_batch_size = {}",
         per, config.train.micro_batch_size);
  }
  if (o.inner_steps < 0 || o.inner_steps > 100000) {
    fail("async inner steps {} is invalid (allowed: 0 = diloco.inner_steps, or 1 to 100000)",
         o.inner_steps);
  }
  if (!(o.seconds > 0) || !(o.eval_every > 0) || o.seconds / o.eval_every > kMaxSnapshots) {
    fail("async seconds {} and eval-every {} are invalid (allowed: both > 0, at most {} "
         "validations)",
         o.seconds, o.eval_every, kMaxSnapshots);
  }
  if (o.max_staleness < 0) fail("async max staleness {} is invalid (allowed: >= 0)", o.max_staleness);
  if (o.max_strikes < 1) fail("async max strikes {} is invalid (allowed: >= 1)", o.max_strikes);
  if (o.max_workers < o.workers) {
    fail("async max workers {} is below the run's workers {}", o.max_workers, o.workers);
  }
  if (!(o.norm_guard.max_relative > 0) || !(o.norm_guard.max_ratio > 1)) {
    fail("async norm guard ({} x theta, {} x median) is invalid (allowed: > 0 and > 1)",
         o.norm_guard.max_relative, o.norm_guard.max_ratio);
  }
  if (o.run_id.empty() || o.run_id.size() > 200) {
    fail("async run id '{}' is invalid (allowed: 1 to 200 characters)", o.run_id);
  }
}

OuterServerSummary serve_outer(const RunConfig& base, const net::Identity& identity,
                               const OuterServerOptions& options) {
  RunConfig config = base;
  config.optimizer.name = "adamw";  // the workers' inner optimizer; the outer one is here
  validate(options, config);
  torch::set_num_threads(config.train.threads > 0 ? static_cast<int>(config.train.threads) : 1);
  Server server(config, identity, options);
  return server.run();
}

}  // namespace agora
