// agora async serve / agora async work: asynchronous data parallelism across processes, the
// outer server and its workers (docs/async.md).
#include <fmt/format.h>

#include <filesystem>

#include "admission_options.h"
#include "agora/async/async_worker.h"
#include "agora/async/outer_server.h"
#include "agora/core/error.h"
#include "agora/data/data_identity.h"
#include "agora/net/identity.h"
#include "agora/obs/progress.h"
#include "commands.h"
#include "run_data.h"
#include "signals.h"

namespace agora::cli {
namespace {

void add_async_serve(CLI::App& async) {
  struct Args {
    std::string config, key, http = "off", out = "runs/async-net";
    std::vector<std::string> overrides;
    bool f32 = false;
    OuterServerOptions options;
    AdmissionOptions admission;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = async.add_subcommand(
      "serve", "Hold the run's parameters: hand out rounds, check and apply pseudo-gradients");
  auto& o = args->options;
  cmd->add_option("--config", args->config, "Run config (TOML): model, data, inner AdamW, [diloco]")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set diloco.inner_steps=20");
  cmd->add_option("--key", args->key, "The server's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--listen", o.listen, "Where workers connect (tcp://HOST:PORT)")
      ->capture_default_str();
  add_admission_options(*cmd, args->admission, "workers");
  cmd->add_option("--http", args->http, "Serve /api/async and /metrics on HOST:PORT (off = none)")
      ->capture_default_str();
  cmd->add_option("--run-id", o.run_id, "The run's name, in every signature")
      ->capture_default_str();
  cmd->add_option("--method", o.method, "sync | async | dylu | lookahead | lookahead_discounted")
      ->capture_default_str();
  cmd->add_option("--workers", o.workers,
                  "Workers the run starts with; train.batch_size splits among them")
      ->capture_default_str();
  cmd->add_option("--inner-steps", o.inner_steps, "H (default: diloco.inner_steps)");
  cmd->add_option("--outer-lr", o.outer_lr, "Default: diloco.outer_lr");
  cmd->add_option("--outer-momentum", o.outer_momentum, "Default: diloco.outer_momentum");
  cmd->add_option("--outer-rule", o.outer_rule,
                  "The asynchronous methods' rule per arrival: nesterov, delayed_nesterov, "
                  "lookahead, lookahead_discounted, heloco (default: the method's as published)");
  cmd->add_flag("--f32", args->f32, "Pseudo-gradients as float32 (default: int8 rows)");
  cmd->add_option("--seconds", o.seconds, "The run's length once every worker has joined")
      ->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "Seconds between validated copies of theta")
      ->capture_default_str();
  cmd->add_option("--eval-windows", o.eval_windows,
                  "Validation windows (default: train.eval_windows)");
  cmd->add_option("--max-staleness", o.max_staleness,
                  "Refuse pseudo-gradients from parameters more versions old than this")
      ->capture_default_str();
  cmd->add_option("--strikes", o.max_strikes, "Strikes that ban a worker")->capture_default_str();
  cmd->add_option("--min-deadline", o.min_deadline,
                  "sync: the least seconds a round waits for a worker's piece")
      ->capture_default_str();
  cmd->add_option("--deadline-factor", o.deadline_factor,
                  "sync: a round's deadline is this many times H x the measured seconds per step")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Folder for events.jsonl and the checkpoint 'final'")
      ->capture_default_str();
  cmd->callback([args] {
    const RunConfig config = RunConfig::load(args->config, args->overrides);
    OuterServerOptions options = args->options;
    options.out = args->out;
    options.int8 = !args->f32;
    if (args->http != "off") options.http = obs::parse_http_address(args->http, "--http");
    options.admission = admission_of(args->admission);
    options.stop = &stop_requested();
    const net::Identity identity = net::Identity::load(args->key);
    const OuterServerSummary s = serve_outer(config, identity, options);
    std::string verdicts;
    for (const auto& [name, n] : s.verdicts) verdicts += fmt::format(" {} {}", name, n);
    fmt::print("{}: final val loss {:.4f} after {} updates, {} tokens in {}; deliveries:{}\n",
               options.method, s.final_val_loss, s.updates, s.tokens, format_duration(s.seconds),
               verdicts);
    fmt::print("events {}\ncheckpoint {}\n", (options.out / "events.jsonl").string(),
               (options.out / "final").string());
  });
}

void add_async_work(CLI::App& async) {
  struct Args {
    std::string config, key, server_key, log;
    std::vector<std::string> overrides;
    AsyncWorkerOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = async.add_subcommand(
      "work", "Train rounds of inner steps at this machine's pace and deliver pseudo-gradients");
  auto& o = args->options;
  cmd->add_option("--config", args->config, "The run config the server was started with")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key (as the server did)");
  cmd->add_option("--key", args->key, "This worker's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--server", o.server, "The server's address (tcp://HOST:PORT)")->required();
  cmd->add_option("--server-key", args->server_key, "The server's public key (hex)")->required();
  cmd->add_option("--step-seconds", o.step_seconds,
                  "Pad each inner step to this many seconds (play a slower machine)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", o.idle_timeout_seconds,
                  "Give up after this many seconds without an answer")
      ->capture_default_str();
  cmd->add_option("--behave", o.behaviour,
                  "honest, or (tests and benchmarks) a misbehaviour the server must hold: "
                  "scaled, replay, tiny, claim, sign_flip, zero, noise")
      ->capture_default_str();
  cmd->add_option("--log", args->log, "Write JSON lines of what happened here");
  cmd->add_option("--data-cache", o.data_cache,
                  "Fetch the run's data from the server into this folder, checked against "
                  "data.hash (the default, in agora-data/HASH, when data.dir is not on this "
                  "machine)");
  cmd->callback([args] {
    const RunConfig config = RunConfig::load(args->config, args->overrides);
    AsyncWorkerOptions options = args->options;
    check_async_worker_options(options);
    // Fetched after the worker's hello: the server answers members' fetches only.
    options.data_cache = data_cache_for(config, args->options.data_cache.string());
    options.server_key = net::key_from_hex(args->server_key, "--server-key");
    options.log = args->log;
    const net::Identity identity = net::Identity::load(args->key);
    const AsyncWorkerSummary s = run_async_worker(config, identity, options);
    std::string receipts;
    for (const auto& [verdict, n] : s.receipts) receipts += fmt::format(" {} {}", verdict, n);
    fmt::print("{} rounds, {} inner steps in {} ({:.0f}% computing), version {}; receipts:{}{}\n",
               s.rounds, s.steps, format_duration(s.seconds),
               100 * s.compute_seconds / std::max(1e-9, s.seconds), s.version, receipts,
               s.refused.empty() ? "" : "\nrefused by the server: " + s.refused);
    if (!s.refused.empty()) throw Error("the server banned this worker: " + s.refused);
  });
}

}  // namespace

void add_async_command(CLI::App& app) {
  auto* async = app.add_subcommand(
      "async", "Asynchronous data parallelism across processes: an outer server and workers");
  async->require_subcommand(1);
  add_async_serve(*async);
  add_async_work(*async);
}

}  // namespace agora::cli
