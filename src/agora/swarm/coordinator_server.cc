#include "agora/swarm/coordinator_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/net/allowlist.h"
#include "agora/obs/event_log.h"
#include "agora/obs/metrics_catalogue.h"
#include "agora/serve/data_service.h"
#include "agora/serve/members.h"
#include "agora/serve/poll.h"
#include "agora/serve/status_server.h"
#include "agora/swarm/coordinator_store.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kBannedReason =
    "banned from this run: it held micro-batches or a round past the deadline, or sent "
    "contributions that are not its stage's, too often (events.jsonl: swarm_struck)";

class Server {
 public:
  Server(const net::Identity& identity, const SwarmServerOptions& o)
      : o_(o),
        schedule_(o.schedule),
        context_(o.admission),
        server_(context_, identity, o.listen, limits(o), /*reply_queue=*/1024),
        members_(member_limits(o)),
        store_(o.out, fingerprint(o)) {
    if (!o_.data_dir.empty()) data_ = std::make_unique<serve::DataService>(o_.data_dir);
    const std::optional<SwarmStore::Saved> saved = store_.load();
    events_ = obs::EventLog(o_.out / "events.jsonl", /*append=*/saved.has_value(),
                            [this] { return now(); });
    if (saved) {
      // The schedule's clock goes on from the save's, the time down included.
      clock_base_ = saved->durable.clock.value("now", 0.0) + saved->age_seconds;
      resume(*saved);
    }
    log({{"event", "swarm_serve"},
         {"resumed", saved.has_value()},
         {"listen", server_.bound_endpoint()},
         {"key", net::key_to_hex(identity.public_key())},
         {"admission", net::describe(o_.admission)},
         {"stranger_rate", members_.limits().stranger_rate},
         {"stranger_burst", members_.limits().stranger_burst},
         {"stages", o_.schedule.stages},
         {"steps", o_.schedule.steps},
         {"micro_batches", o_.schedule.micro_batches},
         {"rebalance_seconds", o_.schedule.rebalance_seconds}});
    if (o_.progress) {
      fmt::print(stderr, "swarm coordinator on {} (key {})\n", server_.bound_endpoint(),
                 net::key_to_hex(identity.public_key()));
    }
    if (o_.http) start_http();
  }

  nlohmann::json run() {
    double finished_at = -1;
    double last_status = -1;
    while (o_.stop == nullptr || !o_.stop->load()) {
      serve::wait_readable(server_.socket(), std::chrono::milliseconds(5));
      serve::drain(server_, {}, [this](const net::Incoming& in) { handle(in); });
      schedule_.tick(now());
      ban_struck_out();
      members_.evict_idle(now(), nullptr);
      persist();
      flush_events();
      if (now() - last_status >= 0.5) {
        last_status = now();
        publish();
      }
      if (schedule_.phase() == SwarmPhase::kFinished) {
        if (finished_at < 0) finished_at = now();
        if (now() - finished_at >= o_.linger_seconds) break;
      }
    }
    publish();
    nlohmann::json summary = schedule_.summary(now());
    if (schedule_.phase() != SwarmPhase::kFinished) log(summary);  // else logged at the end
    return summary;
  }

 private:
  static net::DecodeLimits limits(const SwarmServerOptions& o) {
    net::DecodeLimits l;
    l.max_control = 64 << 10;
    l.max_data = o.max_message_bytes;
    return l;
  }

  double now() const {
    return clock_base_ + std::chrono::duration<double>(Clock::now() - born_).count();
  }

  // What a folder's run is: the run config's fingerprint and the schedule's shape.
  static std::string fingerprint(const SwarmServerOptions& o) {
    return fmt::format("{} stages={} steps={} micro_batches={} micro_batch_size={}",
                       hex_encode(o.fingerprint), o.schedule.stages, o.schedule.steps,
                       o.schedule.micro_batches, o.schedule.micro_batch_size);
  }

  // A restart: the schedule as saved, and its members let through the gate as members (their
  // polls go on as before; the handshake still proves every key).
  void resume(const SwarmStore::Saved& saved) {
    schedule_.restore(saved.durable, saved.rounds, now(), saved.age_seconds);
    last_saved_ = saved.durable.state.dump();
    for (const std::string& key : schedule_.member_keys()) {
      try {
        members_.join(net::curve_public_of(key), key, now());
      } catch (const Error&) {
        // Not a key a handshake could prove: it will never poll, and the schedule loses it.
      }
    }
  }

  // Nothing is sent before it is durable: the batch's answers wait in outbox_ until what the
  // schedule decided is saved.
  void persist() {
    const SwarmSchedule::Durable d = schedule_.durable(now());
    const std::vector<SwarmSchedule::Contribution> arrived = schedule_.take_contributions();
    std::string state = d.state.dump();
    if (state != last_saved_ || !arrived.empty()) {
      store_.save(d, arrived);
      last_saved_ = std::move(state);
      crash_point("swarm_server.after_save");
    }
    for (auto& [route, e] : outbox_) server_.send(route, e);
    outbox_.clear();
  }

