// DataServer: `agora data serve`, a token folder served to a run's members and nothing else.
//
// For runs whose roles have no server of their own to fetch from (the stages of a pipeline), or
// whose operator wants the data's uplink off the coordinator's machine. It answers GetBlob for
// the folder's manifest and chunks (serve/data_service.h) to every key the admission lets
// through the CURVE handshake (an allowlist, or --open), and refuses everything else.
//
// Promises, the same as every server's (docs/security.md):
//   - each key's messages draw from a budget of its own (RateGate), its bytes from DataService's
//     per-member rate and queue, and every member's queued bytes together are bounded; a key
//     over a budget is dropped (messages) or answered "busy" (bytes), never buffered for;
//   - nothing grows with what members send (the gate and the service forget the idle);
//   - the loop checks `stop` at least every 5 ms and returns with the counters.
// One thread runs it.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>

#include "agora/net/identity.h"
#include "agora/serve/data_service.h"

namespace agora::serve {

struct DataServerOptions {
  std::string listen;  // tcp://HOST:PORT ("*" as the port: any free one, see on_bound)
  net::Admission admission;
  std::filesystem::path data_dir;
  DataLimits limits;
  double messages_per_second = 200, burst = 1000;  // each key
  std::filesystem::path events;                    // JSON lines; empty: none
  double report_seconds = 10;                      // a data_served event this often
  const std::atomic<bool>* stop = nullptr;
  // Called once the socket is bound, with the endpoint and the data hash (hex).
  std::function<void(const std::string& endpoint, const std::string& data_hash)> on_bound;
};

struct DataServerSummary {
  std::string data_hash;
  DataService::Counters counters;
  uint64_t dropped = 0;  // messages over a key's budget
  uint64_t refused = 0;  // messages that were not a GetBlob
  double seconds = 0;
};

// Serves until `stop`. Throws Error when the folder holds no token shards or `listen` cannot be
// bound.
DataServerSummary run_data_server(const net::Identity& identity, const DataServerOptions& options);

}  // namespace agora::serve
