// agora stage: run one stage of a pipelined run as its own process (docs/pipeline.md).
#include <fmt/format.h>
#include <torch/torch.h>

#include <thread>

#include "agora/core/error.h"
#include "agora/data/data_identity.h"
#include "agora/data/data_meta.h"
#include "agora/obs/progress.h"
#include "agora/peer/stage_process.h"
#include "commands.h"
#include "run_data.h"

namespace agora::cli {

void add_stage_command(CLI::App& app) {
  struct Args {
    std::string config, key, listen, next, next_key, prev_key, events, out, checkpoints;
    std::string data_from, data_from_key, data_cache;
    std::vector<std::string> overrides;
    int64_t stage = 0;
    double timeout = 60;
    bool quiet = false, resume = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "stage", "Run one stage of a pipelined run ([pipeline] stages > 1) as its own process");
  cmd->add_option("--config", args->config, "Run config (TOML), the same for every stage")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set train.steps=100");
  cmd->add_option("--stage", args->stage, "This process's stage, 0 to pipeline.stages - 1")
      ->required();
  cmd->add_option("--key", args->key, "This stage's identity (agora keygen --out FILE)")
      ->required();
  cmd->add_option("--listen", args->listen,
                  "Stages after the first: where the previous stage connects (tcp://IP:PORT)");
  cmd->add_option("--next", args->next, "Stages before the last: the next stage, tcp://HOST:PORT");
  cmd->add_option("--next-key", args->next_key, "The next stage's public key (64 hex characters)");
  cmd->add_option("--prev-key", args->prev_key,
                  "Stages after the first: the previous stage's public key; messages from any "
                  "other key are dropped (without it, the first key to connect is trusted)");
  cmd->add_option("--events", args->events, "Write JSON lines (start, step, finish) here");
  cmd->add_option("--out", args->out,
                  "Write this stage's parameters here at the end (stage_<i>.safetensors)");
  cmd->add_option("--checkpoints", args->checkpoints,
                  "Write this stage's state here every train.checkpoint_interval steps "
                  "(default: OUT/checkpoints with --out)");
  cmd->add_flag("--resume", args->resume,
                "Start from the newest checkpoint every stage holds (all stages need --resume)");
  cmd->add_option("--timeout", args->timeout,
                  "Seconds a neighbour may stay silent before this stage stops with an error "
                  "(at the start, while the stages are being launched: at least 600)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--data-from", args->data_from,
                  "Fetch the run's data (checked against data.hash) from this data server, "
                  "tcp://HOST:PORT (agora data serve), when data.dir is not on this machine or "
                  "--data-cache is given");
  cmd->add_option("--data-from-key", args->data_from_key, "The data server's public key (64 hex)");
  cmd->add_option("--data-cache", args->data_cache,
                  "With --data-from: fetch into this folder (default: agora-data/<data hash>)");
  cmd->add_flag("--quiet", args->quiet, "No progress lines");
  cmd->callback([args] {
    RunConfig config = RunConfig::load(args->config, args->overrides);
    const net::Identity identity = net::Identity::load(args->key);
    std::unique_ptr<serve::DataMount> data;  // read by the stage until it returns
    if (!args->data_from.empty()) {
      if (args->data_from_key.empty()) fail("agora stage --data-from needs --data-from-key HEX");
      data = mount_run_data(config, identity, args->data_from,
                            net::key_from_hex(args->data_from_key, "--data-from-key"),
                            args->data_cache);
    } else if (!args->data_cache.empty()) {
      fail("agora stage --data-cache needs --data-from ENDPOINT (the server to fetch from)");
    } else if (std::error_code ec; !std::filesystem::is_directory(config.data.dir, ec)) {
      fail(
          "data.dir {} is not on this machine: give this stage a copy of the run's token folder, "
          "or fetch it with --data-from tcp://HOST:PORT --data-from-key HEX (agora data serve)",
          config.data.dir);
    } else if (!config.data.hash.empty()) {
      check_data_identity(config.data.dir, config.data.hash);
    }
    if (config.model.vocab_size == 0) {
      config.set_vocab_size(read_data_meta(config.data.dir).vocab_size);
    }
    torch::set_num_threads(
        config.train.threads > 0
            ? static_cast<int>(config.train.threads)
            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    peer::StageOptions o;
    o.stage = args->stage;
    o.listen = args->listen;
    o.next = args->next;
    if (!args->next.empty()) o.next_key = net::key_from_hex(args->next_key, "--next-key");
    if (!args->prev_key.empty()) o.prev_key = net::key_from_hex(args->prev_key, "--prev-key");
    o.events = args->events;
    o.out_dir = args->out;
    o.checkpoint_dir = !args->checkpoints.empty() ? std::filesystem::path(args->checkpoints)
                       : !args->out.empty()       ? std::filesystem::path(args->out) / "checkpoints"
                                                  : std::filesystem::path();
    o.resume = args->resume;
    if (o.resume && o.checkpoint_dir.empty()) {
      fail("agora stage --resume needs --checkpoints DIR or --out DIR (where the checkpoints are)");
    }
    o.timeout_seconds = args->timeout;
    o.progress = !args->quiet;
    const peer::StageSummary s = peer::run_stage(config, identity, o);
    fmt::print("stage {}: {} steps in {} ({:.0f} tokens/s), parameters {}, peak RSS {}\n",
               args->stage, s.steps, format_duration(s.seconds), s.tokens_per_second,
               s.parameter_hash.substr(0, 16), format_bytes(static_cast<double>(s.peak_rss_bytes)));
    fmt::print("sent {}, received {}\n", format_bytes(static_cast<double>(s.bytes_sent)),
               format_bytes(static_cast<double>(s.bytes_received)));
  });
}

}  // namespace agora::cli
