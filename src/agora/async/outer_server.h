// OuterServer: the run's parameters in an asynchronous data-parallel run across processes, and
// the clock and membership of that run (docs/async.md).
//
// Workers (async_worker.h) connect over CURVE, say who they are, bring their copy of the
// parameters up to date (int8 deltas of the published parameters, train/published_policy.h,
// hash-checked), ask for work and deliver signed pseudo-gradients D = theta_pulled -
// theta_local. The server:
//   - hands out the work: a round of H inner steps (DyLU: H_w from the worker's measured pace,
//     async/rules.h), each on the next sequences_per_step = train.batch_size / workers fresh
//     sequences of the training set, so that no sequence is trained twice; one piece of work
//     per worker at a time;
//   - trusts nothing a worker claims: a delivery must be for the work the worker holds, signed
//     by its key over (run id, work id, payload), decode to the model's layout, be from
//     parameters at most max_staleness versions old, and pass the norm guard (async/rules.h).
//     Everything else strikes the worker (stale excepted); max_strikes strikes ban it.
//   - moves theta: per accepted arrival with the method's outer rule (optim/async_outer.h);
//     under `sync`, once a round's work from every one of `workers` workers is in, one
//     Nesterov step on their mean (synchronous DiLoCo, for comparison on the same machines).
//
// The run starts when `workers` workers have joined (so every method is timed from the same
// moment) and ends `seconds` later: workers asking for work are told it is over, for
// `linger_seconds`. theta is copied every `eval_every` seconds and validated after the run, so
// validation takes no time from the workers while they train.
//
// States: waiting (for `workers` joins), training, finishing (lingering), done.
//
// Bounded by what workers send (serve/members.h, the member table every role shares): workers by
// max_workers (a silent one is forgotten after two minutes, a banned one stays banned), one
// outstanding piece of work each, a token bucket of messages per worker and one for all
// strangers, parameter replies by bytes in flight.
//
// Restarts: nothing is sent before it is saved (async/outer_store.h, in out/state): each pass of
// the loop handles a batch of messages, saves once if anything a worker may hear of changed, and
// only then sends the batch's answers. Killed at any moment and started again with the same
// options and `out`, the server resumes at its last save, with its workers as members; a run
// that reached its length leaves the folder to a new run.
//
// Output in `out`: events.jsonl (async_start with the server's address and key, async_worker,
// async_delivery, async_eval, async_summary events), the final parameters as a checkpoint
// `final`. With `http`: /api/async (the run, the verdicts, each worker's accepted deliveries,
// strikes and pace) and /metrics (obs/metrics_catalogue.h, agora_async_*).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agora/async/rules.h"
#include "agora/config/run_config.h"
#include "agora/net/curve_socket.h"
#include "agora/net/identity.h"
#include "agora/obs/http_server.h"

namespace agora {

struct OuterServerOptions {
  std::string run_id = "async";
  std::string method = "lookahead";  // sync | async | dylu | lookahead | lookahead_discounted
  std::string listen = "tcp://0.0.0.0:7700";
  net::Admission admission;
  std::optional<obs::HttpAddress> http;  // /api/async (JSON) and /metrics (agora_async_*)
  int64_t workers = 4;         // the run starts with this many; the batch splits among them
  int64_t inner_steps = 0;     // H; 0 = diloco.inner_steps
  double outer_lr = 0;         // 0 = diloco.outer_lr
  double outer_momentum = -1;  // < 0 = diloco.outer_momentum
  // The asynchronous methods' rule per arrival: "" = the method's as published
  // (outer_rule_of_method; delayed Nesterov's N is `workers`), else a parse_outer_rule name.
  std::string outer_rule;
  bool int8 = true;            // pseudo-gradients as int8_rows, else float32
  double seconds = 300;        // the run's length from its start
  double eval_every = 30;      // seconds between copies of theta validated after the run
  int64_t eval_windows = 0;    // 0 = train.eval_windows
  int64_t max_staleness = 32;
  NormGuardOptions norm_guard;
  int max_strikes = 3;
  // sync: a round's deadline from its first hand-out, max(min_deadline, deadline_factor x H x
  // the lower median of the workers' measured seconds per inner step); before anything is
  // measured, min_deadline x deadline_factor. Work held past it lapses and strikes its worker;
  // a round past it closes without the workers that took no work, and strikes them.
  double min_deadline = 30;
  double deadline_factor = 4;
  int max_workers = 64;
  double worker_messages_per_second = 200, worker_burst = 1000;
  int64_t max_param_bytes_in_flight = int64_t{1} << 30;
  double linger_seconds = 3;
  std::filesystem::path out = "runs/async-net";
  bool progress = true;  // a status line on stderr every few seconds
  const std::atomic<bool>* stop = nullptr;
};

// Errors name the option, its value and what is allowed.
void validate(const OuterServerOptions& options, const RunConfig& config);

struct OuterEvalPoint {
  double seconds = 0;  // since the run started
  int64_t tokens = 0;  // trained in accepted deliveries so far
  int64_t updates = 0;
  double val_loss = 0;
};

struct OuterServerSummary {
  std::vector<OuterEvalPoint> curve;
  int64_t updates = 0, tokens = 0;
  std::map<std::string, int64_t> verdicts;  // deliveries by verdict
  double staleness_mean = 0;
  int64_t staleness_max = 0;
  double bytes_per_delivery = 0;  // the latest accepted delivery's payload
  double final_val_loss = 0;
  double seconds = 0;
  std::map<std::string, int64_t> banned;  // worker key (hex) -> strikes
};

// Serves until the run is done. Throws Error when the address cannot be bound.
OuterServerSummary serve_outer(const RunConfig& config, const net::Identity& identity,
                               const OuterServerOptions& options);

}  // namespace agora
