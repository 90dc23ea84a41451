#include "agora/swarm/swarm_peer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/core/token_bucket.h"
#include "agora/data/sampler.h"
#include "agora/net/curve_socket.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/pipeline/boundary.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_checkpoint.h"
#include "agora/pipeline/stage_files.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/subspace.h"
#include "agora/swarm/router.h"
#include "agora/swarm/schedule.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"
#include "agora/train/parameter_hash.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Forwards waiting to be computed, per replica: a sender races ahead of this bound at a loss.
constexpr size_t kMaxWaiting = 256;

uint64_t router_id(const std::string& key) {
  uint64_t id = 0;
  for (size_t i = 0; i < 8 && i < key.size(); ++i) id = (id << 8) | static_cast<uint8_t>(key[i]);
  return id;
}

std::string endpoint_to_dial(const SwarmPeerOptions& o, const std::string& bound) {
  if (!o.advertise.empty()) return o.advertise;
  std::string e = bound;
  const auto at = e.find("0.0.0.0");
  if (at != std::string::npos) e.replace(at, 7, "127.0.0.1");
  return e;
}

class SwarmPeer {
 public:
  SwarmPeer(const RunConfig& config, const net::Identity& identity, const SwarmPeerOptions& o)
      : config_(config),
        o_(o),
        identity_(identity),
        S_(config.pipeline.stages),
        M_(config.train.batch_size / config.train.micro_batch_size),
        m_(config.train.micro_batch_size),
        costs_(!o.costs.empty() ? o.costs
                                : swarm_stage_costs(config.model, config.pipeline.stages)),
        data_(Sampler::from_directory(config.data.dir, "train",
                                      static_cast<uint32_t>(config.data.seq_len), config.seed)),
        fingerprint_(stage_run_fingerprint(config)),
        server_(context_, identity, o.listen, limits(), /*reply_queue=*/4096),
        coordinator_(context_, identity, o.coordinator, o.coordinator_key, limits()) {
    if (config.pipeline.codec == "subspace") {
      subspace_ = std::make_unique<SubspaceBasis>(config.model, config.pipeline.subspace_rank,
                                                  config.seed, torch::kCPU);
    }
    coder_.emplace(config.pipeline, config.model.hidden_size, subspace_.get());
    if (!o.events.empty()) {
      if (o.events.has_parent_path()) fs::create_directories(o.events.parent_path());
      events_.open(o.events, std::ios::app);
    }
  }

  SwarmPeerSummary run() {
    hello();
    while (o_.stop == nullptr || !o_.stop->load()) {
      const bool worked = pump() | compute() | poll_if_due();
      if (finished_) break;
      if (seconds_since(last_view_) > o_.timeout_seconds) {
        fail("the coordinator at {} has been silent for {:.0f} s", o_.coordinator,
             seconds_since(last_view_));
      }
      if (!worked) wait_for_messages();
    }
    SwarmPeerSummary s = summary_;
    s.stage = stage_;
    s.version = version_;
    s.parameter_hash = model_ ? hex_encode(hash_) : "";
    s.seconds = seconds_since(born_);
    s.finished = finished_;
    if (finished_ && ready_ && !o_.out_dir.empty()) {
      save_stage_file(o_.out_dir, model_, subspace_.get(), static_cast<int64_t>(version_));
    }
    event({{"event", "finish"},
           {"stage", stage_},
           {"version", version_},
           {"ready", ready_},
           {"finished", finished_},
           {"parameter_hash", s.parameter_hash},
           {"forwards", s.forwards},
           {"backwards", s.backwards},
           {"fetches", s.fetches},
           {"moves", s.moves},
           {"seconds", s.seconds}});
    return s;
  }

  void failed(const std::string& what) {
    event({{"event", "error"}, {"stage", stage_}, {"version", version_}, {"message", what}});
  }

 private:
  // ---- set-up, the stage, the coordinator --------------------------------------------------

  static net::DecodeLimits limits() {
    net::DecodeLimits l;
    l.max_control = 64 << 10;
    l.max_data = size_t{256} << 20;
    return l;
  }

  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  double now() const { return seconds_since(born_); }

