// agora data hash: a token folder's identity, the value a run config's data.hash names.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/core/hex.h"
#include "agora/data/data_identity.h"
#include "commands.h"

namespace agora::cli {

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
}

}  // namespace agora::cli
