#include "agora/peer/peer.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/data/sampler.h"
#include "agora/obs/log.h"
#include "agora/obs/progress.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/peer/model_state.h"
#include "agora/peer/peer_metrics.h"
#include "agora/peer/peer_network.h"
#include "agora/train/batches.h"
#include "agora/train/checkpoint.h"
#include "agora/data/data_meta.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"
#include "agora/config/run_config.h"
#include "agora/train/strategy_factory.h"
#include "agora/train/superposition.h"

namespace agora::peer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Everything one member needs between messages.
class Member {
 public:
  Member(const net::Identity& identity, const PeerOptions& options, const std::atomic<bool>& stop)
      : identity_(identity),
        options_(options),
        stop_(stop),
        who_(net::short_key(identity.public_key())),
        net_(identity, make_network_options(options, &registry_)) {
    metrics_.watch(net_);
  }

  PeerSummary run();

 private:
  static PeerNetworkOptions make_network_options(const PeerOptions& o, obs::Registry* registry) {
    PeerNetworkOptions n;
    n.metrics = registry;
    n.coordinator = o.coordinator;
    n.coordinator_key = o.coordinator_key;
    n.listen = o.listen;
    n.advertise = o.advertise;
    return n;
  }

  wire::Welcome join();
  void build(const wire::Welcome& welcome);
  void sync_state(const wire::StateRecord& state, const std::vector<wire::Member>& holders);
  // Handles a message that never waits (Finalized, Collect); false for the others.
  bool handle_passive(const wire::Envelope& m);
  void catch_up(uint64_t target);
  void apply_step(uint64_t step);
  // Reports the state every hash_interval steps, and whenever `force_report` (after a sync,
  // so that the member can serve what it loaded).
  void after_apply(bool force_report = false);
  void train_round(const wire::RoundStart& round);
  std::optional<double> validate(uint64_t step);
  void write_checkpoint();
  std::filesystem::path checkpoint_root() const;
  void load_local_checkpoint(const wire::StateRecord& state);
  // Lines carry the steps applied so far as their step.
  void log(const std::string& text) {
    if (options_.progress) obs::log_info({applied_, who_}, text);
  }
  void serve_metrics();

  const net::Identity& identity_;
  PeerOptions options_;
  const std::atomic<bool>& stop_;
  std::string who_;
  obs::Registry registry_;  // before net_, which records fetch latencies into it
  PeerMetrics metrics_{registry_};
  PeerNetwork net_;
  std::unique_ptr<obs::HttpServer> http_;  // --metrics

  RunConfig config_;
  std::string run_id_;
  std::string tokenizer_spec_;
  int64_t eot_id_ = 0;
  bool checkpointer_ = false;
  torch::Device device_{torch::kCPU};
  Llama model_{nullptr};
  std::unique_ptr<Strategy> strategy_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Sampler> bag_sampler_;  // TST phase 1 (steps < config_.tst_switch_step())
  std::unique_ptr<Sampler> val_sampler_;  // checkpointers only: validation for the run's page
  bool validation_failed_ = false;        // the data has no usable validation split
  uint64_t applied_ = 0;
  std::map<uint64_t, std::vector<wire::CommitRecord>> ledger_;
  std::vector<wire::Member> members_;
  std::deque<wire::Envelope> deferred_;
  uint64_t next_round_ = 0;                       // the RoundStart awaited (heartbeats say so)
  std::optional<wire::Envelope> last_commit_;     // re-sent if its round is announced again
  std::optional<Clock::time_point> first_round_;  // when the first RoundStart was acted on
  Clock::time_point last_commit_at_;
  PeerSummary summary_;
};