  void hello() {
    wire::Envelope e;
    auto* h = e.mutable_swarm_hello();
    h->set_key(identity_.public_key());
    h->set_agent("agora");
    h->set_endpoint(endpoint_to_dial(o_, server_.bound_endpoint()));
    h->set_stage(static_cast<int32_t>(o_.stage));
    h->set_fingerprint(fingerprint_);
    coordinator_.send(e);
    last_view_ = last_poll_ = Clock::now();
    event({{"event", "start"},
           {"endpoint", h->endpoint()},
           {"key", net::key_to_hex(identity_.public_key())},
           {"asked_stage", o_.stage}});
  }

  // A fresh stage at the seeded start: version 0 is every replica's, so it is ready at step 0.
  void take_stage(int64_t stage) {
    const bool move = stage_ >= 0;
    stage_ = stage;
    span_ = partition_model(config_.model, S_).at(static_cast<size_t>(stage));
    model_ = StageModel(config_.model, span_, config_.seed, subspace_.get());
    model_->train();
    new_momentum();
    version_ = 0;
    ready_ = true;
    hash_ = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
    forget_work();
    router_ = SwarmRouter(router_options());
    by_id_.clear();
    next_.clear();
    clients_.clear();
    seconds_per_sample_ = 0;
    measured_ = 0;
    if (move) ++summary_.moves;
    event({{"event", move ? "moved" : "stage"}, {"stage", stage}});
    if (o_.progress) {
      fmt::print(stderr, "swarm peer: {} stage {} of {} (layers {}-{})\n",
                 move ? "moved to" : "serving", stage, S_, span_.first_layer, span_.end_layer - 1);
    }
  }

  SwarmRouterOptions router_options() const {
    SwarmRouterOptions r;
    r.uniform = o_.uniform_routing;
    r.seed = router_id(identity_.public_key());
    r.skip_seconds = std::max(1.0, o_.timeout_seconds / 3);
    return r;
  }

  void new_momentum() {
    DemoOptions d;
    d.beta = config_.demo.beta;
    d.topk = config_.demo.topk;
    d.chunk = config_.demo.chunk;
    d.weight_decay = config_.optimizer.weight_decay;
    d.one_bit = config_.demo.one_bit;
    d.max_norm_ratio = config_.demo.max_norm_ratio;
    demo_ = std::make_unique<DecoupledMomentum>(model_->hf_parameters(), d);
  }

