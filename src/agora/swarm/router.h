// SwarmRouter: which replica of the next stage gets a sender's next micro-batch (SWARM's
// stochastic wiring; docs/algorithms.md section 10, docs/swarm.md).
//
// Each sender keeps its own router over the replicas of the stage after it. Per replica it keeps
// an estimate of the replica's seconds per sample, a bias-corrected exponential moving average
// (alpha) of the compute times the replica reported, and a key: the replica's expected busy time
// as this sender has loaded it. pick(samples) takes the replica with the smallest key and adds
// samples * estimate to it: interleaved weighted round-robin, so each replica receives work in
// proportion to its throughput, spread out rather than in bursts, whatever the pace of the sender.
// (Counting keys from the sender's clock instead would send everything to one replica whenever
// the sender is slower than the replicas: every key would lie in the past and tie.)
//
// A replica enters at the current minimum key, so that it earns no burst for the time it was
// away, and wins ties while unmeasured, so the next pick probes it. Until it answers that probe it
// gets nothing more (unless no other replica is live), and it is charged the mean estimate of the
// measured replicas (prior_seconds_per_sample when none is).
//
// Round-robin keys never forget work handed out: a replica given more than its share (before it
// was measured, or while it slowed down) would keep that backlog for good, and a pipeline with a
// fixed number of micro-batches in flight starves behind it. So before each pick a replica's key
// is raised to at least the minimum key plus its outstanding samples (sent, not answered) times
// its estimate: one that is behind waits until it has caught up. In the swarm simulation this
// took routing by throughput under a kill a minute from 90% to 97% of the ideal (docs/swarm.md).
//
// A replica whose send failed or timed out is skipped for skip_seconds, then enters again as a new
// one does; the caller retries the micro-batch on the next pick. Ties: unmeasured first, then the
// smaller id.
//
// uniform = true picks uniformly at random among the live replicas instead (the baseline SWARM's
// routing is measured against; a replica waiting on its probe is left aside there too), from a
// generator seeded by `seed`.
//
// What a replica reports can only move its own share, and only within what its sender measured:
// the sender counts an answer only for an attempt it has out to that replica, and counts the
// reported compute time within counted_seconds()'s bounds from its own round trip (a replica
// cannot claim to be faster than its answer came back); a send that times out is failed(). The set
// of replicas comes from the coordinator's membership, never from what a replica sends, so it is
// bounded by the run's members. Deterministic: the same calls give the same picks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>

namespace agora {

struct SwarmRouterOptions {
  double alpha = 0.1;                   // weight of the newest measurement
  double skip_seconds = 10;             // how long a failed replica is skipped
  double prior_seconds_per_sample = 1;  // before anything is measured
  bool uniform = false;                 // uniform random routing (the baseline)
  bool backlog = true;                  // raise the keys of replicas behind (off: an ablation)
  uint64_t seed = 1;                    // for uniform
};

// The compute time a sender counts for an answer: what the replica reported, but at most the
// round trip the sender measured (it cannot have computed longer than it took to answer) and
// at least that round trip's share of the `stages` it crossed (this one and those after it):
// a replica that reports 1e-30 s is counted as fast as its answer actually came back. A
// reported time that is not a positive finite number counts as the floor.
double counted_seconds(double reported, double round_trip, int64_t stages);

class SwarmRouter {
 public:
  // Throws Error for alpha outside (0, 1], a negative skip time or a prior not positive.
  explicit SwarmRouter(SwarmRouterOptions options = {});

  // A replica joined the next stage (again: kept as it is).
  void add(uint64_t replica);
  // It left (or was moved away); unknown ids are ignored.
  void remove(uint64_t replica);

  // The replica for the next micro-batch of `samples`, or nullopt when every replica is being
  // skipped (at `now`) or there is none.
  std::optional<uint64_t> pick(int64_t samples, double now);

  // The replica answered `samples` this sender had sent it, reporting `seconds` of compute for
  // them (the measurement is ignored unless both are positive).
  void answered(uint64_t replica, int64_t samples, double seconds);

  // Sending to the replica failed or timed out: skip it until now + skip_seconds.
  void failed(uint64_t replica, double now);

  // The current estimate (the prior while unmeasured); 0 for an unknown replica.
  double seconds_per_sample(uint64_t replica) const;
  bool contains(uint64_t replica) const { return replicas_.count(replica) != 0; }
  size_t size() const { return replicas_.size(); }

 private:
  struct Replica {
    double key = 0;           // expected busy time from this sender's work
    double average = 0;       // EMA of seconds per sample, before bias correction
    int64_t measured = 0;     // measurements so far
    double skip_until = -1;   // skipped while now < skip_until
    bool entering = true;     // takes the minimum key at its next pick
    int64_t outstanding = 0;  // samples sent and not answered yet
  };

  double estimate(const Replica& r) const;
  double prior() const;
  double charge(const Replica& r, double prior) const;

  SwarmRouterOptions options_;
  std::map<uint64_t, Replica> replicas_;
  std::mt19937_64 rng_;
};

}  // namespace agora