wire::Welcome Member::join() {
  wire::Envelope join;
  join.mutable_join()->set_key(identity_.public_key());
  join.mutable_join()->set_endpoint(net_.endpoint());
  join.mutable_join()->set_agent("agora 0.1.0");
  join.mutable_join()->set_applied_steps(applied_);
  auto last_sent = Clock::now() - std::chrono::hours(1);
  const auto started = Clock::now();
  while (!stop_.load()) {
    if (Clock::now() - started > std::chrono::duration<double>(options_.join_timeout_seconds)) {
      fail(
          "no answer from the coordinator at {} within {:.0f} s; check the address and its key, "
          "that its port is reachable through firewalls, and that this peer's public key ({}) "
          "is on the run's allowlist",
          options_.coordinator, options_.join_timeout_seconds,
          net::key_to_hex(identity_.public_key()));
    }
    if (Clock::now() - last_sent > std::chrono::seconds(5)) {
      net_.send_to_coordinator(join);
      last_sent = Clock::now();
    }
    auto m = net_.next_from_coordinator(0.2);
    if (!m) continue;
    if (m->has_welcome()) return m->welcome();
    // may_rejoin answers a message that overtook the Join; anything else is final.
    if (m->has_refused() && !m->refused().may_rejoin()) {
      fail("the coordinator refused this peer: {}", m->refused().reason());
    }
    if (m->has_finished()) fail("the run has finished ({} steps)", m->finished().steps());
  }
  fail("stopped before joining");
}

void Member::build(const wire::Welcome& welcome) {
  config_ = RunConfig::parse(welcome.run_config_toml(), "the coordinator's run config");
  check_decentralized(config_);
  if (!options_.data.empty()) config_.data.dir = options_.data.string();
  const DataMeta meta = read_data_meta(config_.data.dir);
  if (config_.model.vocab_size == 0) config_.set_vocab_size(meta.vocab_size);
  tokenizer_spec_ = meta.tokenizer_spec;
  eot_id_ = meta.eot_id;
  const int64_t threads = options_.threads > 0 ? options_.threads : config_.train.threads;
  torch::set_num_threads(threads > 0 ? static_cast<int>(threads)
                                     : static_cast<int>(std::thread::hardware_concurrency()));
  run_id_ = welcome.run_id();
  checkpointer_ = welcome.checkpointer();
  device_ = resolve_device(config_.train.device);
  torch::manual_seed(config_.seed);  // every member starts from the same initialisation
  model_ = Llama(config_.model);
  model_->to(device_);
  model_->train();
  strategy_ = make_strategy(config_, model_);
  params_ = model_->parameters();
  const PayloadLayout layout = dynamic_cast<DecoupledMomentum&>(*strategy_).payload_layout();
  net_.configure(run_id_, [layout](std::string_view bytes) -> std::string {
    try {
      decode_payload(bytes, layout);
      return {};
    } catch (const Error& e) {
      return e.what();
    }
  });
  sampler_ = std::make_unique<Sampler>(Sampler::from_directory(
      config_.data.dir, "train", static_cast<uint32_t>(config_.data.seq_len), config_.seed));
  if (config_.tst_switch_step() > 0) {
    bag_sampler_ = std::make_unique<Sampler>(Sampler::from_directory(
        config_.data.dir, "train", static_cast<uint32_t>(config_.data.seq_len), config_.seed,
        static_cast<uint32_t>(config_.tst.bag)));
  }
}

void Member::sync_state(const wire::StateRecord& state, const std::vector<wire::Member>& holders) {
  PeerMetrics::Timer timer(metrics_, PeerMetrics::Activity::kFetchingState);
  // Until a round names the members, the holders are whom a joiner can fetch payloads from.
  if (members_.empty()) members_ = holders;
  if (state.applied_steps() == 0) {
    // Step 0's state is the seed's initialisation, which every member computes for itself.
    torch::manual_seed(config_.seed);
    Llama fresh(config_.model);  // on the CPU, as model_ was made: the same initial bits
    torch::NoGradGuard no_grad;
    auto target = model_->named_parameters();
    for (const auto& item : fresh->named_parameters()) target[item.key()].copy_(item.value());
    applied_ = 0;
  } else if (std::none_of(holders.begin(), holders.end(), [&](const wire::Member& h) {
               return h.key() != identity_.public_key();
             })) {
    load_local_checkpoint(state);
  } else {
    const auto started = Clock::now();
    log(fmt::format("fetching the parameters after step {} from {} member(s)",
                    state.applied_steps(), holders.size()));
    const Snapshot snapshot = net_.fetch_state(state, holders, 600);
    load_snapshot(model_, snapshot);
    applied_ = state.applied_steps();
    log(fmt::format("parameters after step {} loaded in {:.2f} s", applied_,
                    std::chrono::duration<double>(Clock::now() - started).count()));
  }
  const wire::StateRecord mine = state_record(model_, applied_);
  if (!state.state_hash().empty() && mine.state_hash() != state.state_hash()) {
    fail("the parameters after step {} hash to {}, the majority's to {}", applied_,
         state_hash_hex(mine), state_hash_hex(state));
  }
  strategy_ = make_strategy(config_, model_);  // a cold momentum, as DESIGN.md prescribes
  params_ = model_->parameters();
  ledger_.clear();  // finalized sets are re-asked from here on (the run may have gone back)
  timer.stop();
  after_apply(/*force_report=*/true);
}

