// The replica process (swarm_peer.h): set-up, the coordinator, the step's sync.
#include <fmt/format.h>

#include <algorithm>

#include "agora/optim/payload.h"
#include "agora/swarm/swarm_peer_detail.h"

namespace agora::swarm_detail {

namespace fs = std::filesystem;

namespace {

std::string endpoint_to_dial(const SwarmPeerOptions& o, const std::string& bound) {
  if (!o.advertise.empty()) return o.advertise;
  std::string e = bound;
  const auto at = e.find("0.0.0.0");
  if (at != std::string::npos) e.replace(at, 7, "127.0.0.1");
  return e;
}

}  // namespace

uint64_t router_id(const std::string& key) {
  uint64_t id = 0;
  for (size_t i = 0; i < 8 && i < key.size(); ++i) id = (id << 8) | static_cast<uint8_t>(key[i]);
  return id;
}

SwarmPeer::SwarmPeer(const RunConfig& config, const net::Identity& identity,
                     const SwarmPeerOptions& o)
    : config_(config),
      o_(o),
      identity_(identity),
      S_(config.pipeline.stages),
      M_(config.train.batch_size / config.train.micro_batch_size),
      m_(config.train.micro_batch_size),
      costs_(!o.costs.empty() ? o.costs : swarm_stage_costs(config.model, config.pipeline.stages)),
      data_(Sampler::from_directory(config.data.dir, "train",
                                    static_cast<uint32_t>(config.data.seq_len), config.seed)),
      fingerprint_(stage_run_fingerprint(config)),
      server_(context_, identity, o.listen, hop_limits(config), /*reply_queue=*/4096),
      coordinator_(context_, identity, o.coordinator, o.coordinator_key, coordinator_limits()) {
  if (config.pipeline.codec == "subspace") {
    subspace_ = std::make_unique<SubspaceBasis>(config.model, config.pipeline.subspace_rank,
                                                config.seed, torch::kCPU);
  }
  coder_.emplace(config.pipeline, config.model.hidden_size, subspace_.get());
  if (!o.events.empty())
    events_ = obs::EventLog(o.events, /*append=*/true, [this] { return now(); });
}

SwarmPeerSummary SwarmPeer::run() {
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
         {"refused_handshakes", context_.refused()},
         {"seconds", s.seconds}});
  return s;
}

void SwarmPeer::failed(const std::string& what) {
  event({{"event", "error"}, {"stage", stage_}, {"version", version_}, {"message", what}});
}

// The coordinator's key is pinned and a view carries one round of a stage's contributions, as
// many as the coordinator admits members: the bound is a generous constant, not a shape.
net::DecodeLimits SwarmPeer::coordinator_limits() {
  net::DecodeLimits l;
  l.max_control = 64 << 10;
  l.max_data = size_t{256} << 20;
  return l;
}

// What this replica's server receives, and its answers from the next stage: hops (a
// micro-batch's activations or their gradient, at most float32 [m, T, hidden] and its tokens)
// and GetTensor. So a frame is bounded by that, not by the 256 MiB a view may need: a member of
// a neighbouring stage cannot make it receive more than one hop's worth per frame (issue 38,
// finding 8).
net::DecodeLimits SwarmPeer::hop_limits(const RunConfig& config) {
  net::DecodeLimits l = coordinator_limits();
  const auto hop = static_cast<size_t>(config.train.micro_batch_size) *
                   static_cast<size_t>(config.data.seq_len) *
                   static_cast<size_t>(config.model.hidden_size + 1) * 4;
  l.max_data = std::min(l.max_data, 2 * hop + (size_t{1} << 20));
  return l;
}

// A fetch answers one parameter tensor of this replica's stage (float32 at most) per message.
net::DecodeLimits SwarmPeer::fetch_limits() const {
  net::DecodeLimits l = coordinator_limits();
  size_t largest = 0;
  for (const NamedParameter& p : model_->hf_parameters()) {
    largest = std::max(largest, static_cast<size_t>(p.tensor.numel()) * 4);
  }
  l.max_data = std::min(l.max_data, largest + (size_t{1} << 20));
  return l;
}

