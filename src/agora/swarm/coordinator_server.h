// The swarm coordinator as a process (`agora swarm serve`, docs/swarm.md section 4): the clock
// and membership of a swarm whose replicas are `agora swarm peer` processes. It holds no
// parameters and no libtorch: it answers each peer's hello and polls with a SwarmView from
// SwarmSchedule (schedule.h), which says everything, and relays each stage group's DeMo
// contributions (small: top-k of a chunked DCT) to the group.
//
// Admission: the CURVE handshake authenticates every connection (net/curve_socket.h; an
// allowlist with --allowlist); a hello must name the ed25519 key the handshake proved and the
// run's fingerprint (the model, seed, data, steps, batch, [optimizer], [schedule], [pipeline]:
// pipeline/stage_checkpoint.h), so a peer started with another config is refused with a reason.
// Polls from a key that has not said hello are answered with a refusal. Each key's messages are
// rate-bounded (a token bucket), strangers' hellos by one shared bucket.
//
// Durability: OUT/state.db (coordinator_store.h). After each batch of messages in which the
// schedule decided something it saves, and only then sends the batch's answers; started again
// on the same OUT after a kill, it resumes the unfinished run there (swarm_restored).
//
// Output: OUT/events.jsonl (swarm_serve with the endpoint, key and whether it resumed, then
// schedule.h's events: swarm_join, swarm_lost, swarm_waiting, swarm_resumed, swarm_step,
// swarm_move, swarm_diverged, swarm_struck, swarm_banned, swarm_restored, swarm_summary). A
// banned key's every message is answered with the ban (schedule.h, "Deadlines and strikes").
// With --http: GET /api/swarm (the run, each stage's replicas and state, "no replica" when a
// stage has none), / (a page that shows it live) and /metrics (agora_swarm_*,
// obs/metrics_catalogue.h).
#pragma once

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/obs/http_server.h"
#include "agora/swarm/schedule.h"

namespace agora {

struct SwarmServerOptions {
  std::string listen = "tcp://0.0.0.0:7800";
  net::Admission admission;
  std::optional<obs::HttpAddress> http;
  std::string fingerprint;  // the run's (stage_run_fingerprint), raw bytes
  SwarmScheduleOptions schedule;
  std::filesystem::path out = "runs/swarm";
  double linger_seconds = 3;  // answering "finished" after the last step
  double messages_per_second = 400, burst = 2000;
  // A poll carries a stage's DeMo contribution; a larger message is dropped by the socket. The
  // CLI sets it from the largest stage (12 bytes per parameter and 1 MiB).
  size_t max_message_bytes = size_t{256} << 20;
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
  // The run's token folder, served to replicas without a copy (serve/data_mount.h); empty: none.
  // The CLI sets it when the run config names data.hash and the folder holds that data.
  std::filesystem::path data_dir;
};

// Serves until the run is finished (and lingered) or *stop. Returns the summary (schedule.h).
// Throws Error when the address cannot be bound or the output folder written.
nlohmann::json serve_swarm(const net::Identity& identity, const SwarmServerOptions& options);

}  // namespace agora
