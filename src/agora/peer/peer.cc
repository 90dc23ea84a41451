#include "agora/peer/peer.h"

#include <fmt/format.h>

#include <deque>
#include <thread>

#include "agora/core/error.h"
#include "agora/obs/progress.h"
#include "agora/peer/checkpointer.h"
#include "agora/peer/model_state.h"
#include "agora/peer/peer_context.h"
#include "agora/peer/peer_network.h"
#include "agora/peer/round.h"
#include "agora/peer/session.h"
#include "agora/peer/state_sync.h"

namespace agora::peer {

const char* to_string(PeerPhase phase) {
  // In the order of the enum's values.
  constexpr const char* kNames[] = {"joining",  "syncing",  "catching_up", "waiting",
                                    "training", "finished", "leaving"};
  return kNames[static_cast<size_t>(phase)];
}

namespace {

// A state record past the finalized steps would leave the joiner nothing to apply, ever: it can
// only come from a member's forged report, so no parameters are fetched for it.
void check_welcome(const wire::Welcome& welcome) {
  if (welcome.state().applied_steps() > welcome.finalized_steps()) {
    fail(
        "the coordinator handed over a state after step {}, past the run's {} finalized steps "
        "(allowed: at most the finalized steps); it trusts a forged state report: upgrade the "
        "coordinator",
        welcome.state().applied_steps(), welcome.finalized_steps());
  }
}

// The peer's main loop: one coordinator message at a time, on the training thread.
class Peer {
 public:
  Peer(const net::Identity& identity, const PeerOptions& options, PeerLink& link,
       PeerMetrics& metrics, const std::atomic<bool>& stop)
      : peer_(identity, options, stop, link, metrics),
        checkpointer_(peer_),
        verification_(peer_),
        round_(peer_, checkpointer_, verification_) {}

  PeerSummary run();
  PeerPhase phase() const { return peer_.phase; }

 private:
  // False when cut short: the message that cut it (a refusal, or a Finished without linger) is
  // next in line (Round::catch_up), or the peer is stopping.
  bool catch_up(uint64_t target) {
    peer_.phase = PeerPhase::kCatchingUp;
    return round_.catch_up(target, deferred_);
  }
  void sync(const wire::StateRecord& state, const std::vector<wire::Member>& holders) {
    const StateSource source = sync_state(peer_, state, holders);
    round_.forget_finalized();  // the run may have gone back: sets are asked for again
    verification_.forget_parameters();
    round_.settle(/*force_report=*/true);
    // The steps this peer jumped over may have had nobody to checkpoint them: a checkpointer
    // writes the state it fetched, so the run's checkpoints have a gap no wider than the jump
    // (the coordinator reports the gap).
    if (peer_.checkpointer && source == StateSource::kMembers &&
        peer_.config.train.checkpoint_interval > 0) {
      checkpointer_.write();
    }
  }
  // Loads the state `welcome` names; returns the finalized steps to catch up to.
  uint64_t join_state(wire::Welcome welcome);
  std::optional<wire::Envelope> next_message();
  void on_round_start(const wire::RoundStart& round);
  void on_refused(const wire::Refused& refused);
  // The role may be handed to this peer (or away from it) at any RoundStart or Finished.
  void set_checkpointer(bool holds);
  void on_finished(const wire::Finished& finished);
  void finish();
  // After finishing, while the coordinator says `linger`: serve (the I/O thread does) until
  // released. Takes the checkpointer role if it is handed over now.
  void linger();
  void leave();