void Member::load_local_checkpoint(const wire::StateRecord& state) {
  // Nobody else holds these parameters: the run restarted from a checkpoint after every member
  // left, and this peer must bring it.
  const fs::path dir = checkpoint_root() / fmt::format("checkpoint_{:06}", state.applied_steps());
  if (!fs::exists(dir)) {
    fail(
        "no member holds the parameters after step {}, and {} does not exist; the run restarts "
        "from that checkpoint: copy it there from the machine that wrote it (the coordinator's "
        "log names it) and start this peer again",
        state.applied_steps(), dir.string());
  }
  const LoadedCheckpoint checkpoint = load_checkpoint(dir, device_);
  std::map<std::string, torch::Tensor> source;
  for (const auto& item : checkpoint.model->named_parameters()) source[item.key()] = item.value();
  copy_parameters(model_, source, dir.string());
  applied_ = state.applied_steps();
  log(fmt::format("parameters after step {} loaded from {}", applied_, dir.string()));
}

bool Member::handle_passive(const wire::Envelope& m) {
  if (m.has_finalized()) {
    const auto& f = m.finalized();
    ledger_[f.step()] = {f.set().begin(), f.set().end()};
    return true;
  }
  if (m.has_collect()) {
    const auto& c = m.collect();
    members_.assign(c.members().begin(), c.members().end());
    net_.collect(c.step(), {c.commits().begin(), c.commits().end()}, members_, true);
    return true;
  }
  return false;
}

void Member::catch_up(uint64_t target) {
  while (applied_ < target && !stop_.load()) {
    if (ledger_.count(applied_) == 0) {
      wire::Envelope ask;
      ask.mutable_get_finalized()->set_step(applied_);
      net_.send_to_coordinator(ask);
      const auto asked = Clock::now();
      while (ledger_.count(applied_) == 0 && !stop_.load()) {
        PeerMetrics::Timer waiting(metrics_, PeerMetrics::Activity::kWaiting);
        auto m = net_.next_from_coordinator(0.2);
        waiting.stop();
        if (m && !handle_passive(*m)) deferred_.push_back(std::move(*m));
        if (Clock::now() - asked > std::chrono::seconds(5)) break;  // ask again
      }
      continue;
    }
    apply_step(applied_);
  }
}

void Member::apply_step(uint64_t step) {
  PeerMetrics::Timer timer(metrics_, PeerMetrics::Activity::kApplying);
  const auto& set = ledger_.at(step);
  const auto missing = net_.ensure(step, set, members_, 120);
  if (!missing.empty()) {
    fail("step {}: {} finalized payload(s) could not be fetched from any member", step,
         missing.size());
  }
  std::vector<Contribution> contributions;
  for (const auto& record : set) {
    contributions.push_back(
        {net::key_to_hex(record.author()), *net_.blobs().get(record.payload_hash())});
  }
  const StepContext context{static_cast<int64_t>(step),
                            config_.learning_rate(static_cast<int64_t>(step)),
                            static_cast<int64_t>(std::max<size_t>(1, set.size()))};
  const auto apply_started = Clock::now();
  if (!contributions.empty()) strategy_->apply(context, contributions);
  if (first_round_) {
    summary_.compute_seconds += std::chrono::duration<double>(Clock::now() - apply_started).count();
  }
  ++applied_;
  ledger_.erase(ledger_.begin(), ledger_.lower_bound(applied_ > 64 ? applied_ - 64 : 0));
  timer.stop();  // a checkpoint written by after_apply() counts as checkpointing
  after_apply();
}

