// A worker of an asynchronous data-parallel run (docs/async.md): it trains rounds of inner
// steps at its own pace and delivers each round's pseudo-gradient to the outer server
// (outer_server.h).
//
// It builds the model from the run config and its seed, checks that the server's run starts
// from the same parameters (by state hash), and loops: bring its copy of the parameters up to
// the newest version (int8 deltas, or the whole when too far behind, each checked against the
// state hash the server sent), ask for work, load the parameters into its model (its inner
// AdamW moments carry over from round to round, as in DiLoCo), train the steps on the sequences
// it was handed, and deliver D = theta_pulled - theta_local, encoded as the run says (int8_rows
// or float32) and signed. It stops when the server says the run is over, when it is banned, or
// when the server has not answered for `idle_timeout_seconds`.
//
// `step_seconds` pads each inner step with sleep to that many seconds: a benchmark's way to play
// a slower machine on a fast one. `behaviour` makes it misbehave, for the server's tests:
// `scaled` multiplies D by 1000, `replay` sends every delivery twice, `tiny` trains nothing and
// delivers a D of 1e-6 everywhere at once (as often as it gets work: issue 38's attack on the
// server's median), `claim` never fetches parameters and says it holds the newest. For
// bench/poisoning, three that train honestly and deliver something else: `sign_flip` sends -D,
// `zero` an all-zero D, `noise` Gaussian values as large as D's (per tensor).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "agora/config/run_config.h"
#include "agora/net/identity.h"

namespace agora {

struct AsyncWorkerOptions {
  std::string server;  // "tcp://host:port"
  net::PublicKey server_key;
  double step_seconds = 0;           // 0: as fast as this machine trains
  std::string behaviour = "honest";  // honest | scaled | replay | tiny | claim | sign_flip | ...
  double idle_timeout_seconds = 60;
  std::filesystem::path log;  // JSON lines; empty: none
  bool progress = true;
  // Not empty: fetch the run's data from the server into this folder (serve/data_mount.h),
  // checked against the config's data.hash, instead of reading data.dir.
  std::filesystem::path data_cache;
};

struct AsyncWorkerSummary {
  int64_t rounds = 0, steps = 0;
  std::map<std::string, int64_t> receipts;  // by verdict
  uint64_t version = 0;
  int64_t param_bytes = 0, delivered_bytes = 0;
  int64_t hash_mismatches = 0;
  double compute_seconds = 0;  // forward, backward and the inner step, without the padding
  bool finished = false;
  std::string refused;
  double seconds = 0;
  uint64_t data_bytes_fetched = 0;  // with data_cache
};

// Throws Error naming the option when `options` holds a value that is not allowed.
void check_async_worker_options(const AsyncWorkerOptions& options);

// Throws Error when the server cannot be reached, or its run starts from other parameters.
AsyncWorkerSummary run_async_worker(const RunConfig& config, const net::Identity& identity,
                                    const AsyncWorkerOptions& options);

}  // namespace agora
