#include "agora/peer/verification.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/optim/payload_agreement.h"
#include "agora/peer/test_hooks.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/recompute.h"
#include "agora/train/strategy_factory.h"

namespace agora::peer {

namespace {

constexpr size_t kMaxQueued = 8;
const int kNice = [] {
  const char* v = std::getenv("AGORA_VERIFY_NICE");  // for bench/verify's comparison
  return v != nullptr ? std::atoi(v) : 5;
}();
// The states a verifier fetches: DeMo's momentum, one tensor per parameter.
constexpr std::string_view kMomentumPrefix = "delta.";

// The tensors' hashes in name order, as a state record's hash is formed (its BLAKE2b is the
// commitment).
std::string manifest_of(const Snapshot& snapshot) {
  std::string hashes;
  for (const auto& [name, t] : snapshot) hashes += blake2b256_bytes(t.data);
  return hashes;
}

// The payload's tensors at `indices` only.
Payload only(Payload payload, const std::vector<size_t>& indices) {
  std::vector<TensorPayload> kept;
  for (size_t i : indices) {
    if (i >= payload.tensors.size()) fail("the payload has no tensor {}", i);
    kept.push_back(std::move(payload.tensors[i]));
  }
  payload.tensors = std::move(kept);
  return payload;
}

}  // namespace

Verification::~Verification() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cancel_ = true;
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

bool Verification::enabled() const {
  const RunConfig& c = peer_.config;
  return c.verify.rate > 0 && c.optimizer.name == "demo" && !c.demo.lookahead;
}

std::shared_ptr<const StrategyState> Verification::snapshot_strategy() const {
  auto tensors = std::make_shared<Snapshot>();
  for (const auto& [name, t] : peer_.learner.strategy->state()) {
    if (!name.starts_with(kMomentumPrefix)) continue;
    TensorBytes& out = (*tensors)[name];
    out.dtype = "F32";
    out.shape.assign(t.sizes().begin(), t.sizes().end());
    out.data = parameter_bytes(t);
  }
  auto state = std::make_shared<StrategyState>();
  state->manifest = manifest_of(*tensors);
  state->hash = blake2b256_bytes(state->manifest);
  state->tensors = std::move(tensors);
  return state;
}

void Verification::keep_parameters() {
  const auto window = static_cast<size_t>(peer_.config.verify.window);
  std::vector<wire::SpotCheck> unanswerable;
  {
    std::lock_guard lock(mutex_);
    if (parameters_.contains(peer_.applied)) return;
    std::vector<torch::Tensor> copy;
    for (const torch::Tensor& p : peer_.learner.params) copy.push_back(p.detach().clone());
    parameters_[peer_.applied] = copy;
    while (parameters_.size() > window) parameters_.erase(parameters_.begin());
    // Checks that waited for these parameters go to the queue; those for counts this peer
    // jumped over (a resync) never will.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->check.apply_through() == peer_.applied) {
        it->params = copy;
        enqueue(std::move(*it));
      } else if (it->check.apply_through() < peer_.applied) {
        unanswerable.push_back(std::move(it->check));
      } else {
        ++it;
        continue;
      }
      it = waiting_.erase(it);
    }
  }
  wake_.notify_one();
  for (const wire::SpotCheck& c : unanswerable) {
    wire::Verdict v;
    v.set_outcome(wire::Verdict::ABSTAINS);
    v.set_reason(
        fmt::format("this verifier never held the parameters after {} steps", c.apply_through()));
    answer(c, std::move(v));
  }
}

void Verification::forget_parameters() {
  std::vector<wire::SpotCheck> dropped;
  {
    std::lock_guard lock(mutex_);
    parameters_.clear();
    // Their parameters were pinned before the sync, and may be the minority's; so were those of
    // a check being gathered or recomputed (current() says so when it ends).
    ++generation_;
    for (Queued& q : queue_) dropped.push_back(std::move(q.check));
    queue_.clear();
    for (Gathered& g : ready_) dropped.push_back(std::move(g.queued.check));
    ready_.clear();
  }
  for (const wire::SpotCheck& c : dropped) {
    wire::Verdict v;
    v.set_outcome(wire::Verdict::ABSTAINS);
    v.set_reason("this verifier resynchronised its parameters");
    answer(c, std::move(v));
  }
  if (enabled()) keep_parameters();
}

void Verification::enqueue(Queued queued) {
  queued.generation = generation_;
  if (queued.check.attempt() > 1) {
    queue_.push_front(std::move(queued));
  } else {
    queue_.push_back(std::move(queued));
  }
}