  // The member table's limits: the schedule's cap with room for members it lost and the table
  // has not forgotten yet (silent for 4 peer timeouts, at least 30 s).
  static serve::MemberLimits member_limits(const SwarmServerOptions& o) {
    serve::MemberLimits l;
    l.max_members = static_cast<int>(std::min<int64_t>(2 * o.schedule.max_members, 1 << 20));
    l.idle_seconds = std::max(30.0, 4 * o.schedule.peer_timeout);
    l.member_rate = o.messages_per_second;
    l.member_burst = o.burst;
    l.stranger_rate = o.messages_per_second;
    l.stranger_burst = o.burst;
    return l;
  }

  void handle(const net::Incoming& in) {
    const auto admitted = members_.admit(in.curve_key, now());
    if (admitted.standing == serve::Standing::kThrottled) return;
    if (admitted.standing == serve::Standing::kBanned) {
      server_.send(in.route, serve::refusal(kBannedReason, /*may_rejoin=*/false));
      return;
    }
    if (in.message.has_swarm_hello()) return on_hello(in);
    // Data goes to the keys the run admits (the allowlist let them through the handshake), hello
    // or not: a replica fetches its data before it can say which stage it serves. A stranger's
    // asks draw from the strangers' bucket; DataService bounds each key's bytes.
    if (in.message.has_get_blob() && data_ &&
        data_->answer(server_, in.curve_key, in.route, in.message.get_blob(), now())) {
      return;
    }
    if (admitted.standing != serve::Standing::kMember) {
      server_.send(in.route, serve::refusal(serve::kNotAMember, /*may_rejoin=*/true));
      return;
    }
    if (!in.message.has_swarm_poll()) return;
    const wire::SwarmPoll& p = in.message.swarm_poll();
    SwarmReport r;
    r.stage = p.stage();
    r.version = p.version();
    r.state_hash = p.state_hash();
    r.ready = p.ready();
    r.seconds_per_sample = p.seconds_per_sample();
    r.wants = p.wants();
    r.retried = p.retried();
    for (int i = 0; i < p.done_size() && i < o_.schedule.micro_batches; ++i) {
      r.done.emplace_back(p.done(i).micro_batch(), p.done(i).loss());
    }
    for (int i = 0; i < p.dropped_size() && i < o_.schedule.max_members; ++i) {
      r.dropped.push_back(p.dropped(i));
    }
    if (!p.payload().empty()) r.payload = p.payload();
    answer(in.route, schedule_.poll(admitted.member->key, r, now()));
    ban_struck_out();
  }

  void on_hello(const net::Incoming& in) {
    const wire::SwarmHello& h = in.message.swarm_hello();
    SwarmAnswer a;
    if (!serve::proves_key(h.key(), in.curve_key)) {
      a.refused = "the hello's key is not the key this connection authenticated with";
    } else if (h.fingerprint() != o_.fingerprint) {
      a.refused =
          "this peer was started with another run config than the coordinator's (the model, "
          "seed, data, steps, batch, [optimizer], [schedule] or [pipeline] differ)";
    } else {
      a = schedule_.hello(h.key(), h.endpoint(), h.stage(), now());
      if (a.refused.empty()) {
        const auto joined = members_.join(in.curve_key, h.key(), now());
        if (!joined.member) a.refused = joined.refused;
      }
    }
    answer(in.route, a);
  }

  // Keys the schedule banned (strikes): banned in the member table too, so their messages are
  // answered with the ban, whatever they send, until the run ends.
  void ban_struck_out() {
    for (const std::string& key : schedule_.take_banned()) {
      for (auto& [curve, entry] : members_) {
        if (entry.key == key && !entry.banned) {
          members_.ban(entry);
          break;
        }
      }
    }
  }

