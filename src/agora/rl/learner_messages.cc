// What each message from a rollout worker does to the learner (learner_server.h).
#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/rl/learner_detail.h"
#include "agora/rl/rescore.h"
#include "agora/rl/seeded_draw.h"

namespace agora::learner_detail {
namespace {

// Verdicts of the network beside the intake's (rollout_intake.h).
constexpr const char* kUnassigned = "unassigned";
constexpr const char* kBadSignature = "bad_signature";

}  // namespace

void Learner::handle(const net::Incoming& in) {
  const auto dropped = [&](const char* reason) {
    obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", reason}}).inc();
  };
  const auto admitted = workers_.admit(in.curve_key, now());
  if (admitted.standing == serve::Standing::kThrottled) return dropped("rate_limited");
  if (in.message.has_rl_hello()) return on_hello(in);
  if (admitted.standing == serve::Standing::kStranger) {
    dropped("unregistered");
    server_.send(in.route, serve::refusal(serve::kNotAMember, /*may_rejoin=*/true));
    return;
  }
  Worker& w = *admitted.member;  // a banned one too: the intake answers with its ban
  if (in.message.has_get_params()) return on_get_params(in, w);
  if (in.message.has_rl_get_work()) return on_get_work(in, w);
  if (in.message.has_rl_rollout()) return on_rollout(in, w);
  dropped("unexpected");
}

namespace {

// The agent string as it goes to the logs: printable ASCII, at most kMaxAgentBytes.
std::string printable(const std::string& text) {
  std::string out = text.substr(0, kMaxAgentBytes);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

}  // namespace

void Learner::on_hello(const net::Incoming& in) {
  wire::Envelope e;
  auto* run = e.mutable_rl_run();
  const serve::Members<WorkerState>::Joined joined =
      workers_.join(in.curve_key, in.message.rl_hello().key(), now());
  if (!joined.member) {
    run->set_refused(joined.refused);
  } else {
    Worker& w = *joined.member;
    if (joined.fresh) {
      log_event({{"event", "rl_worker"},
                 {"worker", w.name},
                 {"state", "joined"},
                 {"agent", printable(in.message.rl_hello().agent())}});
    } else {
      pool_.forget(w.name);  // a restarted worker: what it held is lost
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
      run->set_steps(static_cast<uint64_t>(options_.train.steps));
    }
  }
  server_.send(in.route, e);
}

void Learner::on_get_params(const net::Incoming& in, Worker& w) {
  if (intake_.banned(w.name)) return;
  int64_t queued = 0;
  for (const auto& [curve, other] : workers_) queued += other.in_flight->load();
  const serve::ParamFeed::Answer sent =
      feed_.answer(server_, in.route, in.message.get_params(), w.in_flight, queued);
  if (sent.busy) {
    obs::counter(metrics_, obs::metric::kRlMessagesDropped, {{"reason", "policy_busy"}}).inc();
  }
  if (sent.delta_bytes > 0) {
    obs::counter(metrics_, obs::metric::kRlPolicyBytes, {{"kind", "delta"}})
        .inc(static_cast<double>(sent.delta_bytes));
  }
  if (sent.whole_bytes > 0) {
    obs::counter(metrics_, obs::metric::kRlPolicyBytes, {{"kind", "whole"}})
        .inc(static_cast<double>(sent.whole_bytes));
  }
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
  if (intake_.banned(w.name) && !w.ban_logged) {
    w.ban_logged = true;
    workers_.ban(w);
    pool_.forget(w.name);
    log_event({{"event", "rl_worker"},
               {"worker", w.name},
               {"state", "banned"},
               {"strikes", intake_.strikes(w.name)}});
  }
}

void Learner::on_rollout(const net::Incoming& in, Worker& w) {
  ++submitted_;
  ++rollouts_;
  const auto& m = in.message.rl_rollout();
  // Cheap refusals first: a banned worker's flood costs no signature check.
  if (intake_.banned(w.name)) {
    receipt(in.route, nullptr, verdict_name(IntakeVerdict::kBanned), "this worker is banned", w);
    return;
  }
  if (!net::verify_signature(w.key, rollout_signing_bytes(options_.run_id, m.rollout()),
                             m.signature())) {
    // The connection is authenticated, so a bad signature is the worker's own doing.
    intake_.strike(w.name, IntakeVerdict::kMalformed);
    receipt(in.route, nullptr, kBadSignature,
            "the signature is not the worker's over rollout_signing_bytes(run id, rollout)", w);
    return;
  }
  RolloutIntake::Result r = intake_.submit(w.name, m.rollout());
  if (r.verdict != IntakeVerdict::kAccepted) {
    receipt(in.route, nullptr, verdict_name(r.verdict), r.reason, w);
    return;
  }
  const SlotId slot{r.rollout->problem_id, r.rollout->sample};
  if (pool_.held_by(w.name, slot)) pool_.answered(w.name, slot);  // the intake recorded it
  if (!pool_.held_by(w.name, slot)) {
    receipt(in.route, &*r.rollout, kUnassigned,
            fmt::format("slot (problem {}, sample {}) was not handed to this worker, or is filled",
                        slot.problem, slot.sample),
            w);
    return;
  }
  // Re-scoring's forward pass needs prompt and completion within the model's context.
  const auto prompt = prompts_.find(slot.problem);
  if (prompt == prompts_.end() || 1 + prompt->second.size() + r.rollout->tokens.size() >
                                      static_cast<size_t>(live_->config().max_seq_len)) {
    intake_.strike(w.name, IntakeVerdict::kMalformed);
    pool_.release(w.name, slot);
    receipt(in.route, &*r.rollout, verdict_name(IntakeVerdict::kMalformed),
            fmt::format("{} completion tokens do not fit the model's context after the prompt",
                        r.rollout->tokens.size()),
            w);
    return;
  }
  const bool check = options_.rescore_rate >= 1.0 || std::uniform_real_distribution<double>(0, 1)(
                                                         rescore_draw_) < options_.rescore_rate;
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
  std::map<uint64_t, std::vector<Pending>> by_version;
  for (Pending& p : pending_) by_version[p.rollout.policy_version].push_back(std::move(p));
  pending_.clear();
  for (auto& [version, all] : by_version) {
    for (size_t from = 0; from < all.size(); from += kRescoreBatch) {
      std::vector<Pending> batch(
          std::make_move_iterator(all.begin() + from),
          std::make_move_iterator(all.begin() + std::min(all.size(), from + kRescoreBatch)));
      rescore(version, batch);
    }
  }
}

void Learner::rescore(uint64_t version, std::vector<Pending>& batch) {
  std::vector<std::vector<TokenId>> rows;
  std::vector<const Rollout*> rollouts;
  std::vector<Pending*> kept;
  for (Pending& p : batch) {
    Worker* w = workers_.find(p.curve);
    if (!w) continue;  // forgotten meanwhile
    const auto prompt = prompts_.find(p.rollout.problem_id);
    if (!versions_.has(version) || prompt == prompts_.end()) {
      // The step moved on while it waited: too old now, not the worker's fault.
      receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kStale),
              "the run moved past its step before it was checked", *w);
      continue;
    }
    rows.push_back(prompt->second);
    rollouts.push_back(&p.rollout);
    kept.push_back(&p);
  }
  if (kept.empty()) return;
  std::vector<uint64_t> seeds;
  for (const Rollout* r : rollouts)
    seeds.push_back(slot_seed(options_.run_id, r->problem_id, r->sample));
  std::vector<double> gaps, draw_gaps;
  try {
    gaps = rescore_gaps(versions_.model(version), eot_, rows, rollouts, options_.train.temperature,
                        &seeds, &draw_gaps);
  } catch (const std::exception& e) {
    // The learner's own failure (the checks above let through only what fits): nobody's fault,
    // so nobody is struck, and the slots go back to the pool.
    log_event({{"event", "rl_rescore_error"}, {"error", std::string(e.what()).substr(0, 500)}});
    for (Pending* p : kept) {
      Worker& w = workers_.at(p->curve);
      pool_.release(w.name, {p->rollout.problem_id, p->rollout.sample});
      receipt(p->route, &p->rollout, "error", "the learner could not re-score it", w);
    }
    return;
  }
  for (size_t k = 0; k < kept.size(); ++k) {
    Pending& p = *kept[k];
    Worker& w = workers_.at(p.curve);
    const SlotId slot{p.rollout.problem_id, p.rollout.sample};
    if (gaps[k] > options_.train.rescore_tolerance) {
      intake_.strike(w.name, IntakeVerdict::kMismatch);
      pool_.release(w.name, slot);
      receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kMismatch),
              fmt::format("claimed log-probabilities differ from policy {}'s by up to {:.4g} "
                          "(tolerance {:g})",
                          version, gaps[k], options_.train.rescore_tolerance),
              w);
    } else if (draw_gaps[k] > options_.train.draw_tolerance) {
      intake_.strike(w.name, IntakeVerdict::kMismatch);
      pool_.release(w.name, slot);
      receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kMismatch),
              fmt::format("its tokens are not the ones the slot's seed draws from policy {} (a "
                          "draw lies {:.4g} outside its token's interval; tolerance {:g})",
                          version, draw_gaps[k], options_.train.draw_tolerance),
              w);
    } else if (!pool_.held_by(w.name, slot)) {
      // Another holder of the slot filled it first (this one was handed it after a timeout).
      receipt(p.route, &p.rollout, kUnassigned, "the slot was filled meanwhile", w);
    } else {
      pool_.fill(slot);
      filled_.try_emplace(slot, w.name, p.rollout);
      receipt(p.route, &p.rollout, verdict_name(IntakeVerdict::kAccepted), "", w);
    }
  }
}

void Learner::evict_idle() {
  workers_.evict_idle(now(), [this](Worker& w) {
    if (*w.in_flight != 0) return false;
    pool_.forget(w.name);
    log_event({{"event", "rl_worker"}, {"worker", w.name}, {"state", "left"}});
    return true;
  });
}

}  // namespace agora::learner_detail