void Verification::before_step() {
  const auto started = std::chrono::steady_clock::now();
  if (last_step_started_) {
    round_seconds_ = std::chrono::duration<double>(started - *last_step_started_).count();
  }
  last_step_started_ = started;
  const auto window = static_cast<size_t>(peer_.config.verify.window);
  keep_parameters();
  trained_from_ = peer_.applied;
  latest_round_ = peer_.next_round;
  cancel_stale_check();
  // The momentum changes only in the step's contribution: unless the strategy was replaced (a
  // resync) or touched since, the state before this step is the one after the last, already
  // hashed. Hashing the momentum is the bookkeeping's main cost.
  if (after_ != nullptr && identity_of_state() == after_identity_) {
    before_ = after_;
  } else {
    before_ = snapshot_strategy();
    peer_.link.publish_strategy_state(before_, 2 * window + 2);
  }
  bookkeeping_seconds_ = seconds_since(started);
}

void Verification::cancel_stale_check() {
  // A recomputation whose check the coordinator has given up (verify.window rounds on, or
  // verify.seconds since it was asked) is work nobody will read: it stops at its next
  // micro-batch rather than take CPU from training for nothing.
  if (!running_) return;
  std::lock_guard lock(mutex_);
  const bool past_window =
      running_step_ + static_cast<uint64_t>(peer_.config.verify.window) <= latest_round_;
  const bool past_time = seconds_since(running_received_) > peer_.config.verify.seconds;
  if (past_window || past_time) cancel_ = true;
}

std::vector<std::pair<const void*, int64_t>> Verification::identity_of_state() const {
  std::vector<std::pair<const void*, int64_t>> out;
  for (const auto& [name, t] : peer_.learner.strategy->state()) {
    out.push_back({t.unsafeGetTensorImpl(), t._version()});
  }
  return out;
}

double Verification::after_step(wire::Commit& commit) {
  const auto started = std::chrono::steady_clock::now();
  after_ = snapshot_strategy();
  after_identity_ = identity_of_state();
  peer_.link.publish_strategy_state(after_,
                                    2 * static_cast<size_t>(peer_.config.verify.window) + 2);
  const wire::CommitRecord& r = commit.record();
  commit.set_trained_from(trained_from_);
  commit.set_strategy_before(before_->hash);
  commit.set_strategy_after(after_->hash);
  commit.set_strategy_signature(peer_.identity.sign(net::strategy_signing_bytes(
      peer_.run_id, r.step(), r.payload_hash(), trained_from_, before_->hash, after_->hash)));
  return bookkeeping_seconds_ + seconds_since(started);
}

void Verification::prepare() {
  if (!scratch_ && enabled()) make_scratch();
}

void Verification::make_scratch() {
  scratch_ = std::make_unique<Learner>(Learner::create(peer_.config, peer_.device));
  step_ = std::make_unique<TrainStep>(peer_.config, peer_.device);
  // Names and shapes only (tensors_of needs them): the scratch's own tensors are written by
  // recompute() on another thread.
  for (const auto& [name, t] : scratch_->strategy->state()) {
    if (name.starts_with(kMomentumPrefix)) momentum_like_[name] = torch::empty_like(t);
  }
  // DeMo's payload lists the parameters in the model's order (strategy_factory.h).
  for (const NamedParameter& p : named_parameters(scratch_->model)) {
    const std::string name = std::string(kMomentumPrefix) + p.name;
    if (!momentum_like_.contains(name)) fail("the strategy keeps no momentum for {}", p.name);
    momentum_names_.push_back(name);
  }
}

void Verification::submit(const wire::SpotCheck& check) {
  std::string refusal;
  if (!scratch_) make_scratch();  // it joined a run without spot checks
  {
    std::lock_guard lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    const auto params = parameters_.find(check.apply_through());
    const auto now = std::chrono::steady_clock::now();
    if (queue_.size() + waiting_.size() + ready_.size() + (gathering_ ? 1 : 0) >= kMaxQueued) {
      refusal = fmt::format("this verifier has {} checks waiting", kMaxQueued);
    } else if (params != parameters_.end()) {
      enqueue({check, params->second, now});
    } else if (check.apply_through() > peer_.applied) {
      // The author applied a step this peer has not yet: it will, in a moment.
      waiting_.push_back({check, {}, now});
    } else {
      refusal = fmt::format("no parameters after {} steps kept here", check.apply_through());
    }
  }
  if (!refusal.empty()) {
    wire::Verdict v;
    v.set_outcome(wire::Verdict::ABSTAINS);
    v.set_reason(refusal);
    answer(check, std::move(v));
    return;
  }
  wake_.notify_one();
}

bool Verification::current(const Queued& queued) const {
  std::lock_guard lock(mutex_);
  return queued.generation == generation_;
}

