// agora swarm serve / agora swarm peer: a swarm of unequal replicas per pipeline stage across
// processes, its coordinator and its replicas (docs/swarm.md section 4).
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <thread>

#include "admission_options.h"
#include "agora/core/error.h"
#include "agora/data/data_identity.h"
#include "agora/data/data_meta.h"
#include "agora/net/envelope.h"
#include "agora/net/identity.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_checkpoint.h"
#include "agora/swarm/contribution_check.h"
#include "agora/swarm/coordinator_server.h"
#include "agora/swarm/swarm_peer.h"
#include "commands.h"
#include "run_data.h"
#include "signals.h"

namespace agora::cli {
namespace {

// What every swarm process checks the same way, before anything is read or bound: a pipeline, a
// batch of whole micro-batches, DeMo without look-ahead.
RunConfig swarm_config(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig config = RunConfig::load(path, overrides);
  if (config.pipeline.stages < 2) {
    fail("agora swarm: pipeline.stages is {} (allowed: 2 or more; a swarm serves pipeline stages)",
         config.pipeline.stages);
  }
  if (config.train.batch_size % config.train.micro_batch_size != 0) {
    fail("agora swarm: train.batch_size {} is not a multiple of train.micro_batch_size {}",
         config.train.batch_size, config.train.micro_batch_size);
  }
  if (config.demo.lookahead) {
    fail("agora swarm: demo.lookahead is not available in a swarm (allowed: false)");
  }
  return config;
}

// The vocabulary from the data's meta.json, when the config leaves it to the data (a replica
// fetching the run's data has it once the fetch began).
void resolve_vocab(RunConfig& config) {
  if (config.model.vocab_size == 0) {
    config.set_vocab_size(read_data_meta(config.data.dir).vocab_size);
  }
}

void add_swarm_serve(CLI::App& swarm) {
  struct Args {
    std::string config, key, http = "off", out = "runs/swarm";
    std::vector<std::string> overrides;
    std::vector<double> costs;
    SwarmServerOptions options;
    AdmissionOptions admission;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = swarm.add_subcommand(
      "serve", "Keep a swarm's clock and membership: hand out micro-batches, relay stage rounds");
  auto& o = args->options;
  auto& s = o.schedule;
  cmd->add_option("--config", args->config, "Run config (TOML): model, data, [pipeline], [demo]")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set train.steps=100");
  cmd->add_option("--key", args->key, "The coordinator's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--listen", o.listen, "Where peers connect (tcp://HOST:PORT)")
      ->capture_default_str();
  add_admission_options(*cmd, args->admission, "peers");
  cmd->add_option("--http", args->http, "Serve the live page and /api/swarm on HOST:PORT")
      ->capture_default_str();
  cmd->add_option("--peers", s.start_peers, "Ready peers before the first step")
      ->capture_default_str();
  cmd->add_option("--peer-timeout", s.peer_timeout, "Seconds of silence before a peer is lost")
      ->capture_default_str();
  cmd->add_option("--rebalance", s.rebalance_seconds,
                  "Seconds between rebalancing moves (0: never)")
      ->capture_default_str();
  cmd->add_option("--min-gain", s.min_gain, "The least bottleneck gain a move must bring")
      ->capture_default_str();
  cmd->add_option("--max-peers", s.max_members, "Members at most")->capture_default_str();
  cmd->add_option("--min-deadline", s.min_deadline,
                  "The least seconds a replica may hold micro-batches or a round")
      ->capture_default_str();
  cmd->add_option("--deadline-factor", s.deadline_factor,
                  "Deadlines are this many times the measured time (at least --min-deadline)")
      ->capture_default_str();
  cmd->add_option("--max-strikes", s.max_strikes,
                  "Strikes (missed deadlines, refused contributions) that ban a replica")
      ->capture_default_str();
  cmd->add_option("--costs", args->costs,
                  "Each stage's relative compute, for rebalancing (default: from the cut)")
      ->delimiter(',');
  cmd->add_option("--out", args->out,
                  "Folder for events.jsonl and state.db (started again on the same folder, the "
                  "coordinator resumes an unfinished run there)")
      ->capture_default_str();
  cmd->callback([args] {
    RunConfig config = swarm_config(args->config, args->overrides);
    resolve_vocab(config);
    SwarmServerOptions options = args->options;
    options.out = args->out;
    options.fingerprint = stage_run_fingerprint(config);
    options.schedule.stages = config.pipeline.stages;
    options.schedule.steps = config.train.steps;
    options.schedule.micro_batch_size = config.train.micro_batch_size;
    options.schedule.micro_batches = config.train.batch_size / config.train.micro_batch_size;
    // A poll carries at most its stage's DeMo contribution, whose size the layout fixes; the
    // coordinator decodes each against it before the round keeps it (contribution_check.h).
    std::vector<PayloadLayout> layouts = swarm_contribution_layouts(config);
    size_t largest = 0;
    for (const PayloadLayout& layout : layouts) largest = std::max(largest, encoded_size(layout));
    options.max_message_bytes = net::fits_one_message(
        largest + (size_t{1} << 20),
        fmt::format("a DeMo contribution of {} bytes (the largest stage's)", largest));
    options.schedule.check_contribution = contribution_checker(std::move(layouts));
    options.schedule.costs = !args->costs.empty()
                                 ? args->costs
                                 : swarm_stage_costs(config.model, config.pipeline.stages);
    if (args->http != "off") options.http = obs::parse_http_address(args->http, "--http");
    options.admission = admission_of(args->admission);
    options.stop = &stop_requested();
    std::error_code ec;
    if (!config.data.hash.empty() && std::filesystem::is_directory(config.data.dir, ec)) {
      check_data_identity(config.data.dir, config.data.hash);
      options.data_dir = config.data.dir;  // served to replicas without a copy
    }
    const net::Identity identity = net::Identity::load(args->key);
    const nlohmann::json s = serve_swarm(identity, options);
    fmt::print(
        "{} steps, {} samples in {:.1f} s: {:.2f} samples/s, ideal {:.2f} ({:.0f}%); loss {:.4f} "
        "-> {:.4f}; lost {}, moves {}, retried {}\nevents {}\n",
        s["steps"].get<int64_t>(), s["samples"].get<int64_t>(), s["seconds"].get<double>(),
        s["samples_per_second"].get<double>(), s["ideal_samples_per_second"].get<double>(),
        100 * s["efficiency"].get<double>(), s["first_loss"].get<double>(),
        s["last_loss"].get<double>(), s["lost"].get<int64_t>(), s["moves"].get<int64_t>(),
        s["retried"].get<int64_t>(), (options.out / "events.jsonl").string());
  });
}

void add_swarm_peer(CLI::App& swarm) {
  struct Args {
    std::string config, key, coordinator_key, events, out, state_dir, data_cache;
    std::vector<std::string> overrides;
    SwarmPeerOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd =
      swarm.add_subcommand("peer", "Serve a pipeline stage as one of its replicas in a swarm");
  auto& o = args->options;
  cmd->add_option("--config", args->config, "The run config the coordinator was started with")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key (as the coordinator did)");
  cmd->add_option("--key", args->key, "This peer's identity (agora keygen --out FILE)")->required();
  cmd->add_option("--coordinator", o.coordinator, "The coordinator (tcp://HOST:PORT)")->required();
  cmd->add_option("--coordinator-key", args->coordinator_key, "Its public key (64 hex)")
      ->required();
  cmd->add_option("--listen", o.listen, "Where replicas of the previous stage connect")->required();
  cmd->add_option("--advertise", o.advertise,
                  "The endpoint others dial (default: --listen, 0.0.0.0 as 127.0.0.1)");
  cmd->add_option("--stage", o.stage, "The stage to serve (-1: the coordinator chooses)")
      ->capture_default_str();
  cmd->add_option("--speed", o.speed, "With --pace-unit: this machine's speed (1 = reference)")
      ->capture_default_str();
  cmd->add_option("--pace-unit", o.pace_unit,
                  "Play a slower machine: seconds per sample at speed 1 (0: compute as fast as "
                  "this machine can)")
      ->capture_default_str();
  cmd->add_option("--costs", o.costs,
                  "With --pace-unit: each stage's relative compute (default: from the cut)")
      ->delimiter(',');
  cmd->add_option("--poll", o.poll_seconds, "Seconds between polls of the coordinator")
      ->capture_default_str();
  cmd->add_option("--in-flight", o.in_flight, "Stage 0: micro-batches in flight at once")
      ->capture_default_str();
  cmd->add_flag("--uniform", o.uniform_routing,
                "Route uniformly at random (the baseline), not by measured throughput");
  cmd->add_option("--timeout", o.timeout_seconds,
                  "Seconds before a silent coordinator or an unanswered micro-batch counts as lost")
      ->capture_default_str();
  cmd->add_option("--behave", o.behave,
                  "Tests and benchmarks only: a misbehaviour the swarm must hold: hold, mute, "
                  "liar, sign_flip, scale, zero or garbage")
      ->check(CLI::IsMember({"", "hold", "mute", "liar", "sign_flip", "scale", "zero", "garbage"}));
  cmd->add_option("--events", args->events, "Write JSON lines of what happened here");
  cmd->add_option("--out", args->out, "Write the stage file here at the end (merge-stages)");
  cmd->add_option("--data-cache", args->data_cache,
                  "Fetch the run's data from the coordinator into this folder, checked against "
                  "data.hash (the default, in agora-data/HASH, when data.dir is not on this "
                  "machine)");
  cmd->add_option("--state-dir", args->state_dir,
                  "Save the stage after every step, to bring it back if all its replicas die");
  cmd->callback([args] {
    RunConfig config = swarm_config(args->config, args->overrides);
    const net::Identity identity = net::Identity::load(args->key);
    // No copy here: the run's data from the coordinator, as it is read (serve/data_mount.h).
    std::unique_ptr<serve::DataMount> data = mount_run_data(
        config, identity, args->options.coordinator,
        net::key_from_hex(args->coordinator_key, "--coordinator-key"), args->data_cache);
    resolve_vocab(config);
    torch::set_num_threads(
        config.train.threads > 0
            ? static_cast<int>(config.train.threads)
            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    SwarmPeerOptions options = args->options;
    options.coordinator_key = net::key_from_hex(args->coordinator_key, "--coordinator-key");
    options.events = args->events;
    options.out_dir = args->out;
    options.state_dir = args->state_dir;
    options.stop = &stop_requested();
    const SwarmPeerSummary s = run_swarm_peer(config, identity, options);
    fmt::print(
        "stage {} at step {}: {} forwards, {} backwards, {} fetches, {} moves in {:.1f} s; "
        "parameters {}\n",
        s.stage, s.version, s.forwards, s.backwards, s.fetches, s.moves, s.seconds,
        s.parameter_hash.substr(0, 16));
  });
}

}  // namespace

void add_swarm_command(CLI::App& app) {
  auto* swarm = app.add_subcommand(
      "swarm", "A swarm across processes: unequal replicas per pipeline stage (docs/swarm.md)");
  swarm->require_subcommand(1);
  add_swarm_serve(*swarm);
  add_swarm_peer(*swarm);
}

}  // namespace agora::cli
