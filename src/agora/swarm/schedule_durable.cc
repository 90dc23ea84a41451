// SwarmSchedule's durable state (schedule.h, "Durability"): what the coordinator saves before it
// answers, and how a restarted coordinator resumes from it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/swarm/schedule.h"

namespace agora {
namespace {

std::vector<std::string> hex_all(const std::vector<std::string>& raw) {
  std::vector<std::string> out;
  for (const std::string& r : raw) out.push_back(hex_encode(r));
  return out;
}

std::vector<std::string> unhex_all(const nlohmann::json& j, size_t size, const char* what) {
  const auto hex = j.get<std::vector<std::string>>();
  if (hex.size() != size) fail("the saved swarm has {} {} for {} stages", hex.size(), what, size);
  std::vector<std::string> out;
  for (const std::string& h : hex) out.push_back(hex_decode(h));
  return out;
}

}  // namespace

SwarmSchedule::Durable SwarmSchedule::durable(double now) const {
  nlohmann::json members = nlohmann::json::array();
  for (const auto& [key, m] : members_) {
    members.push_back({{"key", hex_encode(key)},
                       {"endpoint", m.endpoint},
                       {"stage", m.stage},
                       {"id", m.id},
                       {"micro_batches", m.micro_batches},
                       {"strikes", m.strikes}});
  }
  nlohmann::json banned = nlohmann::json::array();
  for (const std::string& key : banned_order_) banned.push_back(hex_encode(key));
  // Measured paces change with every poll: saved with the clock, not a reason to save.
  nlohmann::json paces = nlohmann::json::object();
  for (const auto& [key, m] : members_) paces[hex_encode(key)] = m.seconds_per_sample;
  nlohmann::json done = nlohmann::json::array();
  for (const auto& [j, loss] : done_) done.push_back({j, loss});
  nlohmann::json expected = nlohmann::json::array();
  for (const auto& keys : expected_) {
    nlohmann::json stage = nlohmann::json::array();
    for (const std::string& k : keys) stage.push_back(hex_encode(k));
    expected.push_back(stage);
  }
  Durable d;
  d.state = {{"stages", o_.stages},
             {"micro_batches", o_.micro_batches},
             {"phase", phase_name(phase_)},
             {"step", step_},
             {"epoch", epoch_},
             {"next_id", next_id_},
             {"members", members},
             {"done", done},
             {"expected", expected},
             {"completed_step", completed_step_},
             {"have_completed", have_completed_},
             {"stage_hash", hex_all(stage_hash_)},
             {"previous_hash", hex_all(previous_hash_)},
             {"step_losses", step_losses_},
             {"samples_done", samples_done_},
             {"retried", retried_},
             {"moves", moves_},
             {"lost", lost_},
             {"diverged", diverged_},
             {"restarts", restarts_},
             {"strikes", strikes_},
             {"bans", bans_},
             {"banned", banned}};
  // Times on the server's clock, which a restarted server continues from `now` (plus the time
  // it was down): -1 stays "not yet".
  d.clock = {{"now", now},
             {"started", started_},
             {"step_started", step_started_},
             {"last_rebalance", last_rebalance_},
             {"last_step_end", last_step_end_},
             {"finished_at", finished_at_},
             {"ideal_integral", ideal_integral_},
             {"ideal_at_step_end", ideal_at_step_end_},
             {"waiting_seconds", waiting_seconds_},
             {"paces", paces}};
  return d;
}

std::vector<SwarmSchedule::Contribution> SwarmSchedule::take_contributions() {
  std::vector<Contribution> out;
  out.swap(arrived_);
  return out;
}

std::vector<std::string> SwarmSchedule::member_keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, m] : members_) keys.push_back(key);
  return keys;
}

