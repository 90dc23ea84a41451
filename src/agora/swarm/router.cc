#include "agora/swarm/router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "agora/core/error.h"

namespace agora {

SwarmRouter::SwarmRouter(SwarmRouterOptions options) : options_(options), rng_(options.seed) {
  if (!(options_.alpha > 0 && options_.alpha <= 1)) {
    fail("swarm router: alpha is {}, allowed (0, 1]", options_.alpha);
  }
  if (!(options_.skip_seconds >= 0)) {
    fail("swarm router: skip_seconds is {}, allowed >= 0", options_.skip_seconds);
  }
  if (!(options_.prior_seconds_per_sample > 0)) {
    fail("swarm router: prior_seconds_per_sample is {}, allowed > 0",
         options_.prior_seconds_per_sample);
  }
}

double counted_seconds(double reported, double round_trip, int64_t stages) {
  if (!(round_trip > 0) || !std::isfinite(round_trip)) return reported;
  const double floor = round_trip / static_cast<double>(std::max<int64_t>(stages, 1));
  if (!(reported > 0) || !std::isfinite(reported)) return floor;
  return std::clamp(reported, floor, round_trip);
}

void SwarmRouter::add(uint64_t replica) {
  replicas_.try_emplace(replica, Replica{});
}

void SwarmRouter::remove(uint64_t replica) {
  replicas_.erase(replica);
}

double SwarmRouter::prior() const {
  double sum = 0;
  int64_t n = 0;
  for (const auto& [id, r] : replicas_) {
    if (r.measured > 0) {
      sum += estimate(r);
      ++n;
    }
  }
  return n > 0 ? sum / static_cast<double>(n) : options_.prior_seconds_per_sample;
}

// Adam's bias correction: the average starts at 0, so after n measurements it carries only
// 1 - (1 - alpha)^n of their weight.
double SwarmRouter::estimate(const Replica& r) const {
  return r.average / (1.0 - std::pow(1.0 - options_.alpha, static_cast<double>(r.measured)));
}

double SwarmRouter::charge(const Replica& r, double prior) const {
  return r.measured > 0 ? estimate(r) : prior;
}

std::optional<uint64_t> SwarmRouter::pick(int64_t samples, double now) {
  std::vector<std::map<uint64_t, Replica>::iterator> live;
  bool any_settled = false;
  double lowest = 0;
  for (auto it = replicas_.begin(); it != replicas_.end(); ++it) {
    if (now < it->second.skip_until) continue;
    live.push_back(it);
    if (!it->second.entering && (!any_settled || it->second.key < lowest)) {
      lowest = it->second.key;
      any_settled = true;
    }
  }
  if (live.empty()) return std::nullopt;
  const double unmeasured = prior();
  for (auto it : live) {
    Replica& r = it->second;
    if (r.entering) {
      r.key = lowest;
      r.entering = false;
    }
    if (options_.backlog) {
      r.key = std::max(r.key, lowest + static_cast<double>(r.outstanding) * charge(r, unmeasured));
    }
  }
  // A replica being probed (unmeasured, one micro-batch out) waits for its answer, unless nobody
  // else is live: that one probe keeps a slow newcomer from a backlog it could never work off.
  std::vector<std::map<uint64_t, Replica>::iterator> open;
  for (auto it : live) {
    if (it->second.measured > 0 || it->second.outstanding == 0) open.push_back(it);
  }
  if (!open.empty()) live.swap(open);
  auto chosen = live.front();
  if (options_.uniform) {
    chosen = live[rng_() % live.size()];
  } else {
    auto before = [](const std::map<uint64_t, Replica>::iterator& a,
                     const std::map<uint64_t, Replica>::iterator& b) {
      if (a->second.key != b->second.key) return a->second.key < b->second.key;
      if ((a->second.measured == 0) != (b->second.measured == 0)) return a->second.measured == 0;
      return a->first < b->first;
    };
    for (auto it : live) {
      if (before(it, chosen)) chosen = it;
    }
  }
  const int64_t n = std::max<int64_t>(samples, 1);
  chosen->second.key += static_cast<double>(n) * charge(chosen->second, unmeasured);
  chosen->second.outstanding += n;
  return chosen->first;
}

void SwarmRouter::answered(uint64_t replica, int64_t samples, double seconds) {
  auto it = replicas_.find(replica);
  if (it == replicas_.end() || samples <= 0) return;
  Replica& r = it->second;
  r.outstanding = std::max<int64_t>(0, r.outstanding - samples);
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  r.average =
      (1.0 - options_.alpha) * r.average + options_.alpha * seconds / static_cast<double>(samples);
  ++r.measured;
}

void SwarmRouter::failed(uint64_t replica, double now) {
  auto it = replicas_.find(replica);
  if (it == replicas_.end()) return;
  it->second.skip_until = now + options_.skip_seconds;
  it->second.entering = true;
  it->second.outstanding = 0;  // the caller sends those elsewhere
}

double SwarmRouter::seconds_per_sample(uint64_t replica) const {
  auto it = replicas_.find(replica);
  if (it == replicas_.end()) return 0;
  return charge(it->second, prior());
}

}  // namespace agora