void Verification::settle(const Queued& queued, wire::Verdict verdict, bool background) {
  if (!current(queued)) {
    verdict = {};
    verdict.set_outcome(wire::Verdict::ABSTAINS);
    verdict.set_reason("this verifier resynchronised its parameters");
    background = false;
  }
  answer(queued.check, std::move(verdict), background);
}

bool Verification::stale(const Queued& queued) const {
  // The coordinator asked another verifier after verify.seconds, and ends a check
  // verify.window rounds on: an answer now would only be ignored, and its states may be gone.
  return seconds_since(queued.received) > peer_.config.verify.seconds ||
         queued.check.step() + static_cast<uint64_t>(peer_.config.verify.window) <= latest_round_;
}

double Verification::idle_seconds() const {
  return std::max(0.5, std::min(2.0 * round_seconds_.load(), peer_.config.verify.seconds / 4));
}

void Verification::run_ready_checks() {
  while (true) {
    Gathered next;
    {
      std::lock_guard lock(mutex_);
      if (ready_.empty()) return;
      next = std::move(ready_.front());
      ready_.pop_front();
    }
    if (stale(next.queued)) continue;
    std::unique_lock computing(compute_mutex_, std::try_to_lock);
    if (!computing.owns_lock()) {  // the worker runs one this peer left waiting too long
      std::lock_guard lock(mutex_);
      ready_.push_front(std::move(next));
      return;
    }
    try {
      settle(next.queued, judge(next, &peer_.stop), false);
    } catch (const Cancelled&) {
      return;  // this peer is stopping
    }
  }
}

bool Verification::gathering() const {
  std::lock_guard lock(mutex_);
  return !queue_.empty() || gathering_;
}

void Verification::work() {
  // The worker gathers a check's inputs (network and hashing); the training thread recomputes
  // it when it next waits for the coordinator. A check it leaves waiting longer than
  // idle_seconds() (it never waits: no room was made, or it is the slowest member) the worker
  // recomputes beside training, a little behind it: nice 5, one thread (at nice 10 on a machine
  // training on every core, checks never finished within the window). Linux's nice is per
  // thread, and the threads this one starts for torch inherit it.
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kNice);
  // One thread: OpenMP sizes a new thread's team to every core, and on a machine that trains on
  // all of them a second full team only makes both slower.
  torch::set_num_threads(1);
  std::vector<wire::SpotCheck> resynced;  // gathered with parameters a resync replaced
  while (true) {
    for (const wire::SpotCheck& c : resynced) {
      wire::Verdict v;
      v.set_outcome(wire::Verdict::ABSTAINS);
      v.set_reason("this verifier resynchronised its parameters");
      answer(c, std::move(v));
    }
    resynced.clear();
    std::optional<Queued> next;
    std::optional<Gathered> left;
    {
      std::unique_lock lock(mutex_);
      const auto overdue = [&] {
        return !ready_.empty() && seconds_since(ready_.front().ready_at) > idle_seconds();
      };
      while (!stopping_ && queue_.empty() && !overdue()) {
        if (ready_.empty()) {
          wake_.wait(lock);
        } else {
          wake_.wait_for(lock, std::chrono::milliseconds(100));
        }
      }
      if (stopping_) return;
      if (!queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
        gathering_ = true;
      } else {
        left = std::move(ready_.front());
        ready_.pop_front();
      }
    }
    if (next) {
      std::optional<wire::Verdict> verdict;
      Gathered gathered;
      if (!stale(*next)) {
        try {
          verdict = gather(std::move(*next), gathered);
        } catch (const std::exception& e) {
          if (stopping_) return;
          verdict.emplace();
          verdict->set_outcome(wire::Verdict::ABSTAINS);
          verdict->set_reason(
              fmt::format("this verifier failed to gather the check: {}", e.what()));
        }
        if (verdict) settle(gathered.queued, std::move(*verdict), false);
      }
      std::lock_guard lock(mutex_);
      if (!verdict && gathered.ready_at != std::chrono::steady_clock::time_point{}) {
        if (gathered.queued.generation == generation_) {
          ready_.push_back(std::move(gathered));
        } else {
          resynced.push_back(std::move(gathered.queued.check));
        }
      }
      gathering_ = false;
      continue;
    }
    if (stale(left->queued)) continue;
    std::unique_lock computing(compute_mutex_, std::try_to_lock);
    if (!computing.owns_lock()) {  // the training thread took one: it runs the rest
      std::unique_lock lock(mutex_);
      ready_.push_front(std::move(*left));
      wake_.wait_for(lock, std::chrono::milliseconds(100));  // not a spin while it recomputes
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      cancel_ = stopping_.load();
      running_step_ = left->queued.check.step();
      running_received_ = left->queued.received;
      running_ = true;
    }
    try {
      settle(left->queued, judge(*left, &cancel_), true);
    } catch (const Cancelled&) {
      // its window passed while it ran: the coordinator ended or moved the check
    }
    running_ = false;
    if (stopping_) return;
  }
}