void Member::after_apply(bool force_report) {
  const auto& n = config_.network;
  if (force_report || applied_ % static_cast<uint64_t>(n.hash_interval) == 0) {
    wire::Envelope report;
    *report.mutable_state_report()->mutable_state() = state_record(model_, applied_);
    net_.publish_snapshot(applied_, snapshot_of(model_));
    net_.send_to_coordinator(report);
    summary_.state_hash = state_hash_hex(report.state_report().state());
    log(fmt::format("state after {} steps {}", applied_, summary_.state_hash));
  }
  const uint64_t keep = 4 * static_cast<uint64_t>(n.hash_interval) + 16;
  if (applied_ > keep) net_.blobs().prune_below(applied_ - keep);
  const int64_t every = config_.train.checkpoint_interval;
  if (checkpointer_ && every > 0 && applied_ > 0 && applied_ % static_cast<uint64_t>(every) == 0) {
    write_checkpoint();
  }
  net_.set_status(applied_, next_round_);
  metrics_.applied(applied_);
}

// Checkpointers measure the validation loss every train.eval_interval steps, on the parameters
// the step trains from, so the coordinator's page can draw a validation curve. Every peer holds
// the same parameters; one measurement per step is enough, and the other members keep training.
std::optional<double> Member::validate(uint64_t step) {
  const int64_t interval = config_.train.eval_interval;
  if (!checkpointer_ || validation_failed_ || interval <= 0 || step == 0 ||
      step % static_cast<uint64_t>(interval) != 0) {
    return std::nullopt;
  }
  try {
    if (!val_sampler_) {
      val_sampler_ = std::make_unique<Sampler>(Sampler::from_directory(
          config_.data.dir, "val", static_cast<uint32_t>(config_.data.seq_len), config_.seed));
    }
    const EvalResult r =
        evaluate(model_, *val_sampler_, config_.train.eval_windows, config_.train.micro_batch_size);
    log(fmt::format("step {:>5}  val_loss {:.4f}  ({} windows, parameters after {} steps)", step,
                    r.loss, r.windows, applied_));
    return r.loss;
  } catch (const Error& e) {
    // A data folder without a validation split must not stop training.
    log(fmt::format("validation skipped: {}", e.what()));
    validation_failed_ = true;
    return std::nullopt;
  }
}

