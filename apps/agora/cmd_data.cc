// agora data hash: a token folder's identity, the value a run config's data.hash names.
// agora data serve: the folder served to a run's members (serve/data_server.h).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "admission_options.h"
#include "agora/core/hex.h"
#include "agora/data/data_identity.h"
#include "agora/obs/progress.h"
#include "agora/serve/data_server.h"
#include "commands.h"
#include "signals.h"

namespace agora::cli {

namespace {

void add_data_serve(CLI::App& data) {
  struct Args {
    std::string dir, key, listen = "tcp://0.0.0.0:7600", events;
    double rate_mib = 64;
    AdmissionOptions admission;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = data.add_subcommand(
      "serve",
      "Serve a token folder to a run's members: the roles that fetch their data from the run "
      "(agora stage --data-from, or any role pointed here) check every chunk against data.hash");
  cmd->add_option("--data", args->dir, "The folder of token shards (agora tokenize --out)")
      ->required();
  cmd->add_option("--key", args->key, "This server's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--listen", args->listen, "Where members connect (tcp://HOST:PORT)")
      ->capture_default_str();
  add_admission_options(*cmd, args->admission, "members");
  cmd->add_option("--rate", args->rate_mib, "MiB/s each member may take, on average")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--events", args->events, "Write JSON lines (data_serve, data_served) here");
  cmd->callback([args] {
    serve::DataServerOptions o;
    o.listen = args->listen;
    o.admission = admission_of(args->admission);
    o.data_dir = args->dir;
    o.limits.bytes_per_second = args->rate_mib * (1 << 20);
    o.limits.burst_bytes = std::max(o.limits.burst_bytes, o.limits.bytes_per_second / 4);
    o.events = args->events;
    o.stop = &stop_requested();
    const net::Identity identity = net::Identity::load(args->key);
    o.on_bound = [&](const std::string& endpoint, const std::string& hash) {
      fmt::print(stderr, "data server on {} (key {})\nserving data {} from {}\n", endpoint,
                 net::key_to_hex(identity.public_key()), hash, args->dir);
    };
    const serve::DataServerSummary s = serve::run_data_server(identity, o);
    fmt::print("served {} chunks and {} manifests, {} in {}; {} answered busy, {} dropped\n",
               s.counters.chunks, s.counters.manifests,
               format_bytes(static_cast<double>(s.counters.bytes)), format_duration(s.seconds),
               s.counters.busy, s.dropped);
  });
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "What a run's token folder holds");
  data->require_subcommand(1);
  struct Args {
    std::string dir;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* hash = data->add_subcommand(
      "hash",
      "Print the folder's data hash (put it in the run config as data.hash so every "
      "member checks its folder against it)");
  hash->add_option("dir", args->dir, "A folder of token shards (agora tokenize --out)")->required();
  hash->add_flag("--json", args->json, "Every shard's hash and size too, as JSON");
  hash->callback([args] {
    const DataIdentity identity = data_identity(args->dir);
    if (!args->json) {
      fmt::print("{}\n", identity.hex());
      return;
    }
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& shard : identity.shards) {
      shards.push_back({{"name", shard.name},
                        {"bytes", shard.bytes},
                        {"chunks", shard.chunk_hashes.size()},
                        {"hash", hex_encode(shard.hash)}});
    }
    fmt::print("{}\n", nlohmann::json{{"hash", identity.hex()},
                                      {"chunk_bytes", DataIdentity::kChunkBytes},
                                      {"shards", shards}}
                           .dump());
  });
  add_data_serve(*data);
}

}  // namespace agora::cli
