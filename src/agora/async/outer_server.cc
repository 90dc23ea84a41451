#include "agora/async/outer_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "agora/async/outer_detail.h"
#include "agora/core/error.h"
#include "agora/data/data_identity.h"
#include "agora/data/data_meta.h"
#include "agora/data/sampler.h"
#include "agora/net/allowlist.h"
#include "agora/net/envelope.h"
#include "agora/optim/payload.h"
#include "agora/serve/poll.h"
#include "agora/train/checkpoint.h"
#include "agora/train/evaluate.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/step.h"

namespace agora {
namespace outer_detail {
namespace {

const std::vector<std::string>& methods() {
  static const std::vector<std::string> m = {"sync", "async", "dylu", "lookahead",
                                             "lookahead_discounted"};
  return m;
}

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

net::DecodeLimits server_limits(Llama& model, bool int8) {
  net::DecodeLimits limits;
  limits.max_control = 64 << 10;  // hellos and work requests are tiny
  // A delivery is one pseudo-gradient of a size known in advance: anything larger is dropped by
  // the socket before it is buffered.
  limits.max_data =
      net::fits_one_message(encoded_size(PublishedPolicy::layout(model, /*whole=*/!int8)) + 4096,
                            "this model's pseudo-gradients");
  return limits;
}

}  // namespace

Server::Server(const RunConfig& config, const net::Identity& identity, const OuterServerOptions& o)
    : config_(config),
      o_(o),
      H_(o.inner_steps > 0 ? o.inner_steps : config.diloco.inner_steps),
      sequences_per_step_(config.train.batch_size / o.workers),
      live_(fresh_model(config)),
      outer_(
          parameters_of(live_),
          AsyncOuterOptions{o.outer_rule.empty() ? outer_rule_of_method(o.method)
                                                 : parse_outer_rule(o.outer_rule),
                            o.outer_lr > 0 ? o.outer_lr : config.diloco.outer_lr,
                            o.outer_momentum >= 0 ? o.outer_momentum : config.diloco.outer_momentum,
                            /*buffer=*/std::max<int64_t>(1, o.workers)}),
      published_(live_, 0),
      base_hash_(hash_parameters(live_).state_hash),
      key_hex_(net::key_to_hex(identity.public_key())),
      context_(o.admission),
      server_(context_, identity, o.listen, server_limits(live_, o.int8), /*reply_queue=*/1024),
      feed_(
          serve::ParamFeed::Limits{o.max_param_bytes_in_flight, o.max_param_bytes_in_flight,
                                   kDeltasKept},
          [this] { return published_.whole(); }, published_.version(), published_.state_hash()),
      workers_(worker_limits(o)),
      guard_(o.norm_guard) {
  live_->eval();
  // The copies of theta wait on disk until the run ends: bound them.
  int64_t bytes = 0;
  for (const auto& p : live_->parameters()) bytes += p.numel() * 4;
  const double copies = std::floor(o_.seconds / o_.eval_every) + 2;
  if (copies * static_cast<double>(bytes) > kMaxSnapshotBytes) {
    fail(
        "--seconds {} / --eval-every {} keeps {:.0f} copies of a {:.0f} MB model for validation, "
        "more than {:.0f} GB: validate less often",
        o_.seconds, o_.eval_every, copies, bytes / 1e6, kMaxSnapshotBytes / 1e9);
  }
  if (!config_.data.hash.empty()) {
    // Served to workers without a copy, who check it against the same hash.
    data_ = std::make_unique<serve::DataService>(config_.data.dir);
    if (data_->hex() != config_.data.hash) {
      check_data_identity(config_.data.dir, config_.data.hash);  // names both hashes
    }
  }
  std::filesystem::create_directories(o_.out);
  // An unfinished run in this folder resumes; a finished one's is replaced by a new run.
  store_ = std::make_unique<OuterStore>(o_.out / "state", fingerprint());
  if (std::optional<OuterSave> save = store_->load()) {
    if (save->state.value("finished", false)) {
      store_->clear();
    } else {
      restore(*save);
    }
  }
  // Rows timed on the run's clock (0 until the run starts), which a restart carries on.
  events_ =
      obs::EventLog(o_.out / "events.jsonl", /*append=*/resumed_, [this] { return run_seconds(); });
}

serve::MemberLimits worker_limits(const OuterServerOptions& o) {
  serve::MemberLimits limits;
  limits.max_members = o.max_workers;
  limits.idle_seconds = 120;
  limits.member_rate = o.worker_messages_per_second;
  limits.member_burst = o.worker_burst;
  limits.stranger_rate = 20;
  limits.stranger_burst = 100;
  return limits;
}

void Server::log(nlohmann::json row) {
  events_.write(std::move(row));
}

void Server::apply(const std::vector<torch::Tensor>& d) {
  outer_.apply(d);
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& p : live_->parameters()) p.copy_(outer_.theta()[i++]);
  std::string delta = published_.advance(live_);
  feed_.publish(published_.version(), std::move(delta), published_.state_hash());
}

void Server::snapshot_due(bool force) {
  if (!running()) return;
  const double t = run_seconds();
  while ((next_snapshot_ <= t && next_snapshot_ < o_.seconds) || force) {
    Snapshot s;
    s.point.seconds = force ? std::min(t, o_.seconds) : next_snapshot_;
    s.point.tokens = summary_.tokens;
    s.point.updates = outer_.updates();
    s.index = snapshots_.empty() ? 0 : snapshots_.back().index + 1;
    store_->save_snapshot(s.index, outer_.theta());
    snapshots_.push_back(s);
    dirty_ = true;
    if (force) break;
    next_snapshot_ += o_.eval_every;
  }
}

void Server::progress_line(bool force) {
  if (!o_.progress || (!force && now() - last_progress_ < 5)) return;
  last_progress_ = now();
  int64_t refused = 0;
  for (const auto& [verdict, n] : summary_.verdicts) refused += verdict == kAccepted ? 0 : n;
  fmt::print(
      stderr,
      "async {} {:>6.1f}/{:g} s  workers {}  updates {}  accepted {}  refused {}  {:.0f} tok/s\n",
      o_.method, run_seconds(), o_.seconds, serving(), outer_.updates(), accepted_, refused,
      run_seconds() > 0 ? static_cast<double>(summary_.tokens) / run_seconds() : 0.0);
}

OuterServerSummary Server::run() {
  if (o_.http) start_http();
  publish_status();
  log({{"event", "async_start"},
       {"method", o_.method},
       {"workers", o_.workers},
       {"inner_steps", H_},
       {"sequences_per_step", sequences_per_step_},
       {"listen", server_.bound_endpoint()},
       {"key", key_hex_},
       {"admission", net::describe(o_.admission)},
       {"stranger_rate", workers_.limits().stranger_rate},
       {"stranger_burst", workers_.limits().stranger_burst},
       {"http", http_ ? http_->url() : ""}});
  if (resumed_) {
    log({{"event", "async_resume"},
         {"version", published_.version()},
         {"updates", outer_.updates()},
         {"accepted", accepted_},
         {"run_seconds", run_seconds()},
         {"workers", workers_.size()}});
  }
  double finished_at = -1;
  const auto stopped = [&] { return o_.stop && o_.stop->load(); };
  while ((finished_at < 0 || now() - finished_at < o_.linger_seconds) && !stopped()) {
    serve::wait_readable(server_.socket(), std::chrono::milliseconds(20));
    serve::drain(server_, {}, [this](const net::Incoming& in) { handle(in); });
    if (!running()) {
      if (serving() >= o_.workers) {
        started_run_ = now();
        log({{"event", "async_running"}, {"workers", serving()}});
      }
    }
    snapshot_due(false);
    // sync: the round ends when every piece of its work is resolved.
    // A banned or forgotten worker leaves the round smaller; one past the deadline, too.
    enforce_round_deadline();
    if (o_.method == "sync" && round_handed_ > 0 &&
        (round_handed_ >= serving() || round_overdue_) && round_resolved_ >= round_handed_) {
      if (round_accepted_ > 0) {
        for (auto& t : round_sum_) t.div_(static_cast<double>(round_accepted_));
        apply(round_sum_);
      }
      round_sum_.clear();
      round_accepted_ = round_resolved_ = round_handed_ = 0;
      round_started_ = -1;
      round_overdue_ = false;
      dirty_ = true;
    }
    if (finished_at < 0 && running() && run_seconds() >= o_.seconds) {
      finished_at = now();
      log({{"event", "async_finishing"}});
    }
    workers_.evict_idle(now(), [this](Worker& w) {
      lapse(w);
      return true;
    });
    persist();  // then what this pass told workers goes out
    progress_line(false);
    if (now() - last_status_ >= 1) publish_status();
  }
  progress_line(true);
  publish_status();
  snapshot_due(true);
  persist();

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
      const std::vector<torch::Tensor> theta = store_->load_snapshot(s.index);
      for (auto& p : evaluator->parameters()) p.copy_(theta.at(i++));
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
  // A run that reached its length is finished (the folder starts a new run next time); one
  // stopped by a signal stays resumable.
  if (finished_at >= 0) store_->save(durable_state(/*finished=*/true), nullptr);
  return summary_;
}

}  // namespace outer_detail

