// agora coordinator: keep the clock and the membership of a decentralized run.
#include <fmt/format.h>

#include "agora/coord/service.h"
#include "agora/obs/log.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {

void add_coordinator_command(CLI::App& app) {
  struct Args {
    std::string config, key;
    std::vector<std::string> overrides;
    bool json = false;
    std::string http = "127.0.0.1:7480", log_format = "text";
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("coordinator",
                                 "Coordinate a decentralized run ([network] in "
                                 "the run config)");
  cmd->add_option("--config", args->config, "Run config (TOML) with a [network] section")
      ->required();
  cmd->add_option("--key", args->key, "The coordinator's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set network.min_peers=3");
  cmd->add_flag("--json", args->json, "Print one JSON object per line (steps and events)");
  cmd->add_option("--http", args->http,
                  "Serve the web page, JSON API and /metrics on HOST:PORT (0.0.0.0:7480 = every "
                  "interface; port 0 = any free port; off = no HTTP)")
      ->capture_default_str();
  cmd->add_option("--log-format", args->log_format, "Log lines on stderr: text or json")
      ->capture_default_str();
  cmd->callback([args, cmd] {
    obs::configure_logging("coordinator", obs::parse_log_format(args->log_format));
    const auto& stop = stop_requested();
    const RunConfig config = RunConfig::load(args->config, args->overrides);
    const net::Identity identity = net::Identity::load(args->key);
    coord::ServiceOptions options;
    options.base_dir = std::filesystem::current_path();
    options.json_lines = args->json;
    if (args->http != "off") options.http = obs::parse_http_address(args->http, "--http");
    options.http_required = cmd->count("--http") > 0;
    const uint64_t steps = coord::run_coordinator(config, identity, options, stop);
    obs::log_info({steps, ""}, fmt::format("stopped with {} finalized steps", steps));
  });
}

}  // namespace agora::cli
