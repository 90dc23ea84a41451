#include "agora/swarm/balance.h"

#include <algorithm>
#include <cmath>

#include "agora/core/error.h"

namespace agora {
namespace {

void check(const std::vector<StagePeer>& peers, const std::vector<double>& costs) {
  if (costs.empty()) fail("swarm balance: no stages (costs is empty)");
  for (size_t s = 0; s < costs.size(); ++s) {
    if (!(costs[s] > 0) || !std::isfinite(costs[s])) {
      fail("swarm balance: stage {}'s cost is {}, allowed > 0", s, costs[s]);
    }
  }
  for (const StagePeer& p : peers) {
    if (p.stage < 0 || p.stage >= static_cast<int64_t>(costs.size())) {
      fail("swarm balance: peer {} serves stage {}, allowed 0 to {}", p.peer, p.stage,
           costs.size() - 1);
    }
    if (!(p.seconds_per_sample >= 0) || !std::isfinite(p.seconds_per_sample)) {
      fail("swarm balance: peer {} measured {} seconds per sample, allowed >= 0 and finite",
           p.peer, p.seconds_per_sample);
    }
  }
}

// Each peer's speed on a stage of cost 1 (samples per second). An unmeasured peer counts as
// the mean of its stage's measured peers, or of the whole swarm's when its stage has none, or as
// 1 when nobody is measured yet (then only the number of peers per stage tells stages apart).
std::vector<double> unit_speeds(const std::vector<StagePeer>& peers,
                                const std::vector<double>& costs) {
  std::vector<double> sum(costs.size(), 0.0);
  std::vector<int64_t> n(costs.size(), 0);
  double all = 0;
  int64_t all_n = 0;
  for (const StagePeer& p : peers) {
    if (p.seconds_per_sample > 0) {
      sum[p.stage] += costs[p.stage] / p.seconds_per_sample;
      ++n[p.stage];
      all += costs[p.stage] / p.seconds_per_sample;
      ++all_n;
    }
  }
  const double swarm_mean = all_n > 0 ? all / static_cast<double>(all_n) : 1.0;
  std::vector<double> out;
  for (const StagePeer& p : peers) {
    if (p.seconds_per_sample > 0) {
      out.push_back(costs[p.stage] / p.seconds_per_sample);
    } else {
      out.push_back(n[p.stage] > 0 ? sum[p.stage] / static_cast<double>(n[p.stage]) : swarm_mean);
    }
  }
  return out;
}

double bottleneck(const std::vector<double>& throughputs) {
  return *std::min_element(throughputs.begin(), throughputs.end());
}

}  // namespace

std::vector<double> stage_throughputs(const std::vector<StagePeer>& peers,
                                      const std::vector<double>& costs) {
  check(peers, costs);
  const std::vector<double> speed = unit_speeds(peers, costs);
  std::vector<double> out(costs.size(), 0.0);
  for (size_t i = 0; i < peers.size(); ++i) out[peers[i].stage] += speed[i] / costs[peers[i].stage];
  return out;
}

int64_t stage_for_joiner(const std::vector<StagePeer>& peers, const std::vector<double>& costs) {
  const std::vector<double> tp = stage_throughputs(peers, costs);
  std::vector<int64_t> count(costs.size(), 0);
  for (const StagePeer& p : peers) ++count[p.stage];
  int64_t best = 0;
  for (int64_t s = 1; s < static_cast<int64_t>(costs.size()); ++s) {
    const bool empty = count[s] == 0, best_empty = count[best] == 0;
    if ((empty && !best_empty) || (empty == best_empty && tp[s] < tp[best])) best = s;
  }
  return best;
}

std::optional<StageMove> plan_move(const std::vector<StagePeer>& peers,
                                   const std::vector<double>& costs, double min_gain) {
  if (!(min_gain >= 0)) fail("swarm balance: min_gain is {}, allowed >= 0", min_gain);
  const std::vector<double> tp = stage_throughputs(peers, costs);
  const std::vector<double> speed = unit_speeds(peers, costs);
  std::vector<int64_t> count(costs.size(), 0);
  for (const StagePeer& p : peers) ++count[p.stage];
  const double before = bottleneck(tp);
  std::optional<StageMove> best;
  for (size_t i = 0; i < peers.size(); ++i) {
    const StagePeer& p = peers[i];
    if (p.seconds_per_sample <= 0 || count[p.stage] < 2) continue;
    for (int64_t t = 0; t < static_cast<int64_t>(costs.size()); ++t) {
      if (t == p.stage) continue;
      std::vector<double> after = tp;
      after[p.stage] -= speed[i] / costs[p.stage];
      after[t] += speed[i] / costs[t];
      const StageMove move{p.peer, p.stage, t, before, bottleneck(after)};
      const bool better =
          !best || move.bottleneck_after > best->bottleneck_after ||
          (move.bottleneck_after == best->bottleneck_after &&
           (tp[move.from] > tp[best->from] ||
            (tp[move.from] == tp[best->from] && move.peer < best->peer)));
      if (better) best = move;
    }
  }
  if (!best || !(best->bottleneck_after > before * (1.0 + min_gain))) return std::nullopt;
  return best;
}

double best_bottleneck(const std::vector<StagePeer>& peers, const std::vector<double>& costs) {
  const std::vector<double> speed = unit_speeds(peers, costs);  // checks too
  const size_t stages = costs.size();
  if (peers.size() < stages) return 0;  // some stage stays empty
  double combos = std::pow(static_cast<double>(stages), static_cast<double>(peers.size()));
  if (combos <= 1e6) {
    double best = 0;
    std::vector<size_t> at(peers.size(), 0);
    for (;;) {
      std::vector<double> tp(stages, 0.0);
      for (size_t i = 0; i < peers.size(); ++i) tp[at[i]] += speed[i] / costs[at[i]];
      best = std::max(best, bottleneck(tp));
      size_t i = 0;
      while (i < at.size() && ++at[i] == stages) at[i++] = 0;
      if (i == at.size()) break;
    }
    return best;
  }
  // Greedy: the fastest peers first, each onto the stage that is then the bottleneck.
  std::vector<size_t> order(peers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return speed[a] > speed[b]; });
  std::vector<double> tp(stages, 0.0);
  for (size_t i : order) {
    const size_t t = static_cast<size_t>(std::min_element(tp.begin(), tp.end()) - tp.begin());
    tp[t] += speed[i] / costs[t];
  }
  return bottleneck(tp);
}

}  // namespace agora
