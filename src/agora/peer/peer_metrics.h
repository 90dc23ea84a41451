// PeerMetrics: the peer's Prometheus metrics (obs/metrics_catalogue.h, agora_peer_* and
// agora_network_*), recorded by the round loop and read by `agora peer --metrics`.
//
// The round loop calls it at a few points (a round trained, a step applied, a resync, a
// checkpoint) and times its activities with Timer; the network counters are read from the
// peer's link (peer_link.h) at scrape time. Everything is thread-safe: the loop writes while an
// HTTP thread renders. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>

#include "agora/obs/metrics.h"
#include "agora/peer/peer_link.h"

namespace agora::peer {

class PeerMetrics {
 public:
  enum class Activity {
    kCompute,
    kWaiting,
    kApplying,
    kFetchingState,
    kCheckpointing,
    kVerifying,  // recomputing spot checks on the training thread
  };

  explicit PeerMetrics(obs::Registry& registry);

  // Adds its lifetime to an activity's time, unless stop() was called earlier.
  class Timer {
   public:
    Timer(PeerMetrics& metrics, Activity activity)
        : metrics_(&metrics), activity_(activity), started_(std::chrono::steady_clock::now()) {}
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    ~Timer() { stop(); }
    // Returns the seconds added (0 on a second call).
    double stop();

   private:
    PeerMetrics* metrics_;
    Activity activity_;
    std::chrono::steady_clock::time_point started_;
  };

  void add_time(Activity activity, double seconds);
  // A round with a non-empty share: `sequences` of `batch_size` trained in `compute_seconds`.
  void round_trained(double loss, double learning_rate, uint64_t sequences, uint64_t batch_size,
                     int64_t seq_len, double compute_seconds);
  void applied(uint64_t applied_steps);
  void resynced();
  // What applying a finalized step decided (optim/strategy.h ApplyReport).
  void apply_decisions(uint64_t refused, uint64_t clipped, bool skipped);
  void checkpoint_written(double seconds);
  // Publishes `network`'s counters at every scrape; `network` must outlive the registry's use.
  void watch(const PeerLink& network);

 private:
  obs::Registry& registry_;
  obs::Counter* time_[6];
};

}  // namespace agora::peer