wire::Verdict Verification::judge(const Gathered& gathered, const std::atomic<bool>* stop) {
  try {
    return recompute_and_compare(gathered, stop);
  } catch (const Cancelled&) {
    throw;
  } catch (const std::exception& e) {
    // Out of memory, a device error, states that do not compare: no evidence either way.
    wire::Verdict v;
    v.set_outcome(wire::Verdict::ABSTAINS);
    v.set_reason(fmt::format("this verifier failed to recompute: {}", e.what()));
    return v;
  }
}

wire::Verdict Verification::recompute_and_compare(const Gathered& gathered,
                                                  const std::atomic<bool>* stop) {
  const wire::SpotCheck& c = gathered.queued.check;
  wire::Verdict v;
  const auto disagree = [&](std::string why) {
    v.set_outcome(wire::Verdict::DISAGREES);
    v.set_reason(std::move(why));
    return v;
  };
  std::vector<SequenceRange> ranges;
  for (const auto& r : c.ranges()) ranges.push_back({r.first(), r.count()});
  const auto index = static_cast<int64_t>(c.step());
  const StepContext context{index, peer_.config.learning_rate(index), 1};
  const auto started = std::chrono::steady_clock::now();
  const Recomputed redo = recompute(
      *step_, *scratch_, {gathered.queued.params, &gathered.before, context, ranges}, stop);
  v.set_recompute_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  PayloadAgreement agreement;
  try {
    agreement =
        compare_payloads(only(decode_payload(gathered.payload), gathered.sampled),
                         only(decode_payload(redo.result.contribution.bytes), gathered.sampled));
  } catch (const std::exception& e) {
    return disagree(
        fmt::format("the payload does not compare with the recomputation: {}", e.what()));
  }
  std::map<std::string, torch::Tensor> recomputed_after;
  for (const auto& [name, t] : redo.state_after) {
    if (gathered.after.contains(name)) recomputed_after[name] = t;
  }
  const double state_error = relative_state_error(gathered.after, recomputed_after);
  v.set_overlap(agreement.overlap());
  v.set_worst_overlap(agreement.worst_overlap);
  v.set_sign_agreement(agreement.sign_agreement());
  v.set_state_error(state_error);
  v.set_state_bytes(gathered.state_bytes);
  v.set_tensors_checked(static_cast<uint32_t>(gathered.sampled.size()));
  const AgreementTolerance tolerance;
  if (!agrees(agreement, tolerance)) return disagree("payload: " + describe(agreement));
  if (!momentum_agrees(state_error, tolerance)) {
    return disagree(fmt::format("the momentum after the step is off by {:.3g} (at most {:.3g})",
                                state_error, tolerance.max_state_error));
  }
  v.set_outcome(wire::Verdict::AGREES);
  return v;
}

void Verification::answer(const wire::SpotCheck& c, wire::Verdict verdict, bool background) {
  verdict.set_step(c.step());
  verdict.set_author(c.author().key());
  if (false_verdicts()) {
    verdict.set_outcome(wire::Verdict::DISAGREES);
    verdict.set_reason("AGORA_TEST_FALSE_VERDICTS: a false accusation");
  }
  const char* outcome = verdict.outcome() == wire::Verdict::AGREES      ? "agrees"
                        : verdict.outcome() == wire::Verdict::DISAGREES ? "disagrees"
                                                                        : "abstains";
  if (peer_.options.progress) {
    obs::log_info(
        {c.step(),
         peer_.who,
         "verdict",
         {{"round", c.step()},
          {"author", hex_encode(c.author().key())},
          {"outcome", std::string(outcome)},
          {"reason", verdict.reason()},
          {"overlap", verdict.overlap()},
          {"worst_overlap", verdict.worst_overlap()},
          {"sign_agreement", verdict.sign_agreement()},
          {"state_error", verdict.state_error()},
          {"seconds", verdict.recompute_seconds()},
          {"state_bytes", verdict.state_bytes()},
          {"whole_state_bytes", whole_state_bytes()},
          {"tensors_checked", uint64_t{verdict.tensors_checked()}},
          {"tensors_in_state", uint64_t{momentum_names_.size()}},
          {"background", background}}},
        fmt::format("step {}: {}'s contribution: {}{}{}", c.step(),
                    net::short_key(c.author().key()), outcome, verdict.reason().empty() ? "" : " (",
                    verdict.reason() + (verdict.reason().empty() ? "" : ")")));
  }
  wire::Envelope e;
  *e.mutable_verdict() = std::move(verdict);
  peer_.link.send_to_coordinator(std::move(e));
}

}  // namespace agora::peer
