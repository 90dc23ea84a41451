// agora train: train a model locally from a run config.
#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/obs/progress.h"
#include "agora/pipeline/pipeline_trainer.h"
#include "agora/train/trainer.h"
#include "commands.h"

namespace agora::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;
    int64_t simulate_peers = 1;
    std::string save_payloads;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("train", "Train a model on token shards from a TOML run config");
  cmd->add_option("--config", args->config, "Run config (TOML), e.g. configs/local.toml")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set optimizer.lr=1e-3");
  cmd->add_option("--resume", args->resume, "Continue from this checkpoint folder");
  cmd->add_option("--simulate-peers", args->simulate_peers,
                  "Train as N peers in this process, each on its own slice of every batch, "
                  "exchanging the strategy's payloads in memory")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--save-payloads", args->save_payloads,
                  "Write every payload sent to this folder (see agora inspect payload)");
  cmd->add_flag("--quiet", args->quiet, "No live progress line");
  cmd->callback([args] {
    RunConfig config = RunConfig::load(args->config, args->overrides);
    if (config.pipeline.enabled()) {
      if (args->simulate_peers != 1 || !args->resume.empty() || !args->save_payloads.empty()) {
        fail(
            "a pipelined run (pipeline.stages = {}) takes neither --simulate-peers, --resume "
            "nor --save-payloads yet",
            config.pipeline.stages);
      }
      PipelineTrainOptions options;
      options.progress = !args->quiet;
      options.events = std::filesystem::path(config.train.out_dir) / "pipeline.jsonl";
      const PipelineTrainSummary s = train_pipeline(std::move(config), options);
      fmt::print("trained {} steps through the pipeline {} in {} ({:.0f} tokens/s)\n", s.steps,
                 s.cut, format_duration(s.seconds), s.tokens_per_second);
      fmt::print("final train loss {:.4f}, val_loss {:.4f}\n", s.final_loss, s.val_loss);
      fmt::print("each boundary carried {:.1f} bytes per token forward and {:.1f} backward\n",
                 s.forward_bytes_per_token, s.backward_bytes_per_token);
      fmt::print("checkpoint {}\n", s.checkpoint.string());
      return;
    }
    TrainOptions options;
    options.resume = args->resume;
    options.progress = !args->quiet;
    options.simulate_peers = args->simulate_peers;
    options.save_payloads = args->save_payloads;
    const std::string strategy = config.optimizer.name;
    const TrainSummary s = train(std::move(config), options);
    fmt::print("trained steps {}..{} in {} ({:.0f} tokens/s)\n", s.first_step, s.last_step,
               format_duration(s.seconds), s.tokens_per_second);
    fmt::print("final train loss {:.4f}, val_loss {:.4f}\n", s.final_loss, s.val_loss);
    const int64_t steps = s.last_step - s.first_step;
    if (s.payload_bytes_per_peer > 0 && steps > 0) {
      // What an all-reduce of fp32 gradients would have sent: every parameter, every step.
      const double per_step = static_cast<double>(s.payload_bytes_per_peer) / steps;
      const double dense = 4.0 * static_cast<double>(s.parameters);
      fmt::print("{} sent {} per peer per step; fp32 gradients would be {} ({:.0f}x more)\n",
                 strategy, format_bytes(per_step), format_bytes(dense), dense / per_step);
    }
    fmt::print("parameters {}{}\n", s.parameter_hash.substr(0, 16),
               s.simulated_peers > 1
                   ? fmt::format(" on all {} simulated peers (checked after every exchange)",
                                 s.simulated_peers)
                   : "");
    if (!s.checkpoint.empty()) fmt::print("checkpoint {}\n", s.checkpoint.string());
  });
}

}  // namespace agora::cli