void validate(const OuterServerOptions& o, const RunConfig& config) {
  if (std::find(outer_detail::methods().begin(), outer_detail::methods().end(), o.method) ==
      outer_detail::methods().end()) {
    fail(
        "async method '{}' is not known (allowed: sync, async, dylu, lookahead, "
        "lookahead_discounted)",
        o.method);
  }
  if (!o.outer_rule.empty()) {
    if (o.method == "sync") {
      fail(
          "--outer-rule {} was given with --method sync, whose round takes one Nesterov step "
          "on the mean (allowed: --outer-rule with an asynchronous method only)",
          o.outer_rule);
    }
    parse_outer_rule(o.outer_rule);  // names the rules allowed
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
  if (!(o.seconds > 0) || !(o.eval_every > 0) ||
      o.seconds / o.eval_every > outer_detail::kMaxSnapshots) {
    fail(
        "async seconds {} and eval-every {} are invalid (allowed: both > 0, at most {} "
        "validations)",
        o.seconds, o.eval_every, outer_detail::kMaxSnapshots);
  }
  if (o.max_staleness < 0)
    fail("async max staleness {} is invalid (allowed: >= 0)", o.max_staleness);
  if (o.max_strikes < 1) fail("async max strikes {} is invalid (allowed: >= 1)", o.max_strikes);
  if (!(o.min_deadline > 0) || !std::isfinite(o.min_deadline)) {
    fail("async min deadline {} s is invalid (allowed: > 0)", o.min_deadline);
  }
  if (!(o.deadline_factor >= 1) || !std::isfinite(o.deadline_factor)) {
    fail("async deadline factor {} is invalid (allowed: >= 1)", o.deadline_factor);
  }
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
  outer_detail::Server server(config, identity, options);
  return server.run();
}

}  // namespace agora
