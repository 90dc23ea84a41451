#include "agora/peer/peer_metrics.h"

#include "agora/obs/metrics_catalogue.h"

namespace agora::peer {

namespace m = obs::metric;

double PeerMetrics::Timer::stop() {
  if (metrics_ == nullptr) return 0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  metrics_->add_time(activity_, seconds);
  metrics_ = nullptr;
  return seconds;
}

PeerMetrics::PeerMetrics(obs::Registry& registry) : registry_(registry) {
  static constexpr const char* kActivities[] = {"compute",        "waiting",       "applying",
                                                "fetching_state", "checkpointing", "verifying"};
  for (int i = 0; i < 6; ++i) {
    time_[i] = &obs::counter(registry_, m::kPeerTime, {{"activity", kActivities[i]}});
  }
  // Present from the first scrape, so dashboards see zeros rather than no data.
  obs::gauge(registry_, m::kPeerStep);
  obs::counter(registry_, m::kPeerRounds);
  obs::counter(registry_, m::kPeerResyncs);
  for (const char* decision : {"refused", "clipped", "skipped"}) {
    obs::counter(registry_, m::kPeerApplyDecisions, {{"decision", decision}});
  }
  obs::histogram(registry_, m::kPeerCheckpointDuration, obs::seconds_buckets());
  obs::add_process_metrics(registry_);
}

void PeerMetrics::add_time(Activity activity, double seconds) {
  time_[static_cast<int>(activity)]->inc(seconds);
}

void PeerMetrics::round_trained(double loss, double learning_rate, uint64_t sequences,
                                uint64_t batch_size, int64_t seq_len, double compute_seconds) {
  obs::gauge(registry_, m::kPeerLoss).set(loss);
  obs::gauge(registry_, m::kPeerLearningRate).set(learning_rate);
  if (compute_seconds > 0) {
    obs::gauge(registry_, m::kPeerTokensPerSecond)
        .set(static_cast<double>(sequences) * static_cast<double>(seq_len) / compute_seconds);
  }
  if (batch_size > 0) {
    obs::gauge(registry_, m::kPeerShare)
        .set(static_cast<double>(sequences) / static_cast<double>(batch_size));
  }
  obs::counter(registry_, m::kPeerRounds).inc();
  add_time(Activity::kCompute, compute_seconds);
}

void PeerMetrics::applied(uint64_t applied_steps) {
  obs::gauge(registry_, m::kPeerStep).set(static_cast<double>(applied_steps));
}

void PeerMetrics::resynced() {
  obs::counter(registry_, m::kPeerResyncs).inc();
}

void PeerMetrics::apply_decisions(uint64_t refused, uint64_t clipped, bool skipped) {
  const auto count = [this](const char* decision, uint64_t n) {
    if (n > 0) {
      obs::counter(registry_, m::kPeerApplyDecisions, {{"decision", decision}})
          .inc(static_cast<double>(n));
    }
  };
  count("refused", refused);
  count("clipped", clipped);
  count("skipped", skipped ? 1 : 0);
}

void PeerMetrics::checkpoint_written(double seconds) {
  obs::histogram(registry_, m::kPeerCheckpointDuration, obs::seconds_buckets()).observe(seconds);
  add_time(Activity::kCheckpointing, seconds);
}

void PeerMetrics::watch(const PeerLink& network) {
  registry_.add_collector([&network](obs::Registry& r) {
    const NetworkCounters c = network.counters();
    for (size_t k = 0; k < 3; ++k) {
      obs::counter(r, m::kNetworkBytes, {{"direction", "sent"}, {"kind", kTrafficNames[k]}})
          .set_total(static_cast<double>(c.sent_by_kind[k]));
      obs::counter(r, m::kNetworkBytes, {{"direction", "received"}, {"kind", kTrafficNames[k]}})
          .set_total(static_cast<double>(c.received_by_kind[k]));
    }
    obs::counter(r, m::kPeerPayloadsAccepted).set_total(static_cast<double>(c.payloads_fetched));
    for (size_t i = 0; i < 4; ++i) {
      obs::counter(r, m::kPeerPayloadsRejected, {{"reason", kRejectionNames[i]}})
          .set_total(static_cast<double>(c.rejected_by_reason[i]));
    }
    for (const auto& [reason, n] : c.dropped_by_reason) {
      obs::counter(r, m::kNetworkDropped, {{"reason", reason}}).set_total(static_cast<double>(n));
    }
    for (size_t i = 0; i < kRefusals; ++i) {
      obs::counter(r, m::kPeerRequestsRefused, {{"reason", kRefusalNames[i]}})
          .set_total(static_cast<double>(c.refused_by_reason[i]));
    }
    obs::counter(r, m::kPeerWitnessesEarly).set_total(static_cast<double>(c.witnesses_early));
    obs::counter(r, m::kPeerPayloadsLate).set_total(static_cast<double>(c.payloads_late));
    obs::counter(r, m::kPeerUnsolicitedReplies)
        .set_total(static_cast<double>(c.unsolicited_replies));
    obs::counter(r, m::kPeerIoErrors).set_total(static_cast<double>(c.io_errors));
    obs::gauge(r, m::kPeerFetchConnections).set(static_cast<double>(c.connections_open));
  });
}

}  // namespace agora::peer
