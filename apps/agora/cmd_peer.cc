// agora peer: join a decentralized run and train until it finishes or Ctrl-C.
#include <fmt/format.h>

#include "agora/obs/log.h"
#include "agora/peer/peer.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {

void add_peer_command(CLI::App& app) {
  struct Args {
    std::string coordinator, coordinator_key, key, data, data_cache, checkpoint_dir;
    std::string listen = "tcp://0.0.0.0:*", advertise;
    int64_t threads = 0;
    size_t data_peers = 8;
    double slowdown = 1.0;
    double join_timeout = 60;
    bool quiet = false;
    std::string metrics, log_format = "text";
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("peer", "Join a decentralized run as a training peer");
  cmd->add_option("--coordinator", args->coordinator, "The coordinator, tcp://HOST:PORT")
      ->required();
  cmd->add_option("--coordinator-key", args->coordinator_key,
                  "The coordinator's public key (64 hex characters)")
      ->required();
  cmd->add_option("--key", args->key, "This peer's identity (agora keygen --out FILE)")->required();
  cmd->add_option("--data", args->data,
                  "This machine's copy of the run's token folder (default: fetch it from the "
                  "coordinator, checked against the run's data hash)");
  cmd->add_option("--data-cache", args->data_cache,
                  "Where the data fetched from the coordinator goes (default: "
                  "agora-data/HASH when the run's data.dir is not on this machine)");
  cmd->add_option("--data-peers", args->data_peers,
                  "Members asked for the run's data before the coordinator (0: the coordinator "
                  "only)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Where to write checkpoints if the coordinator makes this peer a checkpointer");
  cmd->add_option("--listen", args->listen,
                  "Where to serve payloads and parameters to other peers (tcp://IP:PORT; * = any "
                  "free port)");
  cmd->add_option("--advertise", args->advertise,
                  "The endpoint other peers dial to reach --listen (tcp://PUBLIC-IP:PORT)");
  cmd->add_option("--threads", args->threads, "Compute threads (default: the run config's)");
  cmd->add_option("--slowdown", args->slowdown, "Testing: make compute this many times slower")
      ->check(CLI::Range(1.0, 100.0))
      ->group("");
  cmd->add_option("--join-timeout", args->join_timeout,
                  "Seconds to wait for the coordinator's welcome before giving up");
  cmd->add_flag("--quiet", args->quiet, "No per-round lines");
  cmd->add_option("--metrics", args->metrics,
                  "Serve Prometheus metrics at http://HOST:PORT/metrics (0 = any free port; "
                  "default: off)");
  cmd->add_option("--log-format", args->log_format, "Log lines on stderr: text or json")
      ->capture_default_str();
  cmd->callback([args] {
    obs::configure_logging("peer", obs::parse_log_format(args->log_format));
    const auto& stop = stop_requested();
    const net::Identity identity = net::Identity::load(args->key);
    peer::PeerOptions o;
    o.coordinator = args->coordinator;
    o.coordinator_key = net::key_from_hex(args->coordinator_key, "--coordinator-key");
    o.data = args->data;
    o.data_cache = args->data_cache;
    o.data_peers = args->data_peers;
    if (!o.data.empty() && !o.data_cache.empty()) {
      throw CLI::ValidationError("--data-cache",
                                 "give --data (a local copy) or --data-cache (fetch), not both");
    }
    o.checkpoint_dir = args->checkpoint_dir;
    o.listen = args->listen;
    o.advertise = args->advertise;
    o.threads = args->threads;
    o.slowdown = args->slowdown;
    o.progress = !args->quiet;
    o.join_timeout_seconds = args->join_timeout;
    if (!args->metrics.empty() && args->metrics != "off") {
      o.metrics = obs::parse_http_address(args->metrics, "--metrics");
    }
    const peer::PeerSummary s = peer::run_peer(identity, o, stop);
    fmt::print("rounds trained {}, steps applied {}, parameters {}\n", s.rounds_trained,
               s.applied_steps, s.state_hash.substr(0, 16));
    if (s.wall_seconds > 0) {
      fmt::print("compute {:.1f} s of {:.1f} s wall ({:.1f}% utilisation)\n", s.compute_seconds,
                 s.wall_seconds, 100.0 * s.compute_seconds / s.wall_seconds);
    }
    if (!s.checkpoint.empty()) fmt::print("checkpoint {}\n", s.checkpoint.string());
    if (s.data_bytes_fetched > 0) {
      fmt::print("data fetched {:.1f} MiB, {:.1f} MiB of it from other members\n",
                 static_cast<double>(s.data_bytes_fetched) / (1 << 20),
                 static_cast<double>(s.data_bytes_from_peers) / (1 << 20));
    }
  });
}

}  // namespace agora::cli
