// agora swarm-sim: a swarm of unequal peers per pipeline stage on an event clock
// (swarm/simulation.h): routing by throughput or uniform, with or without rebalancing, under
// kills. One JSON line per window, then a summary.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/core/error.h"
#include "agora/swarm/simulation.h"
#include "commands.h"

namespace agora::cli {
namespace {

// "1,1,0.333;1,0.333;1,1,0.333": stages split by ';', their peers' speeds by ','.
std::vector<std::vector<double>> parse_speeds(const std::string& text) {
  std::vector<std::vector<double>> out(1);
  std::string number;
  auto flush = [&] {
    if (number.empty()) fail("--speeds '{}': an empty speed; write e.g. 1,1,0.33;1,0.33", text);
    try {
      size_t used = 0;
      out.back().push_back(std::stod(number, &used));
      if (used != number.size()) throw std::invalid_argument(number);
    } catch (const std::exception&) {
      fail("--speeds '{}': '{}' is not a number", text, number);
    }
    number.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ';') {
      flush();
      if (c == ';') out.emplace_back();
    } else if (c != ' ') {
      number += c;
    }
  }
  flush();
  return out;
}

}  // namespace

void add_swarm_sim_command(CLI::App& app) {
  struct Args {
    std::string speeds = "1,1,0.3333333333333333;1,0.3333333333333333;1,1,0.3333333333333333";
    SwarmSimOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "swarm-sim",
      "Simulate a swarm (several unequal peers per pipeline stage) on an event clock: routing "
      "by throughput or uniform, rebalancing, peers killed and restarted");
  SwarmSimOptions& o = args->options;
  cmd->add_option("--speeds", args->speeds,
                  "Each stage's peer speeds (1 = reference): stages split by ';', peers by ','")
      ->capture_default_str();
  cmd->add_option("--costs", o.costs, "Forward seconds per sample per stage at speed 1")
      ->delimiter(',');
  cmd->add_flag("--uniform", o.uniform, "Route uniformly at random (the baseline)");
  cmd->add_flag("!--no-backlog", o.backlog,
                "Routers without the backlog correction (an ablation; swarm/router.h)");
  cmd->add_option("--rebalance", o.rebalance_seconds, "Seconds between rebalancing (0: never)")
      ->capture_default_str();
  cmd->add_option("--min-gain", o.min_gain, "Least bottleneck gain a move must bring")
      ->capture_default_str();
  cmd->add_option("--kill-every", o.kill_every, "Seconds between kills (0: none)")
      ->capture_default_str();
  cmd->add_option("--restart", o.restart_seconds, "Seconds from a kill to the restart")
      ->capture_default_str();
  cmd->add_option("--join", o.join_seconds, "Seconds to load a stage's parameters")
      ->capture_default_str();
  cmd->add_option("--timeout", o.timeout_seconds, "Seconds until a loss is noticed")
      ->capture_default_str();
  cmd->add_option("--link", o.link_seconds, "One hop's latency in seconds")->capture_default_str();
  cmd->add_option("--micro-batch", o.micro_batch, "Samples per micro-batch")->capture_default_str();
  cmd->add_option("--in-flight", o.in_flight, "Micro-batches in flight (0: 4 per peer)")
      ->capture_default_str();
  cmd->add_option("--sim-seconds", o.sim_seconds, "Simulated length")->capture_default_str();
  cmd->add_option("--window", o.window_seconds, "Seconds per timeline window")
      ->capture_default_str();
  cmd->add_option("--jitter", o.jitter, "Compute times times 1 + jitter * U(-1, 1)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of kills, jitter and uniform routing")
      ->capture_default_str();
  cmd->callback([args] {
    SwarmSimOptions o = args->options;
    o.speeds = parse_speeds(args->speeds);
    const SwarmSimSummary s = run_swarm_sim(o);
    for (const SwarmSimWindow& w : s.windows) {
      fmt::print("{}\n", nlohmann::json{{"event", "window"},
                                        {"sim_seconds", w.end},
                                        {"samples_per_second", w.samples_per_second},
                                        {"ideal", w.ideal}}
                             .dump());
    }
    fmt::print("{}\n", nlohmann::json{{"event", "summary"},
                                      {"speeds", o.speeds},
                                      {"routing", o.uniform ? "uniform" : "throughput"},
                                      {"backlog", o.backlog},
                                      {"rebalance_seconds", o.rebalance_seconds},
                                      {"kill_every", o.kill_every},
                                      {"samples_per_second", s.samples_per_second},
                                      {"ideal", s.ideal},
                                      {"efficiency", s.efficiency},
                                      {"initial_bottleneck", s.initial_bottleneck},
                                      {"best_bottleneck", s.best_bottleneck},
                                      {"micro_batches", s.micro_batches},
                                      {"lost", s.lost},
                                      {"retries", s.retries},
                                      {"recomputed", s.recomputed},
                                      {"kills", s.kills},
                                      {"moves", s.moves},
                                      {"stage_peers", s.stage_peers}}
                           .dump());
  });
}

}  // namespace agora::cli
