// Where a role started from a run config gets its data: its own copy (data.dir, checked against
// data.hash), or the run's, fetched from the server it works for (serve/data_mount.h).
// `agora swarm peer`, `agora stage` and `agora async work` share these rules; `agora peer` has
// them in peer/session.cc, with the coordinator's run config.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "agora/config/run_config.h"
#include "agora/net/identity.h"
#include "agora/serve/data_mount.h"

namespace agora::cli {

// The folder to fetch the run's data into: `cache` when given, agora-data/<the data hash's
// first 16 digits> when config.data.dir is not on this machine, or empty (read data.dir, after
// checking it against data.hash when the config names one). Throws Error when fetching is needed
// but the config names no data.hash (nothing to check the fetched bytes against).
std::filesystem::path data_cache_for(const RunConfig& config, const std::string& cache);

// data_cache_for(), then the fetch: a mount on that folder from the server at `endpoint` (key
// `server_key`), with config.data.dir pointed at it. Null when the role reads its own copy.
std::unique_ptr<serve::DataMount> mount_run_data(RunConfig& config, const net::Identity& identity,
                                                 const std::string& endpoint,
                                                 const net::PublicKey& server_key,
                                                 const std::string& cache);

}  // namespace agora::cli
