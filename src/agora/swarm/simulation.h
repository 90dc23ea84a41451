// A swarm simulated on an event clock (docs/swarm.md; bench/swarm): S pipeline stages, each
// served by peers of unequal speed, a source that keeps micro-batches in flight through them, a
// peer killed every kill_every seconds, and the real decisions of the swarm: each sender's
// SwarmRouter (or uniform random routing, the baseline) and the coordinator's stage_for_joiner
// and plan_move (swarm/balance.h). Compute is simulated (a sample's forward on stage s takes
// costs[s] / speed seconds, its backward twice that, the last stage both at once, each time
// jittered by +-jitter), so it answers how fast the routing and balancing let a swarm go, not how
// fast a model trains; what a real run adds is measured by the stage processes.
//
// A micro-batch goes forward through one replica per stage, chosen by the sender's router, and
// back along the same replicas. Each replica works on one task at a time, backward before forward.
// Every sender keeps the input it sent until the backward comes back, so a death loses compute,
// not micro-batches: after timeout_seconds (the time to notice) the sender of a forward the dead
// replica held sends it elsewhere (a retry), and a backward that needed the dead replica's
// activations is recovered: another replica of that stage runs the forward again from the input
// the previous stage holds, then the backward. Only a micro-batch whose input holder died too is
// lost; the source notices after timeout_seconds and sends a new one. The coordinator drops the
// dead replica from everyone's routers after timeout_seconds. The peer starts again
// restart_seconds after its death, loads its stage's parameters for join_seconds, and serves: its
// old stage, or with rebalancing the stage stage_for_joiner names. With rebalancing, every
// rebalance_seconds the coordinator asks plan_move; the moved peer stops taking new micro-batches,
// finishes what it holds (and the backwards owed to it), loads its new stage's parameters and
// serves there.
//
// The ideal at each moment is the bottleneck of the serving peers, min over stages of the sum of
// speed / (3 costs[s]) samples per second; the summary's ideal is its average over the run.
// Deterministic: the same options give the same numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agora {

struct SwarmSimOptions {
  // Per stage, each peer's speed (1 = the reference machine): 3 stages, 1x / 1x / 3x slower.
  std::vector<std::vector<double>> speeds = {{1, 1, 1.0 / 3}, {1, 1.0 / 3}, {1, 1, 1.0 / 3}};
  std::vector<double> costs;       // forward seconds per sample at speed 1; empty = 1 per stage
  bool uniform = false;            // uniform random routing instead of by throughput
  bool backlog = true;             // SwarmRouterOptions::backlog (false: an ablation)
  double rebalance_seconds = 0;    // T; 0 = no rebalancing (a restarted peer keeps its stage)
  double min_gain = 0.05;          // plan_move's threshold
  double kill_every = 60;          // seconds between kills; 0 = none
  double restart_seconds = 10;     // from a death to the restart
  double join_seconds = 5;         // loading a stage's parameters (restart or move)
  double timeout_seconds = 5;      // how long until a loss or a dead replica is noticed
  double link_seconds = 0.01;      // one hop's latency
  int64_t micro_batch = 1;         // samples per micro-batch
  int64_t in_flight = 0;           // micro-batches the source keeps going; 0 = 4 per peer
  double sim_seconds = 1800;
  double window_seconds = 60;      // the timeline's resolution
  double jitter = 0.1;             // each compute time times 1 + jitter * U(-1, 1)
  uint64_t seed = 1;
};

struct SwarmSimWindow {
  double end = 0;                 // simulated seconds
  double samples_per_second = 0;  // finished in the window
  double ideal = 0;               // the window's average bottleneck
};

struct SwarmSimSummary {
  double samples_per_second = 0;  // finished micro-batches' samples over the run
  double ideal = 0;               // the average bottleneck of the serving peers
  double efficiency = 0;          // samples_per_second / ideal
  double initial_bottleneck = 0;  // every peer up, on its first stage
  double best_bottleneck = 0;     // the best assignment of every peer
  int64_t micro_batches = 0;  // finished: forward and backward through every stage
  int64_t lost = 0;           // given up: a replica and the one holding its input both died
  int64_t retries = 0;        // forwards sent again after their replica died
  int64_t recomputed = 0;     // a stage's forward and backward run again on another replica
  int64_t kills = 0, moves = 0;
  std::vector<int64_t> stage_peers;  // peers serving each stage at the end
  std::vector<SwarmSimWindow> windows;
};

// Throws Error naming the option: no stage, a stage without peers, a speed or cost not positive,
// a negative time, or a micro-batch, window or length not positive.
SwarmSimSummary run_swarm_sim(const SwarmSimOptions& options);

}  // namespace agora