void SwarmSchedule::restore(const Durable& saved, const std::vector<Contribution>& rounds,
                            double now, double down_seconds) {
  const nlohmann::json& s = saved.state;
  const nlohmann::json& c = saved.clock;
  try {
    if (s.at("stages").get<int64_t>() != o_.stages ||
        s.at("micro_batches").get<int64_t>() != o_.micro_batches) {
      fail("the saved swarm has {} stages of {} micro-batches; this run has {} of {}",
           s.at("stages").get<int64_t>(), s.at("micro_batches").get<int64_t>(), o_.stages,
           o_.micro_batches);
    }
    const std::string phase = s.at("phase").get<std::string>();
    const SwarmPhase phases[] = {SwarmPhase::kWaiting, SwarmPhase::kTraining, SwarmPhase::kSyncing,
                                 SwarmPhase::kFinished};
    const auto it = std::find_if(std::begin(phases), std::end(phases),
                                 [&](SwarmPhase p) { return phase == phase_name(p); });
    if (it == std::end(phases)) fail("the saved swarm is in an unknown phase \"{}\"", phase);
    phase_ = *it;
    step_ = s.at("step").get<uint64_t>();
    epoch_ = s.at("epoch").get<uint64_t>();
    next_id_ = s.at("next_id").get<uint64_t>();
    const auto stages = static_cast<size_t>(o_.stages);
    members_.clear();
    for (const nlohmann::json& j : s.at("members")) {
      Member m;
      m.endpoint = j.at("endpoint").get<std::string>();
      m.stage = j.at("stage").get<int64_t>();
      if (m.stage < 0 || m.stage >= o_.stages) fail("a saved member serves stage {}", m.stage);
      m.id = j.at("id").get<uint64_t>();
      m.micro_batches = j.at("micro_batches").get<int64_t>();
      m.strikes = j.value("strikes", int64_t{0});
      const std::string hex = j.at("key").get<std::string>();
      const nlohmann::json& pace = c.at("paces").value(hex, nlohmann::json(0.0));
      m.seconds_per_sample = pace.is_number() ? pace.get<double>() : 0.0;
      m.last_heard = now;
      members_[hex_decode(hex)] = m;
    }
    done_.clear();
    for (const nlohmann::json& j : s.at("done")) {
      const auto mb = j.at(0).get<uint32_t>();
      if (mb >= o_.micro_batches) fail("a saved micro-batch {} is out of range", mb);
      done_[mb] = j.at(1).is_number() ? j.at(1).get<float>() : NAN;
    }
    pool_.clear();
    for (uint32_t j = 0; j < static_cast<uint32_t>(o_.micro_batches); ++j) {
      if (done_.count(j) == 0) pool_.push_back(j);
    }
    const nlohmann::json& expected = s.at("expected");
    if (expected.size() != stages)
      fail("the saved swarm awaits rounds of {} stages", expected.size());
    for (size_t i = 0; i < stages; ++i) {
      expected_[i].clear();
      for (const nlohmann::json& k : expected[i]) {
        const std::string key = hex_decode(k.get<std::string>());
        // One that was lost after the save will be lost again by the tick.
        if (members_.count(key) != 0) expected_[i].insert(key);
      }
    }
    completed_step_ = s.at("completed_step").get<uint64_t>();
    have_completed_ = s.at("have_completed").get<bool>();
    stage_hash_ = unhex_all(s.at("stage_hash"), stages, "stage hashes");
    previous_hash_ = unhex_all(s.at("previous_hash"), stages, "previous hashes");
    step_losses_.clear();
    for (const nlohmann::json& l : s.at("step_losses")) {
      step_losses_.push_back(l.is_number() ? l.get<double>() : NAN);  // NaN is saved as null
    }
    samples_done_ = s.at("samples_done").get<int64_t>();
    retried_ = s.at("retried").get<int64_t>();
    moves_ = s.at("moves").get<int64_t>();
    lost_ = s.at("lost").get<int64_t>();
    diverged_ = s.at("diverged").get<int64_t>();
    restarts_ = s.at("restarts").get<int64_t>() + 1;
    strikes_ = s.value("strikes", int64_t{0});
    bans_ = s.value("bans", int64_t{0});
    banned_.clear();
    banned_order_.clear();
    for (const nlohmann::json& k : s.value("banned", nlohmann::json::array())) {
      const std::string key = hex_decode(k.get<std::string>());
      if (banned_.insert(key).second) banned_order_.push_back(key);
    }
    // The server's member table starts empty after a restart: it bans these again.
    newly_banned_.assign(banned_order_.begin(), banned_order_.end());
    const auto at = [&](const char* name) { return c.at(name).get<double>(); };
    started_ = at("started");
    step_started_ = at("step_started");
    last_rebalance_ = at("last_rebalance");
    last_step_end_ = at("last_step_end");
    finished_at_ = at("finished_at");
    last_account_ = now;
    ideal_integral_ = c.at("ideal_integral").get<double>();
    ideal_at_step_end_ = c.at("ideal_at_step_end").get<double>();
    waiting_seconds_ = c.at("waiting_seconds").get<double>() + (started_ >= 0 ? down_seconds : 0);
  } catch (const nlohmann::json::exception& e) {
    fail("the saved swarm state is not one this agora wrote ({})", e.what());
  }
  for (size_t i = 0; i < contributions_.size(); ++i) {
    contributions_[i].clear();
    completed_[i].clear();
  }
  for (const Contribution& r : rounds) {
    if (r.stage < 0 || r.stage >= o_.stages) fail("a saved contribution is for stage {}", r.stage);
    const auto stage = static_cast<size_t>(r.stage);
    if (phase_ == SwarmPhase::kSyncing && r.step == step_) {
      contributions_[stage].emplace(r.key, r.payload);
    } else if (have_completed_ && r.step == completed_step_) {
      completed_[stage].emplace_back(r.key, r.payload);
    }
  }
  for (auto& round : completed_) std::sort(round.begin(), round.end());  // by key, as finished
  sync_started_ = now;  // the round deadline starts again with the new process
  round_delays_.clear();
  arrived_.clear();
  event({{"event", "swarm_restored"},
         {"step", step_},
         {"phase", phase_name(phase_)},
         {"members", members_.size()},
         {"done", done_.size()},
         {"down_seconds", down_seconds},
         {"restarts", restarts_}});
}

}  // namespace agora
