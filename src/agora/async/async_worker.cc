#include "agora/async/async_worker.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "agora/async/rules.h"
#include "agora/core/error.h"
#include "agora/net/curve_socket.h"
#include "agora/obs/event_log.h"
#include "agora/optim/payload_tensors.h"
#include "agora/serve/data_mount.h"
#include "agora/serve/member_client.h"
#include "agora/serve/param_feed.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/published_policy.h"
#include "agora/train/step.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

class Worker {
 public:
  Worker(const RunConfig& config, const net::Identity& identity, const AsyncWorkerOptions& o);
  AsyncWorkerSummary run();

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  void log(nlohmann::json row);
  std::optional<wire::Envelope> wait_for(const serve::MemberClient::Match& want, double timeout) {
    return member_.wait_for(want, timeout);
  }
  void count_receipt(const wire::AsyncReceipt& r);
  void join();
  wire::Envelope hello() const;
  uint64_t version() const { return follower_.version(); }
  void train_and_deliver(const wire::AsyncWork& work);

  RunConfig config_;
  const net::Identity& identity_;
  AsyncWorkerOptions o_;
  net::Context context_;
  net::Client client_;
  serve::MemberClient member_;       // hello, waits, saying hello again (serve/member_client.h)
  Learner learner_;                  // the model trained and its inner AdamW
  Llama mirror_;                     // the server's published parameters, version version()
  serve::ParamFollower follower_;    // keeps mirror_ at the server's version
  std::unique_ptr<serve::DataMount> data_;  // the run's data from the server, with data_cache
  std::unique_ptr<TrainStep> step_;  // made once the server says how many sequences a step
  wire::AsyncRun run_;
  int64_t local_steps_ = 0;  // the inner lr schedule's position
  obs::EventLog log_;        // --log, or closed
  AsyncWorkerSummary summary_;
  const Clock::time_point started_ = Clock::now();
  double last_progress_ = 0;
};

RunConfig inner_config(RunConfig config) {
  config.optimizer.name = "adamw";
  return config;
}

Worker::Worker(const RunConfig& config, const net::Identity& identity, const AsyncWorkerOptions& o)
    : config_(inner_config(config)),
      identity_(identity),
      o_(o),
      client_(context_, identity, o.server, o.server_key, net::DecodeLimits{},
              /*receive_queue=*/4096),
      member_(
          client_, hello(),
          [this](const wire::Envelope& m) {
            if (m.has_async_receipt()) count_receipt(m.async_receipt());
          },
          [this](const std::string& reason) {
            log({{"event", "async_worker_rejoin"}, {"reason", reason}});
          }),
      learner_(Learner::create(config_, torch::kCPU)),
      mirror_(Learner::create(config_, torch::kCPU).model),
      follower_(
          member_, /*version=*/0,
          [this](const wire::Params& p) {
            PublishedPolicy::apply(mirror_, p.payload(), p.whole(), p.to_version());
            return hash_parameters(mirror_).state_hash;
          },
          [this](const wire::Params&, int64_t, bool, const std::string& error) {
            if (!error.empty())
              log({{"event", "async_worker_params_error"}, {"error", error.substr(0, 300)}});
          }) {
  mirror_->eval();
  if (!o_.log.empty()) log_ = obs::EventLog(o_.log, /*append=*/false, [this] { return now(); });
}

void Worker::log(nlohmann::json row) {
  log_.write(std::move(row));
}

void Worker::count_receipt(const wire::AsyncReceipt& r) {
  const std::string verdict = r.verdict().substr(0, 32);
  ++summary_.receipts[verdict];
  log({{"event", "async_worker_receipt"},
       {"work_id", r.work_id()},
       {"verdict", verdict},
       {"reason", r.reason().substr(0, 300)},
       {"version", r.version()}});
}

wire::Envelope Worker::hello() const {
  wire::Envelope hello;
  hello.mutable_async_hello()->set_key(identity_.public_key());
  hello.mutable_async_hello()->set_agent(fmt::format("agora async work ({})", o_.behaviour));
  return hello;
}

