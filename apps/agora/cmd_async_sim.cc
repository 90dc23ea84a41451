// agora async-sim: asynchronous data parallelism among unequal workers, simulated in one
// process on an event clock (train/async_sim.h); one JSON line per validation.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/train/async_sim.h"
#include "commands.h"

namespace agora::cli {

void add_async_sim_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    AsyncSimOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "async-sim",
      "Simulate workers of unequal speed training one model with synchronous DiLoCo or an "
      "asynchronous method, on an event clock (the training is real, the clock simulated)");
  cmd->add_option("--config", args->config, "Run config (TOML): model, data, inner AdamW, [diloco]")
      ->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set diloco.inner_steps=20");
  cmd->add_option("--method", args->options.method,
                  "sync | async | dylu | lookahead | lookahead_discounted")
      ->capture_default_str();
  cmd->add_option("--step-times", args->options.step_times,
                  "Simulated seconds per inner step, one per worker")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--inner-steps", args->options.inner_steps, "H (default: diloco.inner_steps)");
  cmd->add_option("--sim-seconds", args->options.sim_seconds, "Simulated length of the run")
      ->capture_default_str();
  cmd->add_option("--eval-every", args->options.eval_every, "Simulated seconds between validations")
      ->capture_default_str();
  cmd->add_option("--eval-windows", args->options.eval_windows,
                  "Validation windows (default: train.eval_windows)");
  cmd->add_flag("--int8", args->options.int8, "Pseudo-gradients through the int8_rows codec");
  cmd->add_option("--outer-lr", args->options.outer_lr, "Default: diloco.outer_lr");
  cmd->add_option("--outer-momentum", args->options.outer_momentum,
                  "Default: diloco.outer_momentum");
  cmd->add_option("--outer-rule", args->options.outer_rule,
                  "The asynchronous methods' rule per arrival: nesterov, delayed_nesterov, "
                  "lookahead, lookahead_discounted, heloco (default: the method's as published)");
  cmd->add_option("--outer-buffer", args->options.outer_buffer,
                  "Delayed Nesterov: arrivals per momentum update (default: the workers)");
  cmd->callback([args] {
    const RunConfig config = RunConfig::load(args->config, args->overrides);
    const AsyncSimOptions& o = args->options;
    const AsyncSimSummary s = run_async_sim(config, o, [&](const AsyncSimPoint& p) {
      fmt::print("{}\n", nlohmann::json{{"event", "eval"},
                                        {"method", o.method},
                                        {"sim_seconds", p.sim_seconds},
                                        {"tokens", p.tokens},
                                        {"updates", p.updates},
                                        {"val_loss", p.val_loss},
                                        {"wall_seconds", p.wall_seconds}}
                             .dump());
      std::fflush(stdout);
    });
    fmt::print("{}\n", nlohmann::json{{"event", "summary"},
                                      {"method", o.method},
                                      {"step_times", o.step_times},
                                      {"inner_steps", s.inner_steps},
                                      {"int8", o.int8},
                                      {"updates", s.updates},
                                      {"rounds", s.rounds},
                                      {"tokens", s.tokens},
                                      {"staleness_mean", s.staleness_mean},
                                      {"staleness_max", s.staleness_max},
                                      {"bytes_per_delivery", s.bytes_per_delivery},
                                      {"final_val_loss", s.final_val_loss}}
                           .dump());
  });
}

}  // namespace agora::cli
