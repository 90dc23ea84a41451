// agora_probe: a stranger that knocks on any agora server (test-only; for
// tests/integration/serve_roles_test.py). Every role serves members through serve/members.h, so
// every role must treat a stranger alike; this probe checks it from outside, the same way for
// each role:
//
//   stranger   a fresh key sends a heartbeat without saying hello: the one refusal comes back
//   flood      a fresh key sends --flood heartbeats at once: the refusals that come back are
//              bounded by the strangers' budget, not by what was sent
//   oversized  a fresh key sends one frame of --oversized bytes (a heartbeat padded with an
//              unknown field): it is dropped, and the server still answers the next stranger
// "answers" counts every message that came back (a role closed at the handshake sends none);
// --ask sapo-groups sends a SAPO node's request instead of the heartbeat.
// With --get-tensor NAME it does only this instead: a fresh key asks for tensor NAME at every
// applied step from 0 to --up-to-step (a stranger guessing a swarm replica's version) and counts
// the TensorData and NotFound that come back (tests/integration/swarm_attack_test.py).
//
// Prints one JSON object on stdout. Exits 0 whatever the server did (the test judges), 2 for bad
// arguments.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "agora/net/curve_socket.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"
#include "agora/serve/poll.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What the stranger sends: a heartbeat (a member's message every role knows), or with
// --ask sapo-groups a SAPO node's request for a round's groups (which an open node would answer).
bool g_ask_sapo = false;
// Every message that came back, refusal or not: a role closed at the handshake sends none.
int g_answers = 0;

wire::Envelope heartbeat() {
  wire::Envelope e;
  if (g_ask_sapo) {
    e.mutable_sapo_get_groups()->set_round(1);
  } else {
    e.mutable_heartbeat();
  }
  return e;
}

// Refusals that reach `client` within `seconds`; the first one's reason in `reason`.
int refusals(net::Client& client, double seconds, nlohmann::json& first) {
  int n = 0;
  const auto started = Clock::now();
  while (since(started) < seconds) {
    serve::wait_readable(client.socket(), std::chrono::milliseconds(20));
    while (auto m = client.recv()) {
      ++g_answers;
      if (!m->has_refused()) continue;
      if (n++ == 0)
        first = {{"reason", m->refused().reason()}, {"may_rejoin", m->refused().may_rejoin()}};
    }
  }
  return n;
}

// A stranger's heartbeat, sent twice a second until a refusal comes back or `seconds` pass.
nlohmann::json knock(net::Context& context, const std::string& endpoint, const std::string& key,
                     double seconds) {
  const net::Identity id = net::Identity::generate();
  net::Client client(context, id, endpoint, key, net::DecodeLimits{});
  nlohmann::json first = nullptr;
  const auto started = Clock::now();
  while (first.is_null() && since(started) < seconds) {
    client.send(heartbeat());
    refusals(client, 0.5, first);
  }
  return {{"answered", !first.is_null()}, {"refusal", first}, {"seconds", since(started)}};
}

nlohmann::json get_tensor(net::Context& context, const std::string& endpoint,
                          const std::string& key, const std::string& name, uint64_t up_to,
                          double seconds) {
  const net::Identity id = net::Identity::generate();
  net::Client client(context, id, endpoint, key, net::DecodeLimits{});
  for (uint64_t step = 0; step <= up_to; ++step) {
    wire::Envelope e;
    e.mutable_get_tensor()->set_name(name);
    e.mutable_get_tensor()->set_applied_steps(step);
    client.send(e);
  }
  int data = 0, not_found = 0, other = 0;
  const auto started = Clock::now();
  while (since(started) < seconds) {
    serve::wait_readable(client.socket(), std::chrono::milliseconds(20));
    while (auto m = client.recv()) {
      if (m->has_tensor_data()) {
        ++data;
      } else if (m->has_not_found()) {
        ++not_found;
      } else {
        ++other;
      }
    }
  }
  return {{"asked", up_to + 1}, {"tensor_data", data}, {"not_found", not_found}, {"other", other}};
}

int run(int argc, char** argv) {
  std::string endpoint, server_key_hex, tensor;
  uint64_t up_to = 50;
  int flood = 2000;
  size_t oversized = size_t{2} << 20;
  double seconds = 10;
  CLI::App app{"agora_probe: knock on an agora server as a stranger"};
  app.add_option("--endpoint", endpoint, "The server (tcp://HOST:PORT)")->required();
  app.add_option("--server-key", server_key_hex, "Its public key (64 hex)")->required();
  app.add_option("--flood", flood, "Heartbeats the flooding stranger sends at once");
  app.add_option("--oversized", oversized, "Bytes of the oversized frame");
  app.add_option("--seconds", seconds, "How long to wait for each answer");
  app.add_option("--get-tensor", tensor, "Only ask for this tensor at every step (see above)");
  app.add_option("--up-to-step", up_to, "With --get-tensor: the last applied step asked for");
  std::string ask = "heartbeat";
  app.add_option("--ask", ask, "What the stranger sends: heartbeat or sapo-groups")
      ->check(CLI::IsMember({"heartbeat", "sapo-groups"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  g_ask_sapo = ask == "sapo-groups";
  const std::string key = net::key_from_hex(server_key_hex, "--server-key");
  net::Context context;
  nlohmann::json out;
  if (!tensor.empty()) {
    out["get_tensor"] = get_tensor(context, endpoint, key, tensor, up_to, std::min(seconds, 3.0));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  out["stranger"] = knock(context, endpoint, key, seconds);

  {
    const net::Identity id = net::Identity::generate();
    net::Client client(context, id, endpoint, key, net::DecodeLimits{}, /*receive_queue=*/100000);
    for (int i = 0; i < flood; ++i) client.send(heartbeat());
    nlohmann::json first = nullptr;
    const int answered = refusals(client, 3.0, first);
    out["flood"] = {{"sent", flood}, {"refusals", answered}};
  }
  // Let the strangers' bucket refill before the next knock.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  {
    const net::Identity id = net::Identity::generate();
    net::Client client(context, id, endpoint, key, net::DecodeLimits{});
    // A valid heartbeat followed by an unknown length-delimited field (number 1000): parsable,
    // so only the size limit can refuse it.
    std::string frame = net::encode_envelope(heartbeat());
    frame += "\xc2\x3e";  // field 1000, wire type 2
    size_t n = oversized;
    while (n >= 0x80) {
      frame += static_cast<char>((n & 0x7f) | 0x80);
      n >>= 7;
    }
    frame += static_cast<char>(n);
    frame.append(oversized, 'x');
    client.socket().send(zmq::buffer(frame), zmq::send_flags::dontwait);
    nlohmann::json first = nullptr;
    const int answered = refusals(client, 2.0, first);
    out["oversized"] = {{"bytes", frame.size()},
                        {"refusals", answered},
                        {"after", knock(context, endpoint, key, seconds)}};
  }
  out["answers"] = g_answers;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace agora

int main(int argc, char** argv) {
  try {
    return agora::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "agora_probe: %s\n", e.what());
    return 2;
  }
}
