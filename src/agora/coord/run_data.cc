#include "agora/coord/run_data.h"

#include <fmt/format.h>

#include <filesystem>

#include "agora/core/error.h"
#include "agora/obs/log.h"

namespace agora::coord {

std::unique_ptr<serve::DataService> serve_run_data(
    RunConfig& config, const std::function<void(const std::string&)>& log) {
  const std::filesystem::path dir = config.data.dir;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) {
    log(fmt::format("no token folder {} on this machine: members need their own copy (--data)",
                    dir.string()));
    return nullptr;
  }
  std::unique_ptr<serve::DataService> data;
  try {
    data = std::make_unique<serve::DataService>(dir);
  } catch (const Error& e) {
    obs::log_warn({}, fmt::format("not serving the run's data: {}", e.what()));
    return nullptr;
  }
  if (!config.data.hash.empty() && config.data.hash != data->hex()) {
    fail(
        "data folder {} holds other tokens than the run config's data.hash: its hash is {}, "
        "data.hash is {}; point data.dir at the run's tokens, or drop data.hash",
        dir.string(), data->hex(), config.data.hash);
  }
  config.data.hash = data->hex();
  uint64_t bytes = 0;
  for (const auto& shard : data->identity().shards) bytes += shard.bytes;
  log(fmt::format("serving the run's data {} to members: {} shards, {:.1f} MiB from {}",
                  data->hex(), data->identity().shards.size(),
                  static_cast<double>(bytes) / (1 << 20), dir.string()));
  return data;
}

}  // namespace agora::coord
