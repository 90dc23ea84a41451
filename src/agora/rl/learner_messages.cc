// What each message from a rollout worker does to the learner (learner_server.h).
#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/rl/learner_detail.h"
#include "agora/rl/rescore.h"

namespace agora::learner_detail {
namespace {

// Verdicts of the network beside the intake's (rollout_intake.h).
constexpr const char* kUnassigned = "unassigned";
constexpr const char* kBadSignature = "bad_signature";

}  // namespace

void Learner::handle(const net::Incoming& in) {
  if (in.message.has_rl_hello()) return on_hello(in);
  const auto it = workers_.find(in.curve_key);
  if (it == workers_.end()) {
    obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", "unregistered"}}).inc();
    return;
  }
  Worker& w = it->second;
  if (!w.rate.take(options_.worker_messages_per_second, options_.worker_burst, now())) {
    obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", "rate_limited"}}).inc();
    return;
  }
  if (in.message.has_rl_get_policy()) return on_get_policy(in, w);
  if (in.message.has_rl_get_work()) return on_get_work(in, w);
  if (in.message.has_rl_rollout()) return on_rollout(in, w);
  obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", "unexpected"}}).inc();
}

void Learner::on_hello(const net::Incoming& in) {
  wire::Envelope e;
  auto* run = e.mutable_rl_run();
  const std::string& key = in.message.rl_hello().key();
  bool matches = false;
  if (key.size() == net::kKeyBytes) {
    try {
      matches = net::curve_public_of(key) == in.curve_key;
    } catch (const Error&) {
      matches = false;
    }
  }
  if (!matches) {
    run->set_refused("RlHello.key is not the ed25519 key this connection authenticated with");
  } else if (!workers_.count(in.curve_key) &&
             static_cast<int>(workers_.size()) >= options_.max_workers) {
    run->set_refused(fmt::format("the learner serves at most {} workers", options_.max_workers));
  } else {
    auto [it, fresh] = workers_.try_emplace(in.curve_key);
    Worker& w = it->second;
    if (fresh) {
      w.key = key;
      w.name = net::key_to_hex(key);
      w.joined_s = now();
      log_event({{"event", "rl_worker"},
                 {"worker", w.name},
                 {"state", "joined"},
                 {"agent", in.message.rl_hello().agent().substr(0, 200)}});
    }
    if (intake_.banned(w.name)) {
      run->set_refused(fmt::format("banned after {} strikes", intake_.strikes(w.name)));
    } else {
      run->set_run_id(options_.run_id);
      run->set_task(task_->name());
      run->set_task_seed(task_->seed());
      run->set_held_out_fraction(options_.task.held_out_fraction);
      run->set_max_digits(static_cast<uint32_t>(options_.task.max_digits));
      run->set_numbers(static_cast<uint32_t>(options_.task.numbers));
      run->set_group_size(static_cast<uint32_t>(options_.train.group_size));
      run->set_max_new_tokens(static_cast<uint32_t>(options_.train.max_new_tokens));
      run->set_temperature(options_.train.temperature);
      run->set_max_off_policy_steps(static_cast<uint64_t>(options_.train.max_off_policy_steps));
      run->set_base_hash(base_hash_);
      run->set_version(published_.version());
      run->set_state_hash(published_.state_hash());
    }
  }
  server_.send(in.route, e);
}

void Learner::on_get_policy(const net::Incoming& in, Worker& w) {
  if (intake_.banned(w.name)) return;
  const auto& ask = in.message.rl_get_policy();
  const uint64_t newest = published_.version();
  if (*in_flight_ > options_.max_policy_bytes_in_flight) {
    obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", "policy_busy"}}).inc();
    return;
  }
  const auto send = [&](const std::shared_ptr<const std::string>& bytes, const char* kind) {
    if (server_.send_shared(in.route, bytes, in_flight_) == net::Server::SendResult::kQueued) {
      obs::counter(metrics_, obs::metric::kRlPolicyBytes, {{"kind", kind}})
          .inc(static_cast<double>(bytes->size()));
    }
  };
  const bool chain = !ask.whole() && ask.have_version() < newest &&
                     deltas_.count(ask.have_version() + 1) > 0;
  if (chain) {
    for (uint64_t v = ask.have_version() + 1; v <= newest; ++v) send(deltas_.at(v), "delta");
    return;
  }
  if (!ask.whole() && ask.have_version() == newest) return;  // nothing newer
  if (!whole_) {
    wire::Envelope e;
    auto* p = e.mutable_rl_policy();
    p->set_from_version(0);
    p->set_to_version(newest);
    p->set_whole(true);
    p->set_payload(published_.whole());
    p->set_state_hash(published_.state_hash());
    whole_ = std::make_shared<const std::string>(net::encode_envelope(e));
  }
  send(whole_, "whole");
}

void Learner::on_get_work(const net::Incoming& in, Worker& w) {
  wire::Envelope e;
  auto* work = e.mutable_rl_work();
  work->set_version(published_.version());
  if (intake_.banned(w.name)) {
    work->set_refused(fmt::format("banned after {} strikes", intake_.strikes(w.name)));
  } else if (step_ >= options_.train.steps) {
    work->set_finished(true);
  } else {
    const uint32_t want = std::min<uint32_t>(in.message.rl_get_work().max_slots(), 1024u);
    for (const SlotId& s : pool_.hand_out(w.name, want, now())) {
      auto* slot = work->add_slots();
      slot->set_problem_id(s.problem);
      slot->set_sample(s.sample);
    }
    if (work->slots_size() == 0) work->set_retry_ms(200);
  }
  server_.send(in.route, e);
}

void Learner::receipt(const std::string& route, const Rollout* rollout, std::string_view verdict,
                      const std::string& reason, Worker& w) {
  const bool accepted = verdict == verdict_name(IntakeVerdict::kAccepted);
  (accepted ? w.accepted : w.refused) += 1;
  if (!accepted) ++refused_;
  ++receipts_[std::string(verdict)];
  obs::counter(metrics_, obs::metric::kRlRollouts, {{"verdict", std::string(verdict)}}).inc();
  wire::Envelope e;
  auto* r = e.mutable_rl_receipt();
  if (rollout) {
    r->set_problem_id(rollout->problem_id);
    r->set_sample(rollout->sample);
  }
  r->set_verdict(std::string(verdict));
  r->set_reason(reason.substr(0, 500));
  server_.send(route, e);
}

void Learner::on_rollout(const net::Incoming& in, Worker& w) {
  ++submitted_;
  ++rollouts_;
  const auto& m = in.message.rl_rollout();
  if (!net::verify_signature(w.key, rollout_signing_bytes(options_.run_id, m.rollout()),
                             m.signature())) {
    // The connection is authenticated, so a bad signature is the worker's own doing.
    intake_.strike(w.name, IntakeVerdict::kMalformed);
    receipt(in.route, nullptr, kBadSignature,
            "the signature is not the worker's over rollout_signing_bytes(run id, rollout)", w);
    if (intake_.banned(w.name)) pool_.forget(w.name);
    return;
  }
  RolloutIntake::Result r = intake_.submit(w.name, m.rollout());
  if (r.verdict != IntakeVerdict::kAccepted) {
    receipt(in.route, nullptr, verdict_name(r.verdict), r.reason, w);
    if (intake_.banned(w.name)) pool_.forget(w.name);
    return;
  }
  const SlotId slot{r.rollout->problem_id, r.rollout->sample};
  if (!pool_.held_by(w.name, slot)) {
    receipt(in.route, &*r.rollout, kUnassigned,
            fmt::format("slot (problem {}, sample {}) was not handed to this worker, or is filled",
                        slot.problem, slot.sample),
            w);
    return;
  }
  const bool check = options_.rescore_rate >= 1.0 ||
                     std::uniform_real_distribution<double>(0, 1)(rescore_draw_) <
                         options_.rescore_rate;
  if (check) {
    pending_.push_back({in.curve_key, in.route, std::move(*r.rollout)});
  } else {
    pool_.fill(slot);
    filled_.try_emplace(slot, w.name, *r.rollout);
    receipt(in.route, &*r.rollout, verdict_name(IntakeVerdict::kAccepted), "", w);
  }
}

void Learner::rescore_pending() {
  if (pending_.empty()) return;
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  std::map<uint64_t, std::vector<size_t>> by_version;
  for (size_t i = 0; i < pending.size(); ++i) {
    by_version[pending[i].rollout.policy_version].push_back(i);
  }
  std::map<uint64_t, std::vector<TokenId>> prompts;
  for (const Problem& p : problems_) prompts[p.id] = tokenizer_->encode(p.prompt);
  for (const auto& [version, members] : by_version) {
    std::vector<std::vector<TokenId>> rows;
    std::vector<const Rollout*> rollouts;
    std::vector<size_t> kept;
    for (size_t i : members) {
      Pending& p = pending[i];
      Worker& w = workers_.at(p.curve);
      const auto prompt = prompts.find(p.rollout.problem_id);
      if (!versions_.has(version) || prompt == prompts.end()) {
        // The step moved on while it waited: too old now, not the worker's fault.
        receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kStale),
                "the run moved past its step before it was checked", w);
        continue;
      }
      rows.push_back(prompt->second);
      rollouts.push_back(&p.rollout);
      kept.push_back(i);
    }
    if (kept.empty()) continue;
    const std::vector<double> gaps = rescore_gaps(versions_.model(version), eot_, rows, rollouts,
                                                  options_.train.temperature);
    for (size_t k = 0; k < kept.size(); ++k) {
      Pending& p = pending[kept[k]];
      Worker& w = workers_.at(p.curve);
      const SlotId slot{p.rollout.problem_id, p.rollout.sample};
      if (gaps[k] <= options_.train.rescore_tolerance) {
        pool_.fill(slot);
        filled_.try_emplace(slot, w.name, p.rollout);
        receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kAccepted), "", w);
      } else {
        intake_.strike(w.name, IntakeVerdict::kMismatch);
        pool_.release(w.name, slot);
        receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kMismatch),
                fmt::format("claimed log-probabilities differ from policy {}'s by up to {:.4g} "
                            "(tolerance {:g})",
                            version, gaps[k], options_.train.rescore_tolerance),
                w);
        if (intake_.banned(w.name)) {
          pool_.forget(w.name);
          log_event({{"event", "rl_worker"},
                     {"worker", w.name},
                     {"state", "banned"},
                     {"strikes", intake_.strikes(w.name)}});
        }
      }
    }
  }
}

}  // namespace agora::learner_detail