double SwarmPeer::seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void SwarmPeer::hello() {
  wire::Envelope e;
  auto* h = e.mutable_swarm_hello();
  h->set_key(identity_.public_key());
  h->set_agent("agora");
  h->set_endpoint(endpoint_to_dial(o_, server_.bound_endpoint()));
  // Joining again: the stage it holds.
  h->set_stage(static_cast<int32_t>(stage_ >= 0 ? stage_ : o_.stage));
  h->set_fingerprint(fingerprint_);
  coordinator_.send(e);
  last_view_ = last_poll_ = last_hello_ = Clock::now();
  event({{"event", "start"},
         {"endpoint", h->endpoint()},
         {"key", net::key_to_hex(identity_.public_key())},
         {"asked_stage", o_.stage}});
}

void SwarmPeer::take_stage(int64_t stage) {
  const bool move = stage_ >= 0;
  stage_ = stage;
  span_ = partition_model(config_.model, S_).at(static_cast<size_t>(stage));
  model_ = StageModel(config_.model, span_, config_.seed, subspace_.get());
  const auto tensors = static_cast<double>(model_->hf_parameters().size());
  tensor_rates_.set_member_rate({tensors, 4 * tensors});
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

SwarmRouterOptions SwarmPeer::router_options() const {
  SwarmRouterOptions r;
  r.uniform = o_.uniform_routing;
  r.seed = router_id(identity_.public_key());
  r.skip_seconds = std::max(1.0, o_.timeout_seconds / 3);
  return r;
}

void SwarmPeer::new_momentum() {
  DemoOptions d;
  d.beta = config_.demo.beta;
  d.topk = config_.demo.topk;
  d.chunk = config_.demo.chunk;
  d.weight_decay = config_.optimizer.weight_decay;
  d.one_bit = config_.demo.one_bit;
  d.max_norm_ratio = config_.demo.max_norm_ratio;
  demo_ = std::make_unique<DecoupledMomentum>(model_->hf_parameters(), d);
}

void SwarmPeer::forget_work(bool keep_forwards) {
  if (!keep_forwards) {
    waiting_.clear();
    strangers_.clear();
  }
  unsent_.clear();
  held_.clear();
  origin_.clear();
  assigned_.clear();
  done_.clear();
  payload_.reset();
  for (torch::Tensor& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
}

bool SwarmPeer::poll_if_due() {
  name_drops();
  const bool urgent =
      !done_.empty() || (payload_ && !round_seen_) || report_now_ || !dropped_.empty();
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
  for (const std::string& k : dropped_) p->add_dropped(k);
  if (!dropped_.empty())
    event({{"event", "named_drops"}, {"version", version_}, {"replicas", dropped_.size()}});
  dropped_.clear();
  if (payload_ && !round_seen_) p->set_payload(*payload_);
  coordinator_.send(e);
  ++polls_in_flight_;
  return true;
}

void SwarmPeer::on_refused(const wire::Refused& r) {
  last_view_ = Clock::now();
  polls_in_flight_ = std::max(0, polls_in_flight_ - 1);
  if (!r.may_rejoin()) fail("the coordinator refused this peer: {}", r.reason().substr(0, 300));
  // The coordinator lost this peer (silent past its timeout: a stall, a partition; or it
  // restarted): join again. Parameters it still holds at the stage's hash make it ready at once.
  if (seconds_since(last_hello_) > 1) {
    event({{"event", "rejoin"}, {"stage", stage_}, {"version", version_}});
    hello();
  }
}

void SwarmPeer::on_view(const wire::SwarmView& v) {
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
  const bool round_coming =
      ready_ && version_ + 1 == step_ && (v.previous_hash().empty() || v.previous_hash() == hash_);
  if (version_ != step_ && !round_coming) ready_ = false;
  if (ready_ && version_ == step_ && !stage_hash_.empty() && hash_ != stage_hash_) {
    event({{"event", "outvoted"}, {"version", version_}, {"hash", hex_encode(hash_)}});
    ready_ = false;
  }
  admit(v);
  if (!ready_) {
    fetch_or_restore(v);
    return;
  }
  members(v);
  for (uint32_t j : v.micro_batches()) {
    if (j < static_cast<uint32_t>(M_) && o_.behave != "hold") assigned_.push_back(j);
  }
  if (phase_ == "syncing" && version_ == step_ && !payload_ && o_.behave != "mute") contribute();
}

void SwarmPeer::members(const wire::SwarmView& v) {
  std::set<std::string> next;
  for (const wire::SwarmMember& m : v.next()) {
    if (m.stage() != static_cast<uint32_t>(stage_ + 1)) continue;
    next.insert(m.key());
    if (next_.count(m.key()) == 0 || next_[m.key()] != m.endpoint()) {
      try {
        clients_[m.key()] = std::make_unique<net::Client>(context_, identity_, m.endpoint(),
                                                          m.key(), hop_limits(config_), 1024);
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
  if (v.epoch() != epoch_) {
    // A member was lost: what it held in flight will not come back. Which micro-batches those
    // are, stage 0 cannot tell (their paths are the routers'), so every one out now is suspect,
    // and sent again unless it returns within two round trips.
    epoch_ = v.epoch();
    for (auto& [j, f] : origin_) {
      if (f.sent && !f.suspect) {
        f.suspect = true;
        f.suspect_at = Clock::now();
      }
    }
  }
}

void SwarmPeer::admit(const wire::SwarmView& v) {
  stage_curves_.clear();
  for (const wire::SwarmMember& m : v.peers()) {
    try {
      if (m.stage() == static_cast<uint32_t>(stage_))
        stage_curves_.insert(net::curve_public_of(m.key()));
    } catch (const Error&) {
    }
  }
  tensor_rates_.forget_if([&](const std::string& key) { return !stage_curves_.contains(key); });
  prev_curves_.clear();
  for (const wire::SwarmMember& m : v.prev()) {
    try {
      prev_curves_.insert(net::curve_public_of(m.key()));
    } catch (const Error&) {
    }
  }
  // Strangers cannot even complete a handshake (issue 38, finding 8): what they could send is
  // never buffered. A member a view has not named yet is refused too, and its socket connects
  // again (ZeroMQ retries within 2 s) until this replica's next view names it.
  std::set<std::string> admitted = stage_curves_;
  admitted.insert(prev_curves_.begin(), prev_curves_.end());
  if (admitted != admitted_) {
    admitted_ = admitted;
    context_.set_admission(net::Admission{false, std::move(admitted)});
  }
  for (auto& [curve, forward] : strangers_) {
    if (prev_curves_.count(curve) != 0) {
      waiting_.push_back(std::move(forward));
    } else {
      ++ignored_;
    }
  }
  strangers_.clear();
}

void SwarmPeer::contribute() {
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
  if (o_.behave == "sign_flip" || o_.behave == "scale" || o_.behave == "zero") {
    Payload p = decode_payload(*payload_);  // bench/poisoning: a contribution rewritten
    const float by = o_.behave == "sign_flip" ? -1.0f : o_.behave == "scale" ? 1e6f : 0.0f;
    for (TensorPayload& t : p.tensors) {
      for (float& v : t.values) v *= by;
    }
    payload_ = encode_payload(p);
  }
  round_seen_ = false;
  waiting_.clear();
  unsent_.clear();
  held_.clear();
  origin_.clear();
  assigned_.clear();
}

void SwarmPeer::apply_round(const wire::SwarmView& v) {
  round_seen_ = true;
  std::vector<Contribution> round;
  for (const wire::SwarmContribution& c : v.round())
    round.push_back({hex_encode(c.key()), c.payload()});
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
  for (const auto& r : report.refused)
    refused.push_back({{"peer", r.peer.substr(0, 8)}, {"reason", r.reason}});
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

void SwarmPeer::event(nlohmann::json e) {
  events_.write(std::move(e));
}

}  // namespace agora::swarm_detail

namespace agora {

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
    fail(
        "demo.lookahead is not available in a swarm (allowed: false): replicas take their "
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
  swarm_detail::SwarmPeer peer(config, identity, options);
  try {
    return peer.run();
  } catch (const std::exception& error) {
    peer.failed(error.what());
    throw;
  }
}

}  // namespace agora
