#include "agora/swarm/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/pipeline/partition.h"
#include "agora/swarm/balance.h"

namespace agora {
namespace {

std::string short_hex(const std::string& key) {
  return hex_encode(key).substr(0, 8);
}

}  // namespace

std::vector<double> swarm_stage_costs(const ModelConfig& model, int64_t stages) {
  std::vector<double> costs;
  double sum = 0;
  for (const StageSpan& span : partition_model(model, stages)) {
    costs.push_back(static_cast<double>(span.layers() * layer_parameters(model) +
                                        (span.head ? head_parameters(model) : 0)));
    sum += costs.back();
  }
  for (double& c : costs) c *= static_cast<double>(costs.size()) / sum;
  return costs;
}

const char* phase_name(SwarmPhase phase) {
  switch (phase) {
    case SwarmPhase::kWaiting:
      return "waiting";
    case SwarmPhase::kTraining:
      return "training";
    case SwarmPhase::kSyncing:
      return "syncing";
    case SwarmPhase::kFinished:
      return "finished";
  }
  return "?";
}

SwarmSchedule::SwarmSchedule(SwarmScheduleOptions options) : o_(std::move(options)) {
  if (o_.stages < 1) fail("swarm: {} stages, allowed >= 1", o_.stages);
  if (o_.steps < 1) fail("swarm: {} steps, allowed >= 1", o_.steps);
  if (o_.micro_batches < 1 || o_.micro_batches > 65536) {
    fail("swarm: {} micro-batches per step, allowed 1 to 65536", o_.micro_batches);
  }
  if (o_.micro_batch_size < 1)
    fail("swarm: micro_batch_size {}, allowed >= 1", o_.micro_batch_size);
  if (o_.costs.empty()) o_.costs.assign(static_cast<size_t>(o_.stages), 1.0);
  if (static_cast<int64_t>(o_.costs.size()) != o_.stages) {
    fail("swarm: {} stage costs for {} stages", o_.costs.size(), o_.stages);
  }
  if (!(o_.peer_timeout > 0)) fail("swarm: peer timeout {} s, allowed > 0", o_.peer_timeout);
  if (!(o_.rebalance_seconds >= 0)) {
    fail("swarm: rebalance period {} s, allowed >= 0 (0: never)", o_.rebalance_seconds);
  }
  if (o_.max_members < 1 || o_.max_hold < 1 || o_.start_peers < 1) {
    fail("swarm: max_members, max_hold and start_peers must be >= 1");
  }
  if (!(o_.min_deadline > 0) || !std::isfinite(o_.min_deadline)) {
    fail("swarm: min_deadline {} s, allowed > 0", o_.min_deadline);
  }
  if (!(o_.deadline_factor >= 1) || !std::isfinite(o_.deadline_factor)) {
    fail("swarm: deadline_factor {}, allowed >= 1", o_.deadline_factor);
  }
  if (o_.max_strikes < 1) fail("swarm: max_strikes {}, allowed >= 1", o_.max_strikes);
  expected_.resize(static_cast<size_t>(o_.stages));
  contributions_.resize(static_cast<size_t>(o_.stages));
  completed_.resize(static_cast<size_t>(o_.stages));
  stage_hash_.resize(static_cast<size_t>(o_.stages));
  previous_hash_.resize(static_cast<size_t>(o_.stages));
  for (uint32_t j = 0; j < static_cast<uint32_t>(o_.micro_batches); ++j) pool_.push_back(j);
  waiting_for_ = fmt::format("{} ready peers with every stage served", o_.start_peers);
}

bool SwarmSchedule::ready_at(const Member& m, uint64_t version) const {
  return m.ready && m.version == version;
}

// Ready at the step, or holding the step before with the round that brings it there.
bool SwarmSchedule::serves(const Member& m, int64_t stage) const {
  if (m.stage != stage || !m.ready) return false;
  return m.version == step_ || gets_round(m);
}

// One step behind, at the hash its stage had there: the last round brings it to the step.
bool SwarmSchedule::gets_round(const Member& m) const {
  if (!have_completed_ || completed_step_ + 1 != step_ || m.version != completed_step_) {
    return false;
  }
  const std::string& before = previous_hash_[static_cast<size_t>(m.stage)];
  return m.ready && (before.empty() || m.hash == before);
}

SwarmAnswer SwarmSchedule::hello(const std::string& key, const std::string& endpoint, int64_t stage,
                                 double now) {
  SwarmAnswer answer;
  answer.step = step_;
  answer.phase = phase_;
  if (stage >= o_.stages || stage < -1) {
    answer.refused =
        fmt::format("stage {} does not exist (allowed: 0 to {}, or -1: any)", stage, o_.stages - 1);
    return answer;
  }
  if (endpoint.empty() || endpoint.size() > 256 || endpoint.rfind("tcp://", 0) != 0) {
    answer.refused =
        fmt::format("endpoint \"{}\" is not one replicas can dial (allowed: tcp://HOST:PORT)",
                    endpoint.substr(0, 64));
    return answer;
  }
  if (banned(key)) {
    answer.refused = fmt::format(
        "this key is banned from the run ({} strikes: it held work or a round past its deadline, "
        "or sent contributions that are not its stage's)",
        o_.max_strikes);
    return answer;
  }
  if (const auto it = members_.find(key); it != members_.end()) {
    Member& known = it->second;
    if (now - known.hello_at < o_.peer_timeout) {
      // Again within a peer timeout of its last hello: an answer that was lost, never a restart
      // (no process restarts that fast). Taken as a restart, hellos at the rate limit would each
      // lose the member, bump the epoch (stage 0 sends again all it has in flight) and log a
      // loss and a join.
      if (known.endpoint != endpoint || (stage >= 0 && stage != known.stage)) {
        answer.refused = fmt::format(
            "hello again within {:g} s of the last, with another endpoint or stage (allowed: the "
            "same endpoint and stage, or another after {:g} s)",
            o_.peer_timeout, o_.peer_timeout);
        return answer;
      }
      known.hello_at = now;
      SwarmReport again;
      again.stage = known.stage;
      return poll(key, again, now);
    }
    lose(key, "restarted", now);
  }
  if (static_cast<int64_t>(members_.size()) >= o_.max_members) {
    answer.refused = fmt::format("the swarm is full ({} members)", o_.max_members);
    return answer;
  }
  if (stage < 0) {
    std::vector<StagePeer> peers;
    for (const auto& [k, m] : members_) peers.push_back({m.id, m.stage, m.seconds_per_sample});
    stage = stage_for_joiner(peers, o_.costs);
  }
  Member m;
  m.endpoint = endpoint;
  m.stage = stage;
  m.last_heard = m.hello_at = now;
  m.id = next_id_++;
  members_[key] = m;
  event({{"event", "swarm_join"}, {"peer", short_hex(key)}, {"stage", stage}, {"step", step_}});
  SwarmReport first;
  first.stage = stage;
  return poll(key, first, now);
}

SwarmAnswer SwarmSchedule::poll(const std::string& key, const SwarmReport& report, double now) {
  SwarmAnswer a;
  a.step = step_;
  a.phase = phase_;
  a.epoch = epoch_;
  const auto it = members_.find(key);
  if (it == members_.end()) {
    a.refused = kNotAMember;
    return a;
  }
  Member& m = it->second;
  m.last_heard = now;
  const bool holds = report.stage == m.stage;
  if (holds && report.seconds_per_sample > 0 && std::isfinite(report.seconds_per_sample) &&
      report.seconds_per_sample < 1e6) {
    m.seconds_per_sample = report.seconds_per_sample;
  }
  m.version = report.version;
  m.hash = report.state_hash;
  m.ready = holds && report.ready && m.hash.size() == 32;
  if (m.ready) refresh_hash(m.stage);

  if ((phase_ == SwarmPhase::kTraining || phase_ == SwarmPhase::kSyncing) &&
      report.version == step_ && ready_at(m, step_)) {
    for (const std::string& k : report.dropped) {
      const auto named = members_.find(k);
      if (named != members_.end() && named->second.stage == m.stage + 1) {
        dropped_by_[k].insert(key);
      }
    }
  }
  if (phase_ == SwarmPhase::kTraining && m.stage == 0 && ready_at(m, step_)) {
    for (const auto& [j, loss] : report.done) {
      const auto held = m.holding.find(j);
      if (held == m.holding.end()) continue;  // not given to it, taken back, or already done
      m.latencies.push_back(now - held->second);
      if (m.latencies.size() > kDeadlineWindow) m.latencies.pop_front();
      m.holding.erase(held);
      m.progress_at = now;
      done_[j] = std::isfinite(loss) ? loss : std::numeric_limits<float>::quiet_NaN();
      ++m.micro_batches;
      samples_done_ += o_.micro_batch_size;
    }
    retried_ += std::clamp<int64_t>(report.retried, 0, o_.micro_batches);
    const int64_t room = o_.max_hold - static_cast<int64_t>(m.holding.size());
    const int64_t give = std::min<int64_t>(
        {std::max<int64_t>(report.wants, 0), room, static_cast<int64_t>(pool_.size())});
    if (m.holding.empty() && give > 0) m.progress_at = now;
    for (int64_t i = 0; i < give; ++i) {
      a.micro_batches.push_back(pool_.front());
      m.holding.emplace(pool_.front(), now);
      pool_.erase(pool_.begin());
    }
    if (static_cast<int64_t>(done_.size()) == o_.micro_batches) start_sync(now);
  }
  if (phase_ == SwarmPhase::kSyncing && report.payload && ready_at(m, step_)) {
    auto& expected = expected_[static_cast<size_t>(m.stage)];
    // A stage whose every replica died takes the first that is ready at the step again.
    if (expected.empty() && contributions_[static_cast<size_t>(m.stage)].empty()) {
      expected.insert(key);
    }
    auto& round = contributions_[static_cast<size_t>(m.stage)];
    if (expected.count(key) != 0 && round.count(key) == 0) {
      const std::string refused =
          o_.check_contribution ? o_.check_contribution(m.stage, step_, *report.payload) : "";
      if (!refused.empty()) {
        expected.erase(key);  // one try per round: it leaves the round
        strike(key, "contribution refused: " + refused, now);
        if (members_.count(key) == 0) {
          a.refused = fmt::format("this key is banned from the run ({} strikes)", o_.max_strikes);
          return a;
        }
      } else {
        round.emplace(key, *report.payload);
        round_delays_.push_back(now - sync_started_);
        arrived_.push_back({step_, m.stage, key, *report.payload});
        if (rounds_complete()) finish_step(now);
      }
    }
  }

  a.step = step_;
  a.phase = phase_;
  a.epoch = epoch_;
  a.stage = m.stage;
  a.waiting_for = phase_ == SwarmPhase::kWaiting ? waiting_for_ : "";
  for (const auto& [k, other] : members_) {
    // Replicas about to apply the round that brings them to the step count: they keep what
    // arrives for the step until they are there.
    if (phase_ == SwarmPhase::kTraining && serves(other, m.stage + 1)) {
      a.next.push_back({k, other.endpoint, other.stage});
    }
    if (other.stage == m.stage - 1) a.prev.push_back({k, other.endpoint, other.stage});
    if (other.stage == m.stage && k != key) a.peers.push_back({k, other.endpoint, other.stage});
  }
  // The round goes into one answer a second per member at most: a member that polls at its
  // rate limit and never reads would otherwise have a copy queued for it with every answer.
  if (gets_round(m) && (m.round_sent_for != completed_step_ + 1 || now - m.round_sent_at >= 1.0)) {
    a.round_step = completed_step_;
    a.round = completed_[static_cast<size_t>(m.stage)];
    m.round_sent_for = completed_step_ + 1;
    m.round_sent_at = now;
  }
  a.stage_hash = stage_hash_[static_cast<size_t>(m.stage)];
  a.previous_hash = previous_hash_[static_cast<size_t>(m.stage)];
  if (!ready_at(m, step_) && !gets_round(m) && phase_ != SwarmPhase::kFinished) {
    std::vector<const std::pair<const std::string, Member>*> sources;
    for (const auto& entry : members_) {
      if (entry.first != key && entry.second.stage == m.stage && ready_at(entry.second, step_) &&
          entry.second.hash == a.stage_hash) {
        sources.push_back(&entry);
      }
    }
    if (!sources.empty()) {
      const auto* s = sources[m.id % sources.size()];
      a.source = SwarmPeerRef{s->first, s->second.endpoint, s->second.stage};
    }
  }
  return a;
}

void SwarmSchedule::refresh_hash(int64_t stage) {
  // Replicas about to apply the round that brings them to the step have a vote to come: a
  // majority counts them, so the first replica to report cannot decide for the rest.
  std::map<std::string, int> votes;
  int total = 0;
  for (const auto& [k, m] : members_) {
    if (m.stage != stage) continue;
    if (ready_at(m, step_)) ++votes[m.hash];
    if (ready_at(m, step_) || gets_round(m)) ++total;
  }
  if (votes.empty()) return;
  auto best = votes.begin();
  for (auto v = votes.begin(); v != votes.end(); ++v) {
    if (v->second > best->second) best = v;
  }
  if (2 * best->second <= total) {
    // No strict majority (a tie): the stage has no hash at the step. Nobody is outvoted and no
    // joiner is sent to either side, so one member cannot replace another's parameters.
    stage_hash_[static_cast<size_t>(stage)].clear();
    return;
  }
  stage_hash_[static_cast<size_t>(stage)] = best->first;
  for (auto& [k, m] : members_) {
    if (m.stage == stage && ready_at(m, step_) && m.hash != best->first) {
      m.ready = false;
      expected_[static_cast<size_t>(stage)].erase(k);  // it will not contribute at this step
      ++diverged_;
      event({{"event", "swarm_diverged"},
             {"peer", short_hex(k)},
             {"stage", stage},
             {"step", step_},
             {"hash", hex_encode(m.hash)},
             {"majority", hex_encode(best->first)}});
    }
  }
}

void SwarmSchedule::lose(const std::string& key, const char* why, double now) {
  const auto it = members_.find(key);
  if (it == members_.end()) return;
  Member& m = it->second;
  for (const auto& [j, given] : m.holding) {
    pool_.insert(std::lower_bound(pool_.begin(), pool_.end(), j), j);
  }
  for (auto& expected : expected_) expected.erase(key);
  dropped_by_.erase(key);  // a crash or a restart loses work without dropping it
  event({{"event", "swarm_lost"},
         {"peer", short_hex(key)},
         {"stage", m.stage},
         {"why", why},
         {"step", step_},
         {"gave_back", m.holding.size()},
         {"at", now - std::max(0.0, started_)}});
  members_.erase(it);
  ++epoch_;
  ++lost_;
}

void SwarmSchedule::tick(double now) {
  if (phase_ == SwarmPhase::kFinished) return;  // peers leave once told: nothing is lost
  std::vector<std::string> silent;
  for (const auto& [k, m] : members_) {
    if (now - m.last_heard > o_.peer_timeout) silent.push_back(k);
  }
  for (const std::string& k : silent) lose(k, "silent", now);
  enforce_deadlines(now);
  advance(now);
}

void SwarmSchedule::advance(double now) {
  account(now);
  if (phase_ == SwarmPhase::kFinished) return;
  if (phase_ == SwarmPhase::kSyncing) {
    if (rounds_complete()) finish_step(now);
    return;
  }
  int64_t unserved = -1;
  for (int64_t s = 0; s < o_.stages && unserved < 0; ++s) {
    bool any = false;
    for (const auto& [k, m] : members_) any = any || serves(m, s);
    if (!any) unserved = s;
  }
  if (unserved >= 0) {
    const std::string why = fmt::format("stage {} has no replica holding step {}", unserved, step_);
    if (phase_ == SwarmPhase::kTraining || why != waiting_for_) {
      if (started_ >= 0) {
        event({{"event", "swarm_waiting"}, {"stage", unserved}, {"step", step_}, {"why", why}});
      }
    }
    phase_ = SwarmPhase::kWaiting;
    waiting_for_ = why;
    return;
  }
  if (phase_ == SwarmPhase::kWaiting) {
    if (started_ < 0) {
      int64_t ready = 0;
      for (const auto& [k, m] : members_) ready += ready_at(m, step_) ? 1 : 0;
      if (ready < o_.start_peers) return;
      started_ = step_started_ = last_account_ = last_rebalance_ = now;
      event({{"event", "swarm_start"}, {"peers", members_.size()}, {"step", step_}});
    } else {
      event({{"event", "swarm_resumed"}, {"step", step_}});
      // Nothing could finish while a stage had no replica: the hold deadlines start again.
      for (auto& [k, m] : members_) {
        for (auto& [j, given] : m.holding) given = now;
        m.progress_at = now;
      }
    }
    phase_ = SwarmPhase::kTraining;
    waiting_for_.clear();
  }
}

void SwarmSchedule::start_sync(double now) {
  phase_ = SwarmPhase::kSyncing;
  sync_started_ = now;
  round_delays_.clear();
  for (int64_t s = 0; s < o_.stages; ++s) {
    auto& expected = expected_[static_cast<size_t>(s)];
    expected.clear();
    contributions_[static_cast<size_t>(s)].clear();
    for (const auto& [k, m] : members_) {
      if (m.stage == s && ready_at(m, step_)) expected.insert(k);
    }
  }
}

bool SwarmSchedule::rounds_complete() const {
  for (size_t s = 0; s < expected_.size(); ++s) {
    if (contributions_[s].empty()) return false;
    for (const std::string& k : expected_[s]) {
      if (contributions_[s].count(k) == 0) return false;
    }
  }
  return true;
}

void SwarmSchedule::finish_step(double now) {
  judge_drops(now);
  if (!round_delays_.empty()) {
    past_round_delays_.push_back(lower_median(round_delays_));
    if (past_round_delays_.size() > kDeadlineWindow) past_round_delays_.pop_front();
  }
  for (size_t s = 0; s < completed_.size(); ++s) {
    completed_[s].assign(contributions_[s].begin(), contributions_[s].end());
    contributions_[s].clear();
    expected_[s].clear();
  }
  completed_step_ = step_;
  have_completed_ = true;
  double loss = 0;
  for (const auto& [j, l] : done_) loss += l;
  loss /= static_cast<double>(std::max<size_t>(1, done_.size()));
  step_losses_.push_back(loss);
  const std::vector<double> throughput = throughputs();
  nlohmann::json contributors = nlohmann::json::array();
  for (const auto& round : completed_) contributors.push_back(round.size());
  event({{"event", "swarm_step"},
         {"step", step_},
         {"loss", loss},
         {"seconds", now - step_started_},
         {"elapsed", now - started_},
         {"samples", samples_done_},
         {"bottleneck", *std::min_element(throughput.begin(), throughput.end())},
         {"contributors", contributors},
         {"retried", retried_},
         {"epoch", epoch_}});
  ++step_;
  done_.clear();
  pool_.clear();
  for (uint32_t j = 0; j < static_cast<uint32_t>(o_.micro_batches); ++j) pool_.push_back(j);
  for (auto& [k, m] : members_) m.holding.clear();
  previous_hash_ = stage_hash_;
  for (auto& h : stage_hash_) h.clear();
  step_started_ = now;
  account(now);
  last_step_end_ = now;
  ideal_at_step_end_ = ideal_integral_;
  if (static_cast<int64_t>(step_) >= o_.steps) {
    account(now);
    phase_ = SwarmPhase::kFinished;
    finished_at_ = now;
    event(summary(now));
    return;
  }
  phase_ = SwarmPhase::kTraining;
  rebalance(now);
}

void SwarmSchedule::rebalance(double now) {
  if (o_.rebalance_seconds <= 0 || now - last_rebalance_ < o_.rebalance_seconds) return;
  last_rebalance_ = now;
  std::vector<StagePeer> peers;
  for (const auto& [k, m] : members_) {
    if (serves(m, m.stage)) peers.push_back({m.id, m.stage, m.seconds_per_sample});
  }
  const std::optional<StageMove> move = plan_move(peers, o_.costs, o_.min_gain);
  if (!move) return;
  for (auto& [k, m] : members_) {
    if (m.id != move->peer) continue;
    m.seconds_per_sample *=
        o_.costs[static_cast<size_t>(move->to)] / o_.costs[static_cast<size_t>(move->from)];
    m.stage = move->to;
    m.ready = false;
    ++moves_;
    event({{"event", "swarm_move"},
           {"peer", short_hex(k)},
           {"from", move->from},
           {"to", move->to},
           {"step", step_},
           {"bottleneck_before", move->bottleneck_before},
           {"bottleneck_after", move->bottleneck_after}});
  }
}

std::vector<double> SwarmSchedule::throughputs() const {
  std::vector<StagePeer> peers;
  for (const auto& [k, m] : members_) {
    if (serves(m, m.stage)) peers.push_back({m.id, m.stage, m.seconds_per_sample});
  }
  return stage_throughputs(peers, o_.costs);
}

void SwarmSchedule::account(double now) {
  if (started_ < 0 || finished_at_ >= 0) return;
  const double dt = std::max(0.0, now - last_account_);
  last_account_ = now;
  if (dt <= 0) return;
  const std::vector<double> t = throughputs();
  ideal_integral_ += *std::min_element(t.begin(), t.end()) * dt;
  if (phase_ == SwarmPhase::kWaiting) waiting_seconds_ += dt;
}

std::vector<nlohmann::json> SwarmSchedule::take_events() {
  std::vector<nlohmann::json> out;
  out.swap(events_);
  return out;
}

nlohmann::json SwarmSchedule::status(double now) const {
  nlohmann::json stages = nlohmann::json::array();
  const std::vector<double> t = throughputs();
  for (int64_t s = 0; s < o_.stages; ++s) {
    nlohmann::json replicas = nlohmann::json::array();
    int64_t serving = 0;
    for (const auto& [k, m] : members_) {
      if (m.stage != s) continue;
      serving += serves(m, s) ? 1 : 0;
      replicas.push_back({{"peer", short_hex(k)},
                          {"endpoint", m.endpoint},
                          {"state", serves(m, s) ? "serving" : "loading"},
                          {"version", m.version},
                          {"seconds_per_sample", m.seconds_per_sample},
                          {"holding", m.holding.size()},
                          {"micro_batches", m.micro_batches}});
    }
    stages.push_back({{"stage", s},
                      {"state", serving > 0 ? "serving" : "no replica"},
                      {"throughput", t[static_cast<size_t>(s)]},
                      {"cost", o_.costs[static_cast<size_t>(s)]},
                      {"replicas", replicas}});
  }
  nlohmann::json out = summary(now);
  out["event"] = "swarm_status";
  out["phase"] = phase_name(phase_);
  out["waiting_for"] = phase_ == SwarmPhase::kWaiting ? waiting_for_ : "";
  out["stages"] = stages;
  out["pool"] = pool_.size();
  out["done"] = done_.size();
  return out;
}

nlohmann::json SwarmSchedule::summary(double now) const {
  // Up to the end of the last finished step: the samples of a step count when it is done.
  const double end = last_step_end_ >= 0 ? last_step_end_ : now;
  const double seconds = started_ >= 0 ? std::max(1e-9, end - started_) : 0.0;
  const int64_t samples = step_ * o_.micro_batches * o_.micro_batch_size;
  const double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
  const double ideal =
      seconds > 0 ? (last_step_end_ >= 0 ? ideal_at_step_end_ : 0.0) / seconds : 0.0;
  return {{"event", "swarm_summary"},
          {"steps", step_},
          {"steps_wanted", o_.steps},
          {"samples", samples},
          {"samples_done", samples_done_},  // the unfinished step's included
          {"seconds", seconds},
          {"samples_per_second", rate},
          {"ideal_samples_per_second", ideal},
          {"efficiency", ideal > 0 ? rate / ideal : 0.0},
          {"first_loss", step_losses_.empty() ? 0.0 : step_losses_.front()},
          {"last_loss", step_losses_.empty() ? 0.0 : step_losses_.back()},
          {"retried", retried_},
          {"lost", lost_},
          {"moves", moves_},
          {"diverged", diverged_},
          {"strikes", strikes_},
          {"banned", bans_},
          {"restarts", restarts_},
          {"waiting_seconds", waiting_seconds_},
          {"members", members_.size()},
          {"epoch", epoch_}};
}

}  // namespace agora
