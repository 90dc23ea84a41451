#include "agora/serve/data_server.h"

#include <chrono>

#include "agora/net/allowlist.h"
#include "agora/obs/event_log.h"
#include "agora/serve/members.h"
#include "agora/serve/poll.h"
#include "agora/serve/rate_gate.h"

namespace agora::serve {
namespace {

nlohmann::json counters_json(const DataService::Counters& c) {
  return {{"manifests", c.manifests}, {"chunks", c.chunks}, {"bytes", c.bytes}, {"busy", c.busy}};
}

}  // namespace

DataServerSummary run_data_server(const net::Identity& identity, const DataServerOptions& o) {
  const auto born = std::chrono::steady_clock::now();
  const auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - born).count();
  };
  DataService service(o.data_dir, o.limits);
  net::Context context(o.admission);
  net::DecodeLimits limits;
  limits.max_control = 64 << 10;  // a GetBlob is a hash; nothing a member sends here is large
  limits.max_data = 64 << 10;
  net::Server server(context, identity, o.listen, limits);
  // Every key the handshake admitted is a member here: the allowlist is the membership.
  RateGate gate({o.messages_per_second, o.burst}, {o.messages_per_second, o.burst},
                o.limits.max_members);
  obs::EventLog events = o.events.empty() ? obs::EventLog() : obs::EventLog(o.events);
  events.write({{"event", "data_serve"},
                {"listen", server.bound_endpoint()},
                {"key", net::key_to_hex(identity.public_key())},
                {"admission", net::describe(o.admission)},
                {"data_hash", service.hex()},
                {"shards", service.identity().shards.size()},
                {"bytes_per_second", o.limits.bytes_per_second},
                {"messages_per_second", o.messages_per_second}});
  if (o.on_bound) o.on_bound(server.bound_endpoint(), service.hex());

  DataServerSummary s;
  s.data_hash = service.hex();
  double last_report = 0;
  while (o.stop == nullptr || !o.stop->load()) {
    wait_readable(server.socket(), std::chrono::milliseconds(5));
    drain(server, {}, [&](const net::Incoming& in) {
      if (!gate.take(in.curve_key, /*member=*/true, now())) return;
      if (!in.message.has_get_blob()) {
        ++s.refused;
        server.send(in.route, refusal("this is a data server: it answers GetBlob (the run's data "
                                      "manifest and chunks) only",
                                      /*may_rejoin=*/true));
        return;
      }
      if (service.answer(server, in.curve_key, in.route, in.message.get_blob(), now())) return;
      wire::Envelope reply;
      reply.mutable_not_found()->set_what(in.message.get_blob().hash().substr(0, 32) +
                                          " not held: this server serves data " + service.hex());
      server.send(in.route, reply);
    });
    if (now() - last_report >= o.report_seconds) {
      last_report = now();
      nlohmann::json row = counters_json(service.counters());
      row["event"] = "data_served";
      row["dropped"] = gate.dropped_total();
      row["refused"] = s.refused;
      gate.report(now());  // forgets the buckets that refilled
      events.write(std::move(row));
    }
  }
  s.counters = service.counters();
  s.dropped = gate.dropped_total();
  s.seconds = now();
  nlohmann::json row = counters_json(s.counters);
  row["event"] = "data_serve_stop";
  row["dropped"] = s.dropped;
  row["refused"] = s.refused;
  row["seconds"] = s.seconds;
  events.write(std::move(row));
  return s;
}

}  // namespace agora::serve