  void forget_work() {
    waiting_.clear();
    unsent_.clear();
    held_.clear();
    origin_.clear();
    assigned_.clear();
    done_.clear();
    payload_.reset();
    for (torch::Tensor& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
  }

  bool poll_if_due() {
    const bool urgent = !done_.empty() || (payload_ && !round_seen_) || report_now_;
    report_now_ = false;
    if (seconds_since(last_poll_) < (urgent ? 0.005 : o_.poll_seconds)) return false;
    if (polls_in_flight_ > 2 && seconds_since(last_poll_) < 1.0) return false;
    last_poll_ = Clock::now();
    wire::Envelope e;
    auto* p = e.mutable_swarm_poll();
    p->set_stage(static_cast<uint32_t>(std::max<int64_t>(stage_, 0)));
    p->set_version(version_);
    p->set_ready(ready_);
    if (ready_) p->set_state_hash(hash_);
    p->set_seconds_per_sample(seconds_per_sample_);
    if (stage_ == 0 && ready_ && phase_ == "training") {
      const int64_t have = static_cast<int64_t>(assigned_.size() + origin_.size());
      // One more than it keeps in flight, so the next starts at once; no more, so a slow
      // replica does not sit on micro-batches the fast ones could take at the step's end.
      p->set_wants(static_cast<uint32_t>(std::max<int64_t>(0, o_.in_flight + 1 - have)));
    }
    for (const auto& [j, loss] : done_) {
      auto* d = p->add_done();
      d->set_micro_batch(j);
      d->set_loss(loss);
    }
    done_.clear();
    p->set_retried(static_cast<uint32_t>(retried_));
    retried_ = 0;
    if (payload_ && !round_seen_) p->set_payload(*payload_);
    coordinator_.send(e);
    ++polls_in_flight_;
    return true;
  }

  void on_view(const wire::SwarmView& v) {
    last_view_ = Clock::now();
    polls_in_flight_ = std::max(0, polls_in_flight_ - 1);
    if (!v.refused().empty()) fail("the coordinator refused this peer: {}", v.refused());
    if (stage_ != static_cast<int64_t>(v.stage())) {
      if (v.stage() >= static_cast<uint32_t>(S_)) fail("the coordinator named stage {}", v.stage());
      take_stage(v.stage());
    }
    step_ = v.step();
    phase_ = v.phase();
    stage_hash_ = v.stage_hash();
    // The round that brings this replica to the step.
    if (v.round_size() > 0 && v.round_step() == version_ && version_ + 1 == v.step() && ready_) {
      apply_round(v);
    }
    if (phase_ == "finished" && (!ready_ || version_ >= step_)) {
      finished_ = true;
      return;
    }
    // One step behind with the stage's hash there: the round that brings it to the step comes
    // in the answer to its next poll.
    const bool round_coming = ready_ && version_ + 1 == step_ &&
                              (v.previous_hash().empty() || v.previous_hash() == hash_);
    if (version_ != step_ && !round_coming) ready_ = false;
    if (ready_ && version_ == step_ && !stage_hash_.empty() && hash_ != stage_hash_) {
      event({{"event", "outvoted"}, {"version", version_}, {"hash", hex_encode(hash_)}});
      ready_ = false;
    }
    if (!ready_) {
      fetch_or_restore(v);
      return;
    }
    members(v);
    for (uint32_t j : v.micro_batches()) {
      if (j < static_cast<uint32_t>(M_)) assigned_.push_back(j);
    }
    if (phase_ == "syncing" && version_ == step_ && !payload_) contribute();
  }

  // The next stage's ready replicas (routing), the previous stage's members (admission), and
  // what a lost member means for the micro-batches in flight.
  void members(const wire::SwarmView& v) {
    std::set<std::string> next;
    for (const wire::SwarmMember& m : v.next()) {
      if (m.stage() != static_cast<uint32_t>(stage_ + 1)) continue;
      next.insert(m.key());
      if (next_.count(m.key()) == 0 || next_[m.key()] != m.endpoint()) {
        try {
          clients_[m.key()] = std::make_unique<net::Client>(context_, identity_, m.endpoint(),
                                                            m.key(), limits(), 1024);
        } catch (const Error&) {
          continue;  // a key that is not a point: that member cannot be dialled
        }
        next_[m.key()] = m.endpoint();
        router_.add(router_id(m.key()));
        by_id_[router_id(m.key())] = m.key();
      }
    }
    for (auto it = next_.begin(); it != next_.end();) {
      if (next.count(it->first) != 0) {
        ++it;
        continue;
      }
      router_.remove(router_id(it->first));
      clients_.erase(it->first);
      it = next_.erase(it);
    }
    prev_curves_.clear();
    for (const wire::SwarmMember& m : v.prev()) {
      try {
        prev_curves_.insert(net::curve_public_of(m.key()));
      } catch (const Error&) {
      }
    }
    if (v.epoch() != epoch_) {
      epoch_ = v.epoch();
      for (auto& [j, f] : origin_) f.stale = true;  // sent before a loss: may be gone
    }
  }

  // ---- the step's end ----------------------------------------------------------------------

  void contribute() {
    torch::NoGradGuard no_grad;
    auto params = model_->parameters();
    for (torch::Tensor& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
    if (config_.optimizer.grad_clip > 0) {
      torch::nn::utils::clip_grad_norm_(params, config_.optimizer.grad_clip);
    }
    StepContext context{static_cast<int64_t>(version_), config_.learning_rate(version_), 1};
    payload_ = demo_->contribute(context).bytes;
    round_seen_ = false;
    waiting_.clear();
    unsent_.clear();
    held_.clear();
    origin_.clear();
    assigned_.clear();
  }

  void apply_round(const wire::SwarmView& v) {
    round_seen_ = true;
    std::vector<Contribution> round;
    for (const wire::SwarmContribution& c : v.round()) round.push_back({hex_encode(c.key()), c.payload()});
    StepContext context{static_cast<int64_t>(version_), config_.learning_rate(version_),
                        static_cast<int64_t>(round.size())};
    const ApplyReport report = demo_->apply(context, round);
    model_->constrain_to_subspace();
    for (torch::Tensor& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
    ++version_;
    hash_ = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
    payload_.reset();
    report_now_ = true;  // the coordinator hands out the next step's work once it hears
    nlohmann::json refused = nlohmann::json::array();
    for (const auto& r : report.refused) refused.push_back({{"peer", r.peer.substr(0, 8)}, {"reason", r.reason}});
    event({{"event", "step"},
           {"stage", stage_},
           {"version", version_},
           {"contributions", round.size()},
           {"refused", refused},
           {"hash", hex_encode(hash_)},
           {"forwards", summary_.forwards},
           {"seconds_per_sample", seconds_per_sample_}});
    save_state();
  }

  void save_state() {
    if (o_.state_dir.empty()) return;
    StageCheckpoint state;
    state.steps = static_cast<int64_t>(version_);
    for (const auto& [name, t] : demo_->state()) state.optimizer[name] = t.clone();
    save_stage_checkpoint(o_.state_dir, model_, subspace_.get(), fingerprint_, state, 2);
  }

  // ---- joining: the stage's parameters at the step ------------------------------------------

  void fetch_or_restore(const wire::SwarmView& v) {
    if (step_ == 0 && version_ == 0 && hash_ == stage_hash_) {
      ready_ = true;  // the seeded start, as the others have it
      return;
    }
    if (!v.has_source()) {
      restore(v.previous_hash());
      return;
    }
    if (fetch_ && fetch_->step == step_ && fetch_->source == v.source().key()) return;
    fetch_.reset();
    Fetch f;
    f.step = step_;
    f.source = v.source().key();
    f.expected = stage_hash_;
    f.started = Clock::now();
    try {
      f.client = std::make_unique<net::Client>(context_, identity_, v.source().endpoint(),
                                               v.source().key(), limits(), 1024);
    } catch (const Error&) {
      return;
    }
    for (const NamedParameter& p : model_->hf_parameters()) {
      wire::Envelope e;
      e.mutable_get_tensor()->set_applied_steps(step_);
      e.mutable_get_tensor()->set_name(p.name);
      f.client->send(e);
      f.missing.insert(p.name);
    }
    fetch_ = std::move(f);
  }

  void on_tensor(const wire::Envelope& reply) {
    if (!fetch_) return;
    if (reply.has_not_found()) {
      fetch_.reset();  // the source moved on: the next view names a source at the new step
      return;
    }
    if (!reply.has_tensor_data()) return;
    const wire::TensorData& t = reply.tensor_data();
    if (t.applied_steps() != fetch_->step || fetch_->missing.count(t.name()) == 0) return;
    for (const NamedParameter& p : model_->hf_parameters()) {
      if (p.name != t.name()) continue;
      const auto bytes = static_cast<size_t>(p.tensor.numel()) * 4;
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      if (t.dtype() != "F32" || t.data().size() != bytes || shape != p.tensor.sizes().vec()) {
        event({{"event", "fetch_refused"}, {"tensor", t.name()}, {"why", "dtype or shape"}});
        fetch_.reset();
        return;
      }
      torch::NoGradGuard no_grad;
      p.tensor.copy_(torch::from_blob(const_cast<char*>(t.data().data()), shape, torch::kFloat32));
    }
    fetch_->missing.erase(t.name());
    if (!fetch_->missing.empty()) return;
    const std::string hash = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
    if (!fetch_->expected.empty() && hash != fetch_->expected) {
      event({{"event", "fetch_refused"}, {"why", "hash"}, {"hash", hex_encode(hash)}});
      fetch_.reset();
      return;
    }
    become_ready(fetch_->step, hash, "fetched", seconds_since(fetch_->started));
    ++summary_.fetches;
    fetch_.reset();
  }

  // Every replica of the stage died: the copy this peer saved, at the step (when the stage's
  // hash there is known) or at the step before (when the replicas died before reporting the
  // round's result: the coordinator then hands this peer the round to apply).
  void restore(const std::string& previous_hash) {
    if (o_.state_dir.empty() || seconds_since(last_restore_try_) < 1) return;
    last_restore_try_ = Clock::now();
    const auto held = stage_checkpoint_steps(o_.state_dir, stage_, fingerprint_);
    auto holds = [&](uint64_t s) { return std::find(held.begin(), held.end(), s) != held.end(); };
    uint64_t at = step_;
    std::string expected = stage_hash_;
    if (expected.empty() || !holds(at)) {
      if (step_ == 0 || previous_hash.empty() || !holds(step_ - 1)) return;
      at = step_ - 1;
      expected = previous_hash;
    }
    StageCheckpoint state =
        load_stage_checkpoint(o_.state_dir, static_cast<int64_t>(at), model_, fingerprint_);
    const std::string hash = hex_decode(stage_parameter_hash(model_), 32, "stage hash");
    if (hash != expected) {
      event({{"event", "restore_refused"}, {"version", at}, {"hash", hex_encode(hash)}});
      return;
    }
    demo_->load_state(state.optimizer);
    become_ready(at, hash, "restored", 0);
  }

  void become_ready(uint64_t step, const std::string& hash, const char* how, double seconds) {
    if (std::string(how) != "restored") new_momentum();
    version_ = step;
    hash_ = hash;
    ready_ = true;
    forget_work();
    event({{"event", how}, {"stage", stage_}, {"version", step}, {"hash", hex_encode(hash)},
           {"seconds", seconds}});
  }

  // ---- serving: forwards in, GetTensor, backwards ------------------------------------------

  void serve(const net::Incoming& in) {
    if (in.message.has_get_tensor()) return answer_tensor(in);
    if (!in.message.has_swarm_hop() || in.message.swarm_hop().backward()) return;
    if (prev_curves_.count(in.curve_key) == 0) {
      ++ignored_;
      return;
    }
    if (waiting_.size() >= kMaxWaiting) {
      ++ignored_;
      return;
    }
    waiting_.push_back({in.route, in.message.swarm_hop()});
  }

  void answer_tensor(const net::Incoming& in) {
    if (!tensor_rate_.take(2000, 4000, now())) return;
    const wire::GetTensor& g = in.message.get_tensor();
    wire::Envelope e;
    if (ready_ && g.applied_steps() == version_) {
      for (const NamedParameter& p : model_->hf_parameters()) {
        if (p.name != g.name()) continue;
        auto* t = e.mutable_tensor_data();
        t->set_applied_steps(version_);
        t->set_name(p.name);
        t->set_dtype("F32");
        for (int64_t d : p.tensor.sizes()) t->add_shape(d);
        t->set_data(parameter_bytes(p.tensor));
      }
    }
    if (!e.has_tensor_data()) e.mutable_not_found()->set_what(g.name());
    server_.send(in.route, e);
  }

  bool pump() {
    bool any = false;
    for (int n = 0; n < 64; ++n) {
      std::optional<net::Incoming> in = server_.recv();
      if (!in) break;
      serve(*in);
      any = true;
    }
    while (std::optional<wire::Envelope> m = coordinator_.recv()) {
      if (m->has_swarm_view()) on_view(m->swarm_view());
      any = true;
      if (finished_) return true;
    }
    for (auto& [key, client] : clients_) {
      for (int n = 0; n < 64; ++n) {
        std::optional<wire::Envelope> m = client->recv();
        if (!m) break;
        any = true;
        if (m->has_swarm_hop() && m->swarm_hop().backward()) {
          backwards_.push_back({key, m->swarm_hop()});
        }
      }
    }
    if (fetch_) {
      while (fetch_ && fetch_->client) {
        std::optional<wire::Envelope> m = fetch_->client->recv();
        if (!m) break;
        any = true;
        on_tensor(*m);
      }
    }
    return any;
  }

  void wait_for_messages() {
    std::vector<zmq::pollitem_t> items;
    items.push_back({server_.socket().handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({coordinator_.socket().handle(), 0, ZMQ_POLLIN, 0});
    for (auto& [key, client] : clients_) items.push_back({client->socket().handle(), 0, ZMQ_POLLIN, 0});
    if (fetch_ && fetch_->client) items.push_back({fetch_->client->socket().handle(), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(5));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // Ctrl-C: the loop's stop flag ends the run
    }
  }

  // One piece of work: a backward first (it frees memory and finishes micro-batches), then a
  // forward that waits, then (stage 0) a new micro-batch or one to send again.
  bool compute() {
    if (!ready_ || version_ != step_) {
      backwards_.clear();
      return false;
    }
    if (!backwards_.empty()) {
      auto [from, hop] = std::move(backwards_.front());
      backwards_.pop_front();
      if (hop.step() == version_) backward(from, hop);
      return true;
    }
    if (phase_ != "training") return false;
    // Forwards of an older step are dropped; of a newer one (a sender that saw the step begin
    // first), kept until this replica is there.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->second.step() < version_) {
        it = waiting_.erase(it);
        continue;
      }
      if (it->second.step() > version_) {
        ++it;
        continue;
      }
      auto [route, hop] = std::move(*it);
      waiting_.erase(it);
      forward(route, hop);
      return true;
    }
    if (!unsent_.empty() && !next_.empty()) {
      const Unsent u = std::move(unsent_.front());
      unsent_.pop_front();
      std::string replica;
      if (!send_on(version_, u.micro_batch, u.attempt, u.bytes, &replica)) unsent_.push_front(u);
      return true;
    }
    if (stage_ != 0) return false;
    if (resend_due()) return true;
    if (!assigned_.empty() && static_cast<int64_t>(origin_.size()) < o_.in_flight) {
      const uint32_t j = assigned_.front();
      assigned_.pop_front();
      start(j);
      return true;
    }
    return false;
  }

  torch::Tensor windows(uint64_t step, uint32_t j) const {
    return read_sequences(data_, step * static_cast<uint64_t>(M_ * m_) + j * static_cast<uint64_t>(m_), m_);
  }
  BoundaryPosition position(uint64_t step, uint32_t j, int64_t stage) const {
    return {step, j, static_cast<uint32_t>(stage)};
  }

  // Sleeps out what a slower machine would still be computing, and measures.
  double pace(Clock::time_point started, double share) {
    if (o_.pace_unit > 0) {
      const double target = o_.pace_unit * costs_[static_cast<size_t>(stage_)] / o_.speed *
                            static_cast<double>(m_) * share;
      const double left = target - seconds_since(started);
      if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    }
    return seconds_since(started);
  }

  void measured(double seconds) {
    const double sps = seconds / static_cast<double>(m_);
    ++measured_;
    seconds_per_sample_ = measured_ == 1 ? sps : 0.8 * seconds_per_sample_ + 0.2 * sps;
  }

  // Sends `bytes` on to the next stage by the router; false when no replica is there.
  bool send_on(uint64_t step, uint32_t j, uint32_t attempt, const std::string& bytes,
               std::string* replica) {
    const std::optional<uint64_t> id = router_.pick(m_, now());
    if (!id) return false;
    *replica = by_id_.at(*id);
    wire::Envelope e;
    auto* hop = e.mutable_swarm_hop();
    hop->set_step(step);
    hop->set_micro_batch(j);
    hop->set_attempt(attempt);
    hop->set_boundary(bytes);
    clients_.at(*replica)->send(e);
    return true;
  }

  void start(uint32_t j) {
    const auto started = Clock::now();
    const torch::Tensor tokens = windows(version_, j).narrow(1, 0, config_.data.seq_len);
    Origin f;
    f.output = model_->forward(tokens);
    f.bytes = coder_->encode_forward(position(version_, j, 0), f.output, tokens);
    f.forward_seconds = pace(started, 1.0 / 3);
    ++summary_.forwards;
    f.attempt = next_attempt_++;
    f.sent = send_on(version_, j, f.attempt, f.bytes, &f.replica);
    f.sent_at = Clock::now();
    origin_[j] = std::move(f);
  }

  // Stage 0: a micro-batch whose replica left, or that was in flight when a member was lost, or
  // unanswered for too long, goes again (to another replica when there is one).
  bool resend_due() {
    for (auto& [j, f] : origin_) {
      const bool gone = f.sent && next_.count(f.replica) == 0;
      if (f.sent && !gone && !f.stale && seconds_since(f.sent_at) < o_.timeout_seconds) continue;
      if (f.sent) router_.failed(router_id(f.replica), now());
      f.attempt = next_attempt_++;
      f.stale = false;
      const bool was_sent = f.sent;
      f.sent = send_on(version_, j, f.attempt, f.bytes, &f.replica);
      f.sent_at = Clock::now();
      if (f.sent && was_sent) ++retried_;
      if (f.sent) return true;
    }
    return false;
  }

  void forward(const std::string& route, const wire::SwarmHop& hop) {
    const auto started = Clock::now();
    const uint32_t j = hop.micro_batch();
    if (j >= static_cast<uint32_t>(M_)) return;
    const torch::Tensor w = windows(version_, j);
    const torch::Tensor tokens = w.narrow(1, 0, config_.data.seq_len);
    torch::Tensor in;
    try {
      in = coder_->decode_forward(hop.boundary(), position(version_, j, stage_ - 1), tokens,
                                  torch::kCPU)
               .requires_grad_(true);
    } catch (const Error& e) {
      event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
      return;
    }
    ++summary_.forwards;
    if (span_.head) {
      const torch::Tensor logits = model_->forward(in);
      const torch::Tensor loss =
          next_token_loss(logits, w.narrow(1, 1, config_.data.seq_len)) / static_cast<double>(M_);
      const double forward_seconds = pace(started, 1.0 / 3);
      const auto back = Clock::now();
      loss.backward();
      const std::string bytes = coder_->encode_backward(position(version_, j, stage_), in.grad(), in);
      const double seconds = forward_seconds + pace(back, 2.0 / 3);
      measured(seconds);
      ++summary_.backwards;
      reply(route, hop, bytes, loss.item<float>() * static_cast<float>(M_), seconds);
      return;
    }
    Held h;
    h.route = route;
    h.attempt = hop.attempt();
    h.input = in;
    h.output = model_->forward(in);
    const std::string bytes = coder_->encode_forward(position(version_, j, stage_), h.output, tokens);
    h.forward_seconds = pace(started, 1.0 / 3);
    const uint32_t mine = next_attempt_++;
    std::string replica;
    // No replica of the next stage serving yet: sent as soon as one is.
    if (!send_on(version_, j, mine, bytes, &replica)) unsent_.push_back({j, mine, bytes});
    if (held_.size() >= 4 * static_cast<size_t>(M_) + kMaxWaiting) held_.erase(held_.begin());
    held_[{j, mine}] = std::move(h);
  }

  void reply(const std::string& route, const wire::SwarmHop& hop, const std::string& bytes,
             float loss, double seconds) {
    wire::Envelope e;
    auto* b = e.mutable_swarm_hop();
    b->set_step(hop.step());
    b->set_micro_batch(hop.micro_batch());
    b->set_attempt(hop.attempt());
    b->set_backward(true);
    b->set_boundary(bytes);
    b->set_loss(loss);
    b->set_seconds(static_cast<float>(seconds));
    server_.send(route, e);
  }

  void backward(const std::string& from, const wire::SwarmHop& hop) {
    const uint32_t j = hop.micro_batch();
    router_.answered(router_id(from), m_, hop.seconds());
    const auto started = Clock::now();
    if (stage_ == 0) {
      const auto it = origin_.find(j);
      if (it == origin_.end() || it->second.attempt != hop.attempt()) return;  // an old attempt
      Origin& f = it->second;
      try {
        f.output.backward(coder_->decode_backward(hop.boundary(), position(version_, j, 1),
                                                  f.output.size(0), f.output.size(1),
                                                  torch::kCPU));
      } catch (const Error& e) {
        event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
        return;
      }
      measured(f.forward_seconds + pace(started, 2.0 / 3));
      ++summary_.backwards;
      done_.emplace_back(j, hop.loss());
      origin_.erase(it);
      return;
    }
    const auto it = held_.find({j, hop.attempt()});
    if (it == held_.end()) return;
    Held& h = it->second;
    try {
      h.output.backward(coder_->decode_backward(hop.boundary(), position(version_, j, stage_ + 1),
                                                h.output.size(0), h.output.size(1),
                                                torch::kCPU));
    } catch (const Error& e) {
      event({{"event", "refused_hop"}, {"micro_batch", j}, {"why", e.what()}});
      held_.erase(it);
      return;
    }
    const std::string bytes =
        coder_->encode_backward(position(version_, j, stage_), h.input.grad(), h.input);
    const double seconds = h.forward_seconds + pace(started, 2.0 / 3);
    measured(seconds);
    ++summary_.backwards;
    wire::SwarmHop back = hop;
    back.set_attempt(h.attempt);
    reply(h.route, back, bytes, hop.loss(), seconds);
    held_.erase(it);
  }

  void event(nlohmann::json e) {
    if (!events_.is_open()) return;
    e["t"] = now();
    events_ << e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n'
            << std::flush;
  }

  struct Origin {
    torch::Tensor output;
    std::string bytes, replica;
    uint32_t attempt = 0;
    bool sent = false, stale = false;
    double forward_seconds = 0;
    Clock::time_point sent_at;
  };
  struct Held {
    std::string route;
    uint32_t attempt = 0;  // the sender's
    torch::Tensor input, output;
    double forward_seconds = 0;
  };
  struct Unsent {
    uint32_t micro_batch = 0, attempt = 0;
    std::string bytes;
  };
  struct Fetch {
    uint64_t step = 0;
    std::string source, expected;
    std::set<std::string> missing;
    std::unique_ptr<net::Client> client;
    Clock::time_point started;
  };

  RunConfig config_;
  SwarmPeerOptions o_;
  const net::Identity& identity_;
  int64_t S_, M_, m_;
  std::vector<double> costs_;
  Sampler data_;
  std::string fingerprint_;
  Clock::time_point born_ = Clock::now();
  net::Context context_;
  net::Server server_;
  net::Client coordinator_;
  std::unique_ptr<SubspaceBasis> subspace_;
  std::optional<BoundaryCoder> coder_;
  std::ofstream events_;

  // The stage.
  int64_t stage_ = -1;
  StageSpan span_;
  StageModel model_{nullptr};
  std::unique_ptr<DecoupledMomentum> demo_;
  uint64_t version_ = 0;
  bool ready_ = false;
  std::string hash_;  // raw, of the parameters at version_
  double seconds_per_sample_ = 0;
  int64_t measured_ = 0;

  // The coordinator's view.
  uint64_t step_ = 0, epoch_ = 0;
  std::string phase_ = "waiting", stage_hash_;
  bool finished_ = false;
  Clock::time_point last_view_, last_poll_, last_restore_try_;
  int polls_in_flight_ = 0;

  // Routing and work.
  SwarmRouter router_{SwarmRouterOptions{}};
  std::map<std::string, std::string> next_;  // key -> endpoint
  std::map<std::string, std::unique_ptr<net::Client>> clients_;
  std::map<uint64_t, std::string> by_id_;
  std::set<std::string> prev_curves_;
  std::deque<std::pair<std::string, wire::SwarmHop>> waiting_, backwards_;
  std::map<std::pair<uint32_t, uint32_t>, Held> held_;  // (micro-batch, attempt sent on)
  std::map<uint32_t, Origin> origin_;
  std::deque<Unsent> unsent_;  // middle stages: forwards waiting for a next replica
  std::deque<uint32_t> assigned_;
  std::vector<std::pair<uint32_t, float>> done_;
  std::optional<std::string> payload_;
  bool round_seen_ = false, report_now_ = false;
  std::optional<Fetch> fetch_;
  uint32_t next_attempt_ = 1;
  int64_t retried_ = 0;
  uint64_t ignored_ = 0;
  TokenBucket tensor_rate_;
  SwarmPeerSummary summary_;
};

}  // namespace

SwarmPeerSummary run_swarm_peer(const RunConfig& config, const net::Identity& identity,
                                const SwarmPeerOptions& options) {
  if (config.pipeline.stages < 2) {
    fail("agora swarm peer: pipeline.stages is {} (allowed: 2 or more; a swarm serves stages)",
         config.pipeline.stages);
  }
  if (config.train.batch_size % config.train.micro_batch_size != 0) {
    fail("train.batch_size {} is not a multiple of train.micro_batch_size {}",
         config.train.batch_size, config.train.micro_batch_size);
  }
  if (config.demo.lookahead) {
    fail("demo.lookahead is not available in a swarm (allowed: false): replicas take their "
         "gradients at the stage's parameters");
  }
  if (options.listen.empty()) fail("agora swarm peer needs --listen (where replicas connect)");
  if (!(options.speed > 0) || !(options.pace_unit >= 0)) {
    fail("--speed {} and --pace-unit {}: allowed speed > 0 and pace >= 0", options.speed,
         options.pace_unit);
  }
  if (!options.costs.empty() &&
      static_cast<int64_t>(options.costs.size()) != config.pipeline.stages) {
    fail("--costs has {} values for {} stages", options.costs.size(), config.pipeline.stages);
  }
  for (double c : options.costs) {
    if (!(c > 0)) fail("--costs: {} is not a positive cost", c);
  }
  if (options.in_flight < 1 || options.in_flight > 1024) {
    fail("--in-flight {} is invalid (allowed: 1 to 1024)", options.in_flight);
  }
  SwarmPeer peer(config, identity, options);
  try {
    return peer.run();
  } catch (const std::exception& error) {
    peer.failed(error.what());
    throw;
  }
}

}  // namespace agora