void Member::train_round(const wire::RoundStart& round) {
  const uint64_t step = round.step();
  members_.assign(round.members().begin(), round.members().end());
  int64_t total = 0;
  for (const auto& r : round.assignment()) total += static_cast<int64_t>(r.count());
  if (total == 0) return;  // no share this round (the batch is smaller than the membership)
  const std::optional<double> val_loss = validate(step);
  const auto started = Clock::now();
  const StepContext context{static_cast<int64_t>(step),
                            config_.learning_rate(static_cast<int64_t>(step)),
                            static_cast<int64_t>(std::max<size_t>(1, members_.size()))};
  strategy_->before_forward(context);
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  const AutocastGuard autocast(device_, config_.train.dtype == "bfloat16");
  const int64_t b = config_.train.micro_batch_size, T = config_.data.seq_len;
  // Every member switches at the same step: the step, not the member, decides the phase.
  const bool bagged = static_cast<int64_t>(step) < config_.tst_switch_step();
  if (static_cast<int64_t>(step) == config_.tst_switch_step() && step > 0) {
    log(fmt::format("step {:>5}  token superposition ends: next-token training from here on",
                    step));
  }
  double loss_sum = 0;
  for (const auto& range : round.assignment()) {
    for (uint64_t done = 0; done < range.count(); done += static_cast<uint64_t>(b)) {
      if (stop_.load()) return;
      const int64_t count = static_cast<int64_t>(std::min<uint64_t>(b, range.count() - done));
      const torch::Tensor tokens =
          read_sequences(bagged ? *bag_sampler_ : *sampler_, range.first() + done, count)
              .to(device_);
      const torch::Tensor mean_loss =
          bagged ? superposition_loss(model_, tokens, config_.tst.bag)
                 : next_token_loss(model_->forward(tokens.narrow(1, 0, T)), tokens.narrow(1, 1, T));
      const torch::Tensor loss =
          mean_loss * (static_cast<double>(count) / static_cast<double>(total));
      loss.backward();
      loss_sum += loss.item<double>();
    }
  }
  // Throughput is measured over forward and backward alone: the strategy's step costs the same
  // whatever the share, and counting it would make a small share look slow and shrink further.
  double compute = std::chrono::duration<double>(Clock::now() - started).count();
  if (options_.slowdown > 1.0) {
    std::this_thread::sleep_for(std::chrono::duration<double>((options_.slowdown - 1.0) * compute));
    compute *= options_.slowdown;
  }
  if (config_.optimizer.grad_clip > 0) {
    torch::nn::utils::clip_grad_norm_(params_, config_.optimizer.grad_clip);
  }
  Contribution own = strategy_->contribute(context);
  if (options_.misbehave == "garbage-payload") own.bytes.resize(own.bytes.size() / 2);
  const std::string hash = blake2b256_bytes(own.bytes);
  net_.blobs().put(hash, own.bytes, step);
  wire::Envelope commit;
  auto* c = commit.mutable_commit();
  c->mutable_record()->set_author(identity_.public_key());
  c->mutable_record()->set_step(step);
  c->mutable_record()->set_payload_hash(hash);
  c->mutable_record()->set_signature(
      identity_.sign(net::commit_signing_bytes(run_id_, step, hash)));
  c->set_sequences(static_cast<uint64_t>(total));
  c->set_compute_seconds(compute);
  c->set_loss(loss_sum);
  c->set_payload_bytes(own.bytes.size());
  if (val_loss) c->set_val_loss(*val_loss);
  net_.send_to_coordinator(commit);
  last_commit_ = commit;
  last_commit_at_ = Clock::now();
  // The sleep of --slowdown counts as compute: it stands for slower hardware.
  summary_.compute_seconds += std::chrono::duration<double>(last_commit_at_ - started).count();
  summary_.wall_seconds = std::chrono::duration<double>(last_commit_at_ - *first_round_).count();
  ++summary_.rounds_trained;
  metrics_.round_trained(loss_sum, context.lr, static_cast<uint64_t>(total),
                         static_cast<uint64_t>(config_.train.batch_size), T, compute);
  log(fmt::format("step {:>5}  loss {:.4f}  {} seqs  {:.2f} s  payload {} B", step, loss_sum, total,
                  compute, own.bytes.size()));
}

fs::path Member::checkpoint_root() const {
  return options_.checkpoint_dir.empty() ? fs::path("runs") / ("peer-" + who_)
                                         : options_.checkpoint_dir;
}

void Member::write_checkpoint() {
  const auto started = Clock::now();
  const fs::path root = checkpoint_root();
  fs::create_directories(root);
  const fs::path dir = root / fmt::format("checkpoint_{:06}", applied_);
  CheckpointMeta meta;
  meta.step = static_cast<int64_t>(applied_);
  meta.tokens_seen = config_.data_tokens_through(static_cast<int64_t>(applied_));
  meta.eot_id = eot_id_;
  if (!fs::exists(dir)) {
    save_checkpoint(dir, model_, meta, tokenizer_spec_, config_.to_toml(), std::nullopt);
  }
  const fs::path link = root / "latest", tmp = root / "latest.tmp";
  fs::remove(tmp);
  fs::create_directory_symlink(dir.filename(), tmp);
  fs::rename(tmp, link);
  summary_.checkpoint = dir;
  wire::Envelope report;
  auto* r = report.mutable_checkpoint_report();
  r->set_applied_steps(applied_);
  r->set_state_hash(state_record(model_, applied_).state_hash());
  r->set_path(fs::absolute(dir).string());
  net_.send_to_coordinator(report);
  metrics_.checkpoint_written(std::chrono::duration<double>(Clock::now() - started).count());
  log(fmt::format("checkpoint {}", dir.string()));
}

void Member::serve_metrics() {
  if (!options_.metrics) return;
  http_ = std::make_unique<obs::HttpServer>(*options_.metrics);
  http_->get("/metrics", [this](const obs::HttpRequest&) {
    return obs::HttpResponse{200, std::string(obs::kPrometheusContentType), registry_.render()};
  });
  http_->start();
  // Said even with --quiet: an open port is something the operator must know about.
  obs::log_info({applied_, who_},
                fmt::format("serving Prometheus metrics on {}/metrics", http_->url()));
}

