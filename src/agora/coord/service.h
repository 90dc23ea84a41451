// The coordinator service: the thin shell around the state machine that owns the socket, the
// clock and the database.
//
// Loop: receive a batch of messages (at most 512, or 50 ms of handling) -> StateMachine::handle
// for each -> the tick when due (every 100 ms) -> save the new RunState to SQLite once -> only
// then send the batch's messages. The bound on a batch means a flood of messages cannot hold a
// deadline back; one save per batch means a burst costs one fsync. Each member (by its
// authenticated key) has a budget of 100 messages a second (bursts of 1000), and every key that
// has not joined shares one budget of the same size (serve/members.h: strangers): the excess is
// dropped before the state machine sees it, counted (agora_run_messages_throttled_total) and
// logged once every 10 s per sender. The loop itself is serve/poll.h's. A flooder is not struck for
// it: what it loses is its own messages (its heartbeats among them, so a persistent one ends up
// dropped for silence only if it floods hard enough to lose them all). Persisting before announcing
// means a peer never learns of a finalized step that a crash could forget; killed at any moment and
// restarted, the coordinator reloads the last saved state, calls resume(), and the peers (whose
// ZeroMQ connections reconnect by themselves) carry on.
//
// Authentication: the CURVE handshake gives each message's curve25519 key; a Join binds it to
// the ed25519 key the peer names (the two must correspond, or the join is refused), and every
// later message from that connection is handled as that member. A message from a key that never
// joined gets the one refusal of every role, serve::kNotAMember (may rejoin).
//
// What it prints: one table row per finalized step on stdout (step, loss, members, tokens/s,
// bytes per peer, what an fp32 all-reduce would have sent), and the state machine's lines and
// its own diagnostics through obs/log.h on stderr; with `json_lines` the rows and the state
// machine's lines are JSON objects on stdout instead (what `agora demo` reads).
//
// With `http`, it serves the web page, the JSON API and /metrics (coord/monitor.h) from an
// immutable view it publishes after handling messages; the HTTP threads never touch RunState.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>

#include "agora/config/run_config.h"
#include "agora/net/identity.h"
#include "agora/obs/http_server.h"

namespace agora::coord {

struct ServiceOptions {
  std::filesystem::path base_dir;  // relative network.allowlist / state_db resolve against this
  bool json_lines = false;
  // Where to serve the web page, the JSON API and /metrics (coord/monitor.h); none = off.
  std::optional<obs::HttpAddress> http;
  // False for the default address: a port already taken (a second coordinator on the machine)
  // then costs the page, with a warning, rather than the run.
  bool http_required = true;
  // Called once the socket and the HTTP server are up, with the endpoint bound and the HTTP
  // port (0 without HTTP): tests listen on "tcp://127.0.0.1:*" and port 0 and learn them here.
  std::function<void(const std::string& endpoint, int http_port)> on_listening;
};

// Runs until the run finishes and its members are released (state_machine.h, "Finishing"), and
// a few seconds more so that every peer hears it, or until *stop.
// Returns the number of finalized steps. Throws Error for a bad config, allowlist or database.
uint64_t run_coordinator(const RunConfig& config, const net::Identity& identity,
                         const ServiceOptions& options, const std::atomic<bool>& stop);

}  // namespace agora::coord
