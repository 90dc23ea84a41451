// Which stage each peer of a swarm serves (docs/algorithms.md section 10, docs/swarm.md): the
// coordinator's decisions when a peer joins and, every rebalance period, whether one peer should
// move. Pure functions of what peers reported, so every replay of the coordinator decides the same.
//
// A stage's throughput is the samples per second its replicas serve together: the sum over its
// peers of 1 / seconds_per_sample, each peer's own measurement of forward and backward compute per
// sample on that stage. A peer not measured yet counts as the mean of its stage's measured peers,
// or of the swarm's when its stage has none (by cost, below). The run can go no faster than its bottleneck, the stage with the least
// throughput; a stage with no peer is a bottleneck of 0, and the run waits for it.
//
// A peer's speed carries over between stages in proportion to their cost: on stage t it would take
// seconds_per_sample * cost[t] / cost[s] (cost: the relative compute of a sample's forward and
// backward on each stage, e.g. its parameters; only ratios matter).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace agora {

struct StagePeer {
  uint64_t peer = 0;
  int64_t stage = 0;
  double seconds_per_sample = 0;  // measured on its stage; 0 = not yet
};

struct StageMove {
  uint64_t peer = 0;
  int64_t from = 0, to = 0;
  double bottleneck_before = 0, bottleneck_after = 0;  // samples per second
};

// Samples per second per stage. Throws Error for a stage outside [0, costs.size()), a cost not
// positive, or a negative or non-finite measurement.
std::vector<double> stage_throughputs(const std::vector<StagePeer>& peers,
                                      const std::vector<double>& costs);

// The stage a joining peer should serve: an empty stage first, then the one with the least
// throughput (ties: the lowest index).
int64_t stage_for_joiner(const std::vector<StagePeer>& peers, const std::vector<double>& costs);

// The single move of a measured peer, off a stage that keeps at least one other peer, that most
// raises the bottleneck (ties: the donor stage with the most throughput, then the smaller peer
// id), when it raises it by more than min_gain (a fraction: 0.05 = 5%), so that the swarm does not
// churn for noise; nullopt otherwise.
std::optional<StageMove> plan_move(const std::vector<StagePeer>& peers,
                                   const std::vector<double>& costs, double min_gain);

// The best bottleneck any assignment of these peers could reach (peers moved freely, each
// keeping its speed), by exhaustive search over small swarms and greedy placement beyond
// 12 peers: the ideal a rebalanced swarm is measured against.
double best_bottleneck(const std::vector<StagePeer>& peers, const std::vector<double>& costs);

}  // namespace agora