  PeerContext peer_;
  Checkpointer checkpointer_;
  Verification verification_;
  Round round_;
  std::deque<wire::Envelope> deferred_;  // arrived while catching up; handled next
};

uint64_t Peer::join_state(wire::Welcome welcome) {
  // Holders keep the snapshots of their two newest reports: a joiner that took too long (a
  // large model on a slow link, a run moving fast) finds the state gone, and asks again for a
  // newer one rather than giving up.
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    try {
      sync(welcome.state(), {welcome.holders().begin(), welcome.holders().end()});
      return welcome.finalized_steps();
    } catch (const Error& e) {
      if (attempt == kAttempts || peer_.stopping()) throw;
      peer_.log(fmt::format("could not load the parameters after step {}: {}; joining again for "
                            "a newer state (attempt {} of {})",
                            welcome.state().applied_steps(), e.what(), attempt + 1, kAttempts));
    }
    welcome = join(peer_);
    check_welcome(welcome);
    if (welcome.run_id() != peer_.run_id) {
      fail("the coordinator now runs another run ({}, this peer joined {})", welcome.run_id(),
           peer_.run_id);
    }
    peer_.checkpointer = welcome.checkpointer();
    peer_.log(fmt::format("joined again ({} finalized steps)", welcome.finalized_steps()),
              "rejoin", {{"finalized_steps", welcome.finalized_steps()}, {"attempt", attempt + 1}});
  }
}

std::optional<wire::Envelope> Peer::next_message() {
  if (!deferred_.empty()) {
    // A message that cut a catch-up short is at the back, with what arrived before it in
    // front: they are handled in the order they came.
    wire::Envelope m = std::move(deferred_.front());
    deferred_.pop_front();
    return m;
  }
  {
    // Nothing to do but wait: the time the coordinator's split left for spot checks.
    PeerMetrics::Timer verifying(peer_.metrics, PeerMetrics::Activity::kVerifying);
    verification_.run_ready_checks();
  }
  PeerMetrics::Timer waiting(peer_.metrics, PeerMetrics::Activity::kWaiting);
  // A check being gathered is recomputed as soon as it is ready: look again soon.
  return peer_.link.next_from_coordinator(verification_.gathering() ? 0.02 : 0.2);
}

void Peer::on_round_start(const wire::RoundStart& round) {
  if (round.step() < peer_.next_round) {
    round_.recommit(round.step());
    return;
  }
  if (!peer_.first_round) peer_.first_round = std::chrono::steady_clock::now();
  set_checkpointer(round.checkpointer());
  // Cut short, the peer cannot train this round (its parameters are behind it): the refusal or
  // the end of the run is handled next, and a rejoined peer hears the open round again.
  if (!catch_up(round.apply_through())) return;
  peer_.next_round = round.step() + 1;
  peer_.link.set_status(peer_.applied, peer_.next_round);
  peer_.phase = PeerPhase::kTraining;
  round_.train(round);
}

void Peer::on_refused(const wire::Refused& refused) {
  if (!refused.may_rejoin()) fail("the coordinator refused this peer: {}", refused.reason());
  // The coordinator does not know us (it lost its database, or dropped us for silence): join
  // again and take the majority's parameters.
  peer_.log("the coordinator does not know this peer; joining again", "rejoin");
  const wire::Welcome welcome = join(peer_);
  check_welcome(welcome);
  if (welcome.run_id() != peer_.run_id) {
    fail(
        "the coordinator now runs another run ({}, this peer trained {}); restart the peer to "
        "join the new run",
        welcome.run_id(), peer_.run_id);
  }
  peer_.checkpointer = welcome.checkpointer();
  // Refusals queued behind this one answered messages the coordinator had before the Join: each
  // would make the peer join again for nothing. One that comes from here on is news.
  std::erase_if(deferred_, [](const wire::Envelope& m) { return m.has_refused(); });
  // Parameters at or past the majority's record are kept (the hash reports will catch a
  // disagreement); a peer that fell behind fetches, and so does one whose steps the run undid
  // (it went back to a checkpoint).
  if (welcome.state().applied_steps() > peer_.applied ||
      welcome.finalized_steps() < peer_.applied) {
    peer_.next_round = std::min<uint64_t>(peer_.next_round, welcome.finalized_steps());
    sync(welcome.state(), {welcome.holders().begin(), welcome.holders().end()});
  }
  catch_up(welcome.finalized_steps());  // cut short: the main loop acts on what cut it
}

void Peer::set_checkpointer(bool holds) {
  if (holds == peer_.checkpointer) return;
  peer_.checkpointer = holds;
  peer_.log(holds ? "this peer now holds the checkpointer role" : "checkpointer role handed on",
            "checkpointer", {{"checkpointer", holds}});
}

void Peer::on_finished(const wire::Finished& finished) {
  set_checkpointer(finished.checkpointer());
  if (!catch_up(finished.steps()) && !peer_.stopping()) {
    // The coordinator serves no more sets (it released its members, or dropped this one): the
    // run is over either way, so the peer finishes with the steps it has, and says so.
    obs::log_warn({peer_.applied,
                   peer_.who,
                   "finished_behind",
                   {{"applied_steps", peer_.applied}, {"finalized_steps", finished.steps()}}},
                  fmt::format("the run finished after {} steps, but the coordinator sends no "
                              "more finalized sets: this peer ends at step {}",
                              finished.steps(), peer_.applied));
  }
  finish();
  if (finished.linger()) linger();
}

void Peer::linger() {
  const double grace = peer_.config.network.finish_grace_seconds;
  // The coordinator releases members by then; the margin covers its heartbeat timeout and a
  // release lost on the way, and a coordinator gone for good cannot keep a peer forever.
  const double limit = grace + peer_.config.network.heartbeat_timeout_seconds + 10.0;
  peer_.log(fmt::format("staying to serve the run's payloads until released (at most {:.0f} s)",
                        limit),
            "lingering", {{"limit_seconds", limit}});
  const auto started = std::chrono::steady_clock::now();
  while (!peer_.stopping() &&
         std::chrono::steady_clock::now() - started < std::chrono::duration<double>(limit)) {
    const std::optional<wire::Envelope> m = peer_.link.next_from_coordinator(0.2);
    if (!m || !m->has_finished()) continue;  // the run is over: nothing else is acted on
    if (m->finished().checkpointer() && !peer_.checkpointer) {
      set_checkpointer(true);
      checkpointer_.write();  // the final checkpoint, which its holder did not report
    }
    if (!m->finished().linger()) {
      peer_.log("released by the coordinator", "released");
      return;
    }
  }
  peer_.log("not released within the grace period; exiting", "released", {{"timed_out", true}});
}

void Peer::finish() {
  peer_.phase = PeerPhase::kFinished;
  peer_.summary.state_hash = state_hash_hex(state_record(peer_.learner.model, peer_.applied));
  peer_.log(
      fmt::format("run finished after {} steps; state {}", peer_.applied, peer_.summary.state_hash),
      "finished", {{"applied_steps", peer_.applied}, {"hash", peer_.summary.state_hash}});
  if (peer_.checkpointer) checkpointer_.write();
}

void Peer::leave() {
  peer_.phase = PeerPhase::kLeaving;
  wire::Envelope leave;
  leave.mutable_leave();
  peer_.link.send_to_coordinator(leave);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the Leave go out
  peer_.log("left the run", "left");
}

PeerSummary Peer::run() {
  peer_.log(
      fmt::format("serving on {}; joining {}", peer_.link.endpoint(), peer_.options.coordinator));
  const wire::Welcome welcome = join(peer_);
  check_welcome(welcome);
  build(peer_, welcome);
  verification_.prepare();
  peer_.log(fmt::format("joined run {} ({} finalized steps{})", peer_.run_id,
                        welcome.finalized_steps(), peer_.checkpointer ? ", checkpointer" : ""),
            "joined",
            {{"run", peer_.run_id},
             {"finalized_steps", welcome.finalized_steps()},
             {"checkpointer", peer_.checkpointer}});
  const uint64_t finalized = join_state(welcome);
  catch_up(finalized);  // cut short: the main loop acts on what cut it (rejoins, or finishes)
  while (!peer_.stopping() && peer_.phase != PeerPhase::kFinished) {
    peer_.phase = PeerPhase::kWaiting;
    const std::optional<wire::Envelope> m = next_message();
    if (!m || round_.handle_passive(*m)) {
      // Nothing to act on but what is final: apply it now. A syncing member must keep up with a
      // run whose steps come faster than any pause between messages, or the payloads it needs
      // are pruned before it asks for them.
      if (const auto newest = round_.pending_final()) catch_up(*newest + 1);
      continue;
    }
    if (m->has_round_start()) {
      on_round_start(m->round_start());
    } else if (m->has_resync()) {
      peer_.log("my parameters disagree with the majority; resynchronising", "resync");
      peer_.metrics.resynced();
      sync(m->resync().state(), {m->resync().holders().begin(), m->resync().holders().end()});
    } else if (m->has_finished()) {
      on_finished(m->finished());
    } else if (m->has_refused()) {
      on_refused(m->refused());
    }
  }
  if (peer_.phase != PeerPhase::kFinished) {
    leave();
    // finish() hashed a finished run's parameters already; hashing is a pass over the model.
    peer_.summary.state_hash = state_hash_hex(state_record(peer_.learner.model, peer_.applied));
  }
  const NetworkCounters c = peer_.link.counters();
  serve::DataMountStats data;
  if (peer_.data_mount) data = peer_.data_mount->stats();
  peer_.summary.data_bytes_fetched = data.bytes_fetched;
  peer_.summary.data_bytes_from_peers = data.bytes_from_peers;
  if (peer_.decoded) peer_.summary.decoded_payloads_kept = peer_.decoded->size();
  peer_.log(fmt::format("payloads fetched {}, rejected {}; {} received, {} served; {} malformed "
                        "messages dropped",
                        c.payloads_fetched, c.payloads_rejected, format_bytes(c.bytes_received),
                        format_bytes(c.bytes_sent), c.dropped_messages),
            "summary",
            {{"payloads_fetched", c.payloads_fetched},
             {"payloads_rejected", c.payloads_rejected},
             {"bytes_received", c.bytes_received},
             {"bytes_sent", c.bytes_sent},
             {"dropped_messages", c.dropped_messages},
             {"relayed_bytes", peer_.summary.relayed_bytes},
             {"relay_chunks_fetched", c.relay_chunks_fetched},
             {"relay_chunks_served", c.relay_chunks_served},
             {"data_bytes_fetched", data.bytes_fetched},
             {"data_bytes_from_peers", data.bytes_from_peers},
             {"data_chunks_refused", data.refused},
             {"data_wait_seconds", data.waited_seconds},
             {"payloads_predecoded", peer_.summary.payloads_predecoded},
             {"decoded_payloads_kept", peer_.summary.decoded_payloads_kept}});
  peer_.summary.applied_steps = peer_.applied;
  return peer_.summary;
}

PeerNetworkOptions network_options(const PeerOptions& o, obs::Registry* registry) {
  PeerNetworkOptions n;
  n.metrics = registry;
  n.coordinator = o.coordinator;
  n.coordinator_key = o.coordinator_key;
  n.listen = o.listen;
  n.advertise = o.advertise;
  return n;
}

}  // namespace

PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options, PeerLink& link,
                     PeerMetrics& metrics, const std::atomic<bool>& stop) {
  Peer peer(identity, options, link, metrics, stop);
  try {
    return peer.run();
  } catch (const Error& e) {
    // Say where the peer stood: "while syncing" tells an operator where to look.
    fail("{} (while {})", e.what(), to_string(peer.phase()));
  }
}

PeerSummary run_peer(const net::Identity& identity, const PeerOptions& options,
                     const std::atomic<bool>& stop) {
  obs::Registry registry;  // before the network, which records fetch latencies into it
  PeerMetrics metrics(registry);
  PeerNetwork network(identity, network_options(options, &registry));
  metrics.watch(network);
  std::unique_ptr<obs::HttpServer> http;
  if (options.metrics) {
    http = std::make_unique<obs::HttpServer>(*options.metrics);
    http->get("/metrics", [&registry](const obs::HttpRequest&) {
      return obs::HttpResponse{200, std::string(obs::kPrometheusContentType), registry.render()};
    });
    http->start();
    // Said even with --quiet: an open port is something the operator must know about.
    obs::log_info({0, net::short_key(identity.public_key())},
                  fmt::format("serving Prometheus metrics on {}/metrics", http->url()));
  }
  return run_peer(identity, options, network, metrics, stop);
}

}  // namespace agora::peer
