// The pieces of serve/data_mount.cc that do not need the mount's state: the clock, the asks, and
// fetching the manifest. Internal to agora_serve.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "agora/data/data_manifest.h"
#include "agora/net/curve_socket.h"
#include "agora/serve/data_mount.h"

namespace agora::serve::data_mount_detail {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start);
double now_seconds();

// A GetBlob of `hash`.
wire::Envelope get_blob(const std::string& hash);

// What a NotFound answers: (the hash asked for, or empty when it does not say; the reason).
std::pair<std::string, std::string> split_not_found(const std::string& what);

// Asks the server for the manifest of data hash `root` (raw) until it answers, at most
// attempts x request_seconds; throws Error naming the server and why when there is none, or it
// is not the run's.
DataManifest fetch_manifest(net::Client& client, const DataMountOptions& o,
                            const std::string& root);

}  // namespace agora::serve::data_mount_detail