  void answer(const std::string& route, const SwarmAnswer& a) {
    if (a.refused == kNotAMember) {  // the schedule lost it: the one refusal, as for a stranger
      server_.send(route, serve::refusal(serve::kNotAMember, /*may_rejoin=*/true));
      return;
    }
    wire::Envelope e;
    wire::SwarmView* v = e.mutable_swarm_view();
    v->set_step(a.step);
    v->set_phase(phase_name(a.phase));
    v->set_stage(static_cast<uint32_t>(a.stage));
    v->set_stages(static_cast<uint32_t>(o_.schedule.stages));
    auto member = [](wire::SwarmMember* m, const SwarmPeerRef& r) {
      m->set_key(r.key);
      m->set_endpoint(r.endpoint);
      m->set_stage(static_cast<uint32_t>(r.stage));
    };
    for (const SwarmPeerRef& r : a.next) member(v->add_next(), r);
    for (const SwarmPeerRef& r : a.prev) member(v->add_prev(), r);
    for (const SwarmPeerRef& r : a.peers) member(v->add_peers(), r);
    for (uint32_t j : a.micro_batches) v->add_micro_batches(j);
    v->set_round_step(a.round_step);
    for (const auto& [key, payload] : a.round) {
      wire::SwarmContribution* c = v->add_round();
      c->set_key(key);
      c->set_payload(payload);
    }
    v->set_stage_hash(a.stage_hash);
    v->set_previous_hash(a.previous_hash);
    if (a.source) member(v->mutable_source(), *a.source);
    v->set_refused(a.refused);
    v->set_epoch(a.epoch);
    v->set_micro_batch_size(static_cast<uint32_t>(o_.schedule.micro_batch_size));
    v->set_waiting_for(a.waiting_for);
    outbox_.emplace_back(route, std::move(e));
  }

  void log(const nlohmann::json& row) { events_.write(row); }

  void flush_events() {
    for (nlohmann::json& e : schedule_.take_events()) {
      log(e);
      if (o_.progress && e["event"] == "swarm_step") {
        const nlohmann::json s = schedule_.summary(now());
        fmt::print(stderr, "step {:>5}/{}  loss {:.4f}  {:.2f} samples/s  ideal {:.2f}  lost {}\n",
                   e["step"].get<int64_t>() + 1, o_.schedule.steps, e["loss"].get<double>(),
                   s["samples_per_second"].get<double>(),
                   s["ideal_samples_per_second"].get<double>(), s["lost"].get<int64_t>());
      } else if (o_.progress && e["event"] != "swarm_summary") {
        fmt::print(stderr, "{}\n", e.dump());
      }
    }
  }

  void publish() {
    nlohmann::json status = schedule_.status(now());
    namespace m = obs::metric;
    obs::gauge(metrics_, m::kSwarmStep).set(status["steps"].get<double>());
    for (const char* phase : {"waiting", "training", "syncing", "finished"}) {
      obs::gauge(metrics_, m::kSwarmPhase, {{"phase", phase}}).set(status["phase"] == phase);
    }
    obs::gauge(metrics_, m::kSwarmSamplesPerSecond).set(status["samples_per_second"].get<double>());
    obs::gauge(metrics_, m::kSwarmIdeal).set(status["ideal_samples_per_second"].get<double>());
    for (const nlohmann::json& stage : status["stages"]) {
      const std::string s = std::to_string(stage["stage"].get<int64_t>());
      obs::gauge(metrics_, m::kSwarmStageThroughput, {{"stage", s}})
          .set(stage["throughput"].get<double>());
      int serving = 0, loading = 0;
      for (const nlohmann::json& r : stage["replicas"])
        (r["state"] == "serving" ? serving : loading)++;
      obs::gauge(metrics_, m::kSwarmReplicas, {{"stage", s}, {"state", "serving"}}).set(serving);
      obs::gauge(metrics_, m::kSwarmReplicas, {{"stage", s}, {"state", "loading"}}).set(loading);
    }
    obs::counter(metrics_, m::kSwarmLost).set_total(status["lost"].get<double>());
    obs::counter(metrics_, m::kSwarmMoves).set_total(status["moves"].get<double>());
    obs::counter(metrics_, m::kSwarmRetried).set_total(status["retried"].get<double>());
    if (http_) http_->publish(std::move(status));
  }

  void start_http() {
    http_ = std::make_unique<serve::StatusServer>(*o_.http, "swarm", metrics_);
    publish();
    log({{"event", "swarm_http"}, {"url", http_->url()}});
    if (o_.progress) fmt::print(stderr, "live page: {}\n", http_->url());
  }

  SwarmServerOptions o_;
  SwarmSchedule schedule_;
  Clock::time_point born_ = Clock::now();
  double clock_base_ = 0;  // a restarted server's clock starts where the saved one stopped
  net::Context context_;
  net::Server server_;
  struct NoState {};  // the schedule keeps what the swarm knows of a member
  serve::Members<NoState> members_;
  std::unique_ptr<serve::DataService> data_;
  SwarmStore store_;
  std::string last_saved_;  // the schedule's durable state as last saved
  std::vector<std::pair<std::string, wire::Envelope>> outbox_;  // answers waiting for the save
  obs::EventLog events_;
  obs::Registry metrics_;
  std::unique_ptr<serve::StatusServer> http_;  // --http: /metrics, /api/swarm, web/swarm.html
};

}  // namespace

nlohmann::json serve_swarm(const net::Identity& identity, const SwarmServerOptions& options) {
  Server server(identity, options);
  return server.run();
}

}  // namespace agora
