// The agora command's subcommands. Each add_*_command registers one subcommand (its options and
// its callback) on the top-level CLI11 app; its implementation lives in cmd_<name>.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace agora {
struct TaskOptions;
}

namespace agora::cli {

void add_tokenize_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_stats_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_keygen_command(CLI::App& app);
void add_coordinator_command(CLI::App& app);
void add_peer_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_link_command(CLI::App& app);
void add_stage_command(CLI::App& app);
void add_merge_stages_command(CLI::App& app);
void add_async_sim_command(CLI::App& app);
void add_async_command(CLI::App& app);
void add_swarm_sim_command(CLI::App& app);
void add_swarm_command(CLI::App& app);
void add_rl_command(CLI::App& app);
// agora rl serve and agora rl work (cmd_rl_net.cc), under `agora rl`.
void add_rl_serve(CLI::App& rl);
void add_rl_work(CLI::App& rl);
void add_rl_sapo_node(CLI::App& rl);
// --task, --task-seed, --held-out, --max-digits, --numbers: the RL task, the same options on every
// command that makes problems (cmd_rl.cc).
void add_task_options(CLI::App* cmd, std::string& task, TaskOptions& options);

// "agora 0.1.0 (libtorch 1.13.0, CPU)".
std::string version_string();

}  // namespace agora::cli
