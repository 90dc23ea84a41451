// agora link: a shaped TCP link between two processes on this machine, for tests and benchmarks.
// `agora link --listen 7001 --to 127.0.0.1:7000 --profile "rate=20mbit,delay=50ms,loss=1%"`
// forwards every connection made to port 7001 on to port 7000, with that bandwidth, one-way
// delay and loss in each direction (see agora/net/link_shaper.h), until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <memory>
#include <string>

#include "agora/core/error.h"
#include "agora/net/link_shaper.h"
#include "commands.h"

namespace agora::cli {
namespace {

// "host:port" or "[v6 address]:port".
std::pair<std::string, uint16_t> parse_host_port(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    fail("--to \"{}\": expected HOST:PORT, e.g. 127.0.0.1:7000", text);
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (error != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535)
    fail("--to \"{}\": port \"{}\" is not a number from 1 to 65535", text, port_text);
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace

void add_link_command(CLI::App& app) {
  auto listen_port = std::make_shared<uint16_t>(0);
  auto bind = std::make_shared<std::string>("127.0.0.1");
  auto to = std::make_shared<std::string>();
  auto profile = std::make_shared<std::string>();
  auto reverse = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "link", "Forward TCP connections through an emulated link (bandwidth, delay, jitter, loss)");
  cmd->add_option("--listen", *listen_port, "Port to accept connections on (0: any free port)")
      ->capture_default_str();
  cmd->add_option("--bind", *bind, "Address to listen on")->capture_default_str();
  cmd->add_option("--to", *to, "Where to forward each connection, HOST:PORT")->required();
  cmd->add_option("--profile", *profile,
                  "The link, both directions: rate=20mbit,delay=50ms,jitter=5ms,loss=1%,seed=7 "
                  "(omitted keys: unlimited, none)");
  cmd->add_option("--reverse-profile", *reverse,
                  "The link from the target back to the client, when it differs from --profile");
  cmd->callback([listen_port, bind, to, profile, reverse] {
    net::LinkShaperOptions options;
    options.listen_host = *bind;
    options.listen_port = *listen_port;
    std::tie(options.target_host, options.target_port) = parse_host_port(*to);
    options.to_target = net::parse_link_profile(*profile);
    if (reverse->empty()) {
      options.to_client = options.to_target;
      options.to_client.seed = options.to_target.seed + 1;  // same link, its own draws
    } else {
      options.to_client = net::parse_link_profile(*reverse);
    }

    // Block the signals before the shaper starts its threads (they inherit the mask), so that
    // only sigwait below ever sees them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    net::LinkShaper shaper(options);
    fmt::print("agora link: listening on {}:{}, forwarding to {}:{}; to target: {}; back: {}\n",
               options.listen_host, shaper.port(), options.target_host, options.target_port,
               net::to_string(options.to_target), net::to_string(options.to_client));
    std::fflush(stdout);  // a script waiting for the port reads it now, not at exit

    int signal_number = 0;
    sigwait(&signals, &signal_number);
    shaper.stop();
    const auto stats = shaper.stats();
    fmt::print(
        "agora link: stopped by {}; {} connections ({} could not reach the target); {} bytes to "
        "target, {} bytes back; {} + {} segments lost\n",
        signal_number == SIGINT ? "SIGINT" : "SIGTERM", stats.connections_accepted,
        stats.connect_failures, stats.bytes_to_target, stats.bytes_to_client,
        stats.segments_lost_to_target, stats.segments_lost_to_client);
  });
}

}  // namespace agora::cli
