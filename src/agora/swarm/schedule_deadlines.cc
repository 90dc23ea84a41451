// SwarmSchedule's deadlines and strikes (schedule.h, "Deadlines and strikes"): how long a
// stage-0 replica may hold a micro-batch and a replica owe its round contribution, what passing
// either costs, and the bans that strikes add up to.
#include <fmt/format.h>

#include <algorithm>

#include "agora/core/hex.h"
#include "agora/swarm/schedule.h"

namespace agora {

double SwarmSchedule::lower_median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double SwarmSchedule::hold_deadline() const {
  std::vector<double> medians;
  for (const auto& [k, m] : members_) {
    if (!m.latencies.empty())
      medians.push_back(lower_median({m.latencies.begin(), m.latencies.end()}));
  }
  if (medians.empty()) return o_.min_deadline * o_.deadline_factor;
  return std::max(o_.min_deadline, o_.deadline_factor * lower_median(medians));
}

double SwarmSchedule::round_deadline() const {
  if (past_round_delays_.empty()) return o_.min_deadline * o_.deadline_factor;
  const double measured = lower_median({past_round_delays_.begin(), past_round_delays_.end()});
  return std::max(o_.min_deadline, o_.deadline_factor * measured);
}

void SwarmSchedule::enforce_deadlines(double now) {
  std::vector<std::pair<std::string, std::string>> struck;
  if (phase_ == SwarmPhase::kTraining) {
    const double deadline = hold_deadline();
    for (auto& [k, m] : members_) {
      size_t taken = 0;
      for (auto it = m.holding.begin(); it != m.holding.end();) {
        if (now - it->second <= deadline) {
          ++it;
          continue;
        }
        pool_.insert(std::lower_bound(pool_.begin(), pool_.end(), it->first), it->first);
        it = m.holding.erase(it);
        ++taken;
      }
      // Struck only when it finished nothing in that time: an honest replica whose micro-batch
      // was lost on the way (it resends after its own timeout) reports the others meanwhile.
      if (taken > 0 && now - m.progress_at > deadline) {
        struck.emplace_back(k, fmt::format("held {} micro-batches past the {:.1f} s deadline "
                                           "and finished none in that time",
                                           taken, deadline));
      }
    }
  } else if (phase_ == SwarmPhase::kSyncing && now - sync_started_ > round_deadline()) {
    for (size_t s = 0; s < expected_.size(); ++s) {
      for (auto it = expected_[s].begin(); it != expected_[s].end();) {
        if (contributions_[s].count(*it) != 0) {
          ++it;
          continue;
        }
        const auto m = members_.find(*it);
        // One no longer ready (outvoted, moved) could not contribute: no strike.
        if (m != members_.end() && ready_at(m->second, step_)) {
          struck.emplace_back(*it, fmt::format("sent no contribution within the {:.1f} s round "
                                               "deadline",
                                               round_deadline()));
        }
        it = expected_[s].erase(it);
      }
    }
  }
  for (const auto& [k, why] : struck) strike(k, why, now);
}

void SwarmSchedule::judge_drops(double now) {
  std::vector<std::pair<std::string, std::string>> struck;  // (key, why)
  for (const auto& [key, accusers] : dropped_by_) {
    const auto it = members_.find(key);
    if (it == members_.end()) continue;
    const int64_t stage = it->second.stage - 1;
    int64_t senders = 0, naming = 0;
    for (const auto& [k, m] : members_) {
      if (m.stage != stage || !ready_at(m, step_)) continue;
      ++senders;
      if (accusers.count(k) != 0) ++naming;
    }
    if (naming >= 2 && 2 * naming > senders) {
      struck.emplace_back(
          key, fmt::format("dropped micro-batches: {} of the {} replicas of stage "
                           "{} named it for work it lost (a send that timed out or an answer "
                           "that did not decode)",
                           naming, senders, stage));
    }
  }
  dropped_by_.clear();
  for (const auto& [key, why] : struck) strike(key, why, now);
}

void SwarmSchedule::strike(const std::string& key, const std::string& why, double now) {
  const auto it = members_.find(key);
  if (it == members_.end()) return;
  const int64_t strikes = ++it->second.strikes;
  ++strikes_;
  event({{"event", "swarm_struck"},
         {"peer", hex_encode(key).substr(0, 8)},
         {"stage", it->second.stage},
         {"step", step_},
         {"why", why},
         {"strikes", strikes}});
  if (strikes < o_.max_strikes) return;
  lose(key, "banned", now);
  ++bans_;
  if (banned_.insert(key).second) {
    banned_order_.push_back(key);
    newly_banned_.push_back(key);
  }
  while (static_cast<int64_t>(banned_order_.size()) > 4 * o_.max_members) {
    banned_.erase(banned_order_.front());
    banned_order_.pop_front();
  }
  event({{"event", "swarm_banned"},
         {"peer", hex_encode(key).substr(0, 8)},
         {"step", step_},
         {"why", why}});
}

std::vector<std::string> SwarmSchedule::take_banned() {
  std::vector<std::string> out;
  out.swap(newly_banned_);
  return out;
}

}  // namespace agora
