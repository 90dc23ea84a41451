#include "run_data.h"

#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/data/data_identity.h"

namespace agora::cli {
namespace fs = std::filesystem;

fs::path data_cache_for(const RunConfig& config, const std::string& cache) {
  std::error_code ec;
  const bool local = fs::is_directory(config.data.dir, ec);
  if (cache.empty() && local) {
    if (!config.data.hash.empty()) check_data_identity(config.data.dir, config.data.hash);
    return {};
  }
  if (config.data.hash.empty()) {
    fail(
        "{}: fetching the run's data needs its data.hash in the run config (agora data hash DIR "
        "on the server's folder), to check what arrives; or give this machine a copy as data.dir",
        local ? "--data-cache"
              : fmt::format("data.dir {} is not on this machine", config.data.dir));
  }
  return cache.empty() ? fs::path("agora-data") / config.data.hash.substr(0, 16) : fs::path(cache);
}

std::unique_ptr<serve::DataMount> mount_run_data(RunConfig& config, const net::Identity& identity,
                                                 const std::string& endpoint,
                                                 const net::PublicKey& server_key,
                                                 const std::string& cache) {
  const fs::path folder = data_cache_for(config, cache);
  if (folder.empty()) return nullptr;
  serve::DataMountOptions o;
  o.endpoint = endpoint;
  o.server_key = server_key;
  o.data_hash = config.data.hash;
  o.cache_dir = folder;
  o.progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  auto mount = serve::DataMount::open(identity, o);
  config.data.dir = folder.string();
  return mount;
}

}  // namespace agora::cli