PeerSummary Member::run() {
  serve_metrics();
  log(fmt::format("serving on {}; joining {}", net_.endpoint(), options_.coordinator));
  wire::Welcome welcome = join();
  build(welcome);
  log(fmt::format("joined run {} ({} finalized steps{})", run_id_, welcome.finalized_steps(),
                  checkpointer_ ? ", checkpointer" : ""));
  sync_state(welcome.state(), {welcome.holders().begin(), welcome.holders().end()});
  catch_up(welcome.finalized_steps());
  bool finished = false;
  while (!stop_.load() && !finished) {
    std::optional<wire::Envelope> m;
    if (!deferred_.empty()) {
      m = std::move(deferred_.front());
      deferred_.pop_front();
    } else {
      PeerMetrics::Timer waiting(metrics_, PeerMetrics::Activity::kWaiting);
      m = net_.next_from_coordinator(0.2);
    }
    if (!m) {
      // Idle: a syncing member catches up on what is final.
      if (!ledger_.empty() && ledger_.rbegin()->first >= applied_)
        catch_up(ledger_.rbegin()->first + 1);
      continue;
    }
    if (handle_passive(*m)) continue;
    if (m->has_round_start()) {
      const auto& round = m->round_start();
      if (round.step() < next_round_) {
        // Announced again (the coordinator restarted, or a heartbeat crossed our commit): the
        // work is done; make sure the coordinator has the commitment.
        if (last_commit_ && last_commit_->commit().record().step() == round.step()) {
          net_.send_to_coordinator(*last_commit_);
        }
        continue;
      }
      if (!first_round_) first_round_ = Clock::now();
      catch_up(round.apply_through());
      next_round_ = round.step() + 1;
      net_.set_status(applied_, next_round_);
      train_round(round);
    } else if (m->has_resync()) {
      log("my parameters disagree with the majority; resynchronising");
      metrics_.resynced();
      sync_state(m->resync().state(), {m->resync().holders().begin(), m->resync().holders().end()});
    } else if (m->has_finished()) {
      catch_up(m->finished().steps());
      finished = true;
    } else if (m->has_refused()) {
      if (!m->refused().may_rejoin()) {
        fail("the coordinator refused this peer: {}", m->refused().reason());
      }
      // The coordinator does not know us (it lost its database, or dropped us for silence):
      // join again and take the majority's parameters.
      log("the coordinator does not know this peer; joining again");
      const wire::Welcome welcome = join();
      if (welcome.run_id() != run_id_) {
        fail(
            "the coordinator now runs another run ({}, this peer trained {}); restart the peer "
            "to join the new run",
            welcome.run_id(), run_id_);
      }
      checkpointer_ = welcome.checkpointer();
      // Parameters at or past the majority's record are kept (the hash reports will catch a
      // disagreement); a peer that fell behind fetches, and so does one whose steps the run
      // undid (it went back to a checkpoint).
      if (welcome.state().applied_steps() > applied_ || welcome.finalized_steps() < applied_) {
        next_round_ = std::min<uint64_t>(next_round_, welcome.finalized_steps());
        sync_state(welcome.state(), {welcome.holders().begin(), welcome.holders().end()});
      }
      catch_up(welcome.finalized_steps());
    }
  }
  if (finished) {
    log(fmt::format("run finished after {} steps; state {}", applied_, summary_.state_hash));
    if (checkpointer_) write_checkpoint();
  } else {
    wire::Envelope leave;
    leave.mutable_leave();
    net_.send_to_coordinator(leave);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the Leave go out
    log("left the run");
  }
  const NetworkCounters c = net_.counters();
  log(
      fmt::format("payloads fetched {}, rejected {}; {} received, {} served; {} malformed "
                  "messages dropped",
                  c.payloads_fetched, c.payloads_rejected, format_bytes(c.bytes_received),
                  format_bytes(c.bytes_sent), c.dropped_messages));
  summary_.applied_steps = applied_;
  summary_.state_hash = state_hash_hex(state_record(model_, applied_));
  return summary_;
}

}  // namespace

PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options,
                     const std::atomic<bool>& stop) {
  Member member(identity, options, stop);
  return member.run();
}

}  // namespace agora::peer
