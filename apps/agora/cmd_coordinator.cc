// agora coordinator: keep the clock and the membership of a decentralized run.
#include <fmt/format.h>

#include "agora/coord/service.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {

void add_coordinator_command(CLI::App& app) {
  struct Args {
    std::string config, key;
    std::vector<std::string> overrides;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("coordinator", "Coordinate a decentralized run ([network] in "
                                                "the run config)");
  cmd->add_option("--config", args->config, "Run config (TOML) with a [network] section")
      ->required();
  cmd->add_option("--key", args->key, "The coordinator's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set network.min_peers=3");
  cmd->add_flag("--json", args->json, "Print one JSON object per line (steps and events)");
  cmd->callback([args] {
    const auto& stop = stop_requested();
    const RunConfig config = RunConfig::load(args->config, args->overrides);
    const net::Identity identity = net::Identity::load(args->key);
    coord::ServiceOptions options;
    options.base_dir = std::filesystem::current_path();
    options.json_lines = args->json;
    const uint64_t steps = coord::run_coordinator(config, identity, options, stop);
    fmt::print(stderr, "coordinator: stopped with {} finalized steps\n", steps);
  });
}

}  // namespace agora::cli