void Worker::join() {
  std::optional<wire::Envelope> m = member_.join(
      [](const wire::Envelope& e) { return e.has_async_run(); }, o_.idle_timeout_seconds);
  if (!m) {
    fail(
        "the server at {} did not answer for {:g} s (is it running, and is --server-key its "
        "public key?)",
        o_.server, o_.idle_timeout_seconds);
  }
  run_ = m->async_run();
  if (!run_.refused().empty()) fail("the server refused this worker: {}", run_.refused());
  const std::string hash = hash_parameters(mirror_).state_hash;
  if (hash != run_.base_hash()) {
    fail(
        "this config's initial parameters have state hash {}, but the server's run starts from "
        "{}: give --config the run config the server was started with (same model and seed)",
        net::key_to_hex(hash),
        run_.base_hash().size() == net::kKeyBytes ? net::key_to_hex(run_.base_hash()) : "?");
  }
  const auto per = static_cast<int64_t>(run_.sequences_per_step());
  if (per < 1 || per > config_.train.batch_size) {
    fail("the server asks for {} sequences a step (allowed: 1 to train.batch_size = {})", per,
         config_.train.batch_size);
  }
  config_.train.micro_batch_size = std::min(config_.train.micro_batch_size, per);
  if (per % config_.train.micro_batch_size != 0) {
    fail("the server asks for {} sequences a step, not a multiple of train.micro_batch_size = {}",
         per, config_.train.micro_batch_size);
  }
  if (!o_.data_cache.empty()) {
    // A member now: the server answers this key's fetches.
    serve::DataMountOptions d;
    d.endpoint = o_.server;
    d.server_key = o_.server_key;
    d.data_hash = config_.data.hash;
    d.cache_dir = o_.data_cache;
    data_ = serve::DataMount::open(identity_, d);
    config_.data.dir = o_.data_cache.string();
    log({{"event", "async_worker_data"},
         {"cache", o_.data_cache.string()},
         {"bytes", data_->stats().bytes},
         {"chunks_cached", data_->stats().chunks_cached}});
  }
  step_ = std::make_unique<TrainStep>(config_, torch::kCPU);
  log({{"event", "async_worker_joined"},
       {"key", net::key_to_hex(identity_.public_key())},
       {"method", run_.method().substr(0, 32)},
       {"version", run_.version()}});
}

void Worker::train_and_deliver(const wire::AsyncWork& work) {
  torch::NoGradGuard outer_guard;
  std::vector<torch::Tensor> pulled;
  {
    const auto source = mirror_->parameters();
    for (size_t i = 0; i < learner_.params.size(); ++i) {
      learner_.params[i].copy_(source[i]);
      pulled.push_back(source[i].detach().clone());
    }
  }
  const auto per = static_cast<uint64_t>(run_.sequences_per_step());
  // `tiny` trains nothing and delivers at once: as often as the server hands it work.
  const uint32_t steps = o_.behaviour == "tiny" ? 0 : work.steps();
  for (uint32_t s = 0; s < steps; ++s) {
    const double began = now();
    {
      at::AutoGradMode grad(true);
      StepContext context;
      context.step = local_steps_;
      context.lr = config_.learning_rate(local_steps_);
      context.num_peers = 1;
      const SequenceRange range{work.first_sequence() + s * per, per};
      step_->run(learner_, context, std::span<const SequenceRange>(&range, 1));
      learner_.strategy->apply(context, {});
    }
    ++local_steps_;
    ++summary_.steps;
    const double spent = now() - began;
    summary_.compute_seconds += spent;
    if (o_.step_seconds > spent) {
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.step_seconds - spent));
    }
  }
  Payload payload;
  payload.kind = PayloadKind::kPseudoGradient;
  payload.step = work.work_id();
  const double scale = o_.behaviour == "scaled"      ? 1000.0
                       : o_.behaviour == "sign_flip" ? -1.0
                       : o_.behaviour == "zero"      ? 0.0
                                                     : 1.0;
  for (size_t i = 0; i < pulled.size(); ++i) {
    torch::Tensor d = o_.behaviour == "tiny" ? torch::full_like(pulled[i], 1e-6)
                                             : (pulled[i] - learner_.params[i].detach()) * scale;
    if (o_.behaviour == "noise") {  // as large as the honest D, pointing nowhere
      d = torch::randn_like(d) * (d.norm() / std::sqrt(static_cast<double>(d.numel())));
    }
    payload.tensors.push_back(run_.int8() ? int8_rows_payload(d)
                                          : dense_payload(d, ValueType::kF32));
  }
  const std::string bytes = encode_payload(payload);
  wire::Envelope e;
  auto* delivery = e.mutable_async_delivery();
  delivery->set_work_id(work.work_id());
  delivery->set_payload(bytes);
  delivery->set_signature(
      identity_.sign(delivery_signing_bytes(run_.run_id(), work.work_id(), bytes)));
  client_.send(e);
  if (o_.behaviour == "replay") client_.send(e);
  summary_.delivered_bytes += static_cast<int64_t>(bytes.size());
  ++summary_.rounds;
  log({{"event", "async_worker_delivered"},
       {"work_id", work.work_id()},
       {"version", work.version()},
       {"steps", work.steps()},
       {"bytes", bytes.size()}});
}

