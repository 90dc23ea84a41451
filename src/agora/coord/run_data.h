// The run's token folder, served by the coordinator to the members that have no copy
// (serve/data_service.h answers them; docs/data.md, "Data from the run").
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agora/config/run_config.h"
#include "agora/serve/data_service.h"

namespace agora::coord {

// With config.data.dir on this machine: the service over it, and config.data.hash set to its
// hash, so the run's fingerprint names the data and every member checks its copy, or what it
// fetches, against it. Null (logged) when the folder is not here or holds no shards. Throws
// Error when config.data.hash names other tokens than the folder holds.
std::unique_ptr<serve::DataService> serve_run_data(
    RunConfig& config, const std::function<void(const std::string&)>& log);

}  // namespace agora::coord
