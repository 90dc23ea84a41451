// agora train: train a model locally from a run config.
#include <fmt/format.h>

#include "agora/obs/progress.h"
#include "agora/train/trainer.h"
#include "commands.h"

namespace agora::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("train", "Train a model on token shards from a TOML run config");
  cmd->add_option("--config", args->config, "Run config (TOML), e.g. configs/demo.toml")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set optimizer.lr=1e-3");
  cmd->add_option("--resume", args->resume, "Continue from this checkpoint folder");
  cmd->add_flag("--quiet", args->quiet, "No live progress line");
  cmd->callback([args] {
    RunConfig config = RunConfig::load(args->config, args->overrides);
    TrainOptions options;
    options.resume = args->resume;
    options.progress = !args->quiet;
    const TrainSummary s = train(std::move(config), options);
    fmt::print("trained steps {}..{} in {} ({:.0f} tokens/s)\n", s.first_step, s.last_step,
               format_duration(s.seconds), s.tokens_per_second);
    fmt::print("final train loss {:.4f}, val_loss {:.4f}\n", s.final_loss, s.val_loss);
    if (!s.checkpoint.empty()) fmt::print("checkpoint {}\n", s.checkpoint.string());
  });
}

}  // namespace agora::cli