AsyncWorkerSummary Worker::run() {
  join();
  uint64_t target = run_.version();
  double last_answer = now();
  while (now() - last_answer < o_.idle_timeout_seconds) {
    // `claim` never fetches: it says it holds the newest, to deliver from what it has.
    const bool claim = o_.behaviour == "claim";
    if (!claim && version() < target && !follower_.sync(target)) continue;
    wire::Envelope ask;
    ask.mutable_async_get_work()->set_have_version(claim ? target : version());
    client_.send(ask);
    std::optional<wire::Envelope> m =
        wait_for([](const wire::Envelope& e) { return e.has_async_work(); }, 5.0);
    if (!m) continue;
    last_answer = now();
    const wire::AsyncWork& work = m->async_work();
    if (!work.refused().empty()) {
      summary_.refused = work.refused().substr(0, 300);
      break;
    }
    if (work.finished()) {
      summary_.finished = true;
      break;
    }
    if (work.version() > version()) {
      target = work.version();
      continue;
    }
    if (work.steps() == 0 && work.retry_ms() == 0 && work.version() <= version()) {
      // "Fetch the newest first", though we hold it or newer: the server restarted, so it did
      // not send us these parameters, or went back to an older version. A whole copy.
      follower_.forget();
      target = work.version();
      continue;
    }
    if (work.steps() == 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<uint32_t>(work.retry_ms(), 2000)));
      continue;
    }
    if (work.steps() > 100000)
      fail("the server asks for {} inner steps (at most 100000)", work.steps());
    train_and_deliver(work);
    if (o_.progress && now() - last_progress_ > 5) {
      last_progress_ = now();
      fmt::print(stderr,
                 "async worker: {} rounds, {} steps, version {}, {:.0f}% of the time computing\n",
                 summary_.rounds, summary_.steps, version(),
                 100 * summary_.compute_seconds / std::max(1e-9, now()));
    }
  }
  // Receipts still on their way.
  wait_for([](const wire::Envelope&) { return false; }, 0.3);
  summary_.version = version();
  summary_.param_bytes = follower_.bytes();
  summary_.hash_mismatches = follower_.hash_mismatches();
  summary_.seconds = now();
  if (data_) summary_.data_bytes_fetched = data_->stats().bytes_fetched;
  log({{"event", "async_worker_done"},
       {"rounds", summary_.rounds},
       {"steps", summary_.steps},
       {"receipts", summary_.receipts},
       {"finished", summary_.finished},
       {"refused", summary_.refused},
       {"compute_seconds", summary_.compute_seconds},
       {"param_bytes", summary_.param_bytes},
       {"hash_mismatches", summary_.hash_mismatches},
       {"delivered_bytes", summary_.delivered_bytes},
       {"data_bytes_fetched", summary_.data_bytes_fetched}});
  return summary_;
}

}  // namespace

void check_async_worker_options(const AsyncWorkerOptions& options) {
  static const std::set<std::string> kBehaviours = {"honest", "scaled", "replay", "tiny",
                                                     "claim", "sign_flip", "zero", "noise"};
  if (kBehaviours.count(options.behaviour) == 0) {
    fail("--behave {} is not known (allowed: honest, scaled, replay, tiny, claim, sign_flip, "
         "zero, noise)",
         options.behaviour);
  }
  if (!(options.step_seconds >= 0)) {
    fail("--step-seconds {} is invalid (allowed: >= 0)", options.step_seconds);
  }
}

AsyncWorkerSummary run_async_worker(const RunConfig& config, const net::Identity& identity,
                                    const AsyncWorkerOptions& options) {
  check_async_worker_options(options);
  torch::set_num_threads(config.train.threads > 0 ? static_cast<int>(config.train.threads) : 1);
  Worker worker(config, identity, options);
  return worker.run();
}

}  // namespace agora
