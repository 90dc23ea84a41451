// agora: decentralized pretraining of language models. One binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "agora/core/allocator.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  try {
    agora::check_crash_at();  // a test's malformed AGORA_CRASH_AT stops here, not mid-run
    agora::tune_allocator_for_tensors();
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  CLI::App app{"agora: pretrain language models on compute that nobody owns together"};
  app.set_version_flag("--version", agora::cli::version_string());
  app.require_subcommand(1);
  agora::cli::add_tokenize_command(app);
  agora::cli::add_tokenizer_command(app);
  agora::cli::add_stats_command(app);
  agora::cli::add_data_command(app);
  agora::cli::add_train_command(app);
  agora::cli::add_eval_command(app);
  agora::cli::add_generate_command(app);
  agora::cli::add_inspect_command(app);
  agora::cli::add_keygen_command(app);
  agora::cli::add_coordinator_command(app);
  agora::cli::add_peer_command(app);
  agora::cli::add_demo_command(app);
  agora::cli::add_link_command(app);
  agora::cli::add_stage_command(app);
  agora::cli::add_merge_stages_command(app);
  agora::cli::add_async_sim_command(app);
  agora::cli::add_async_command(app);
  agora::cli::add_swarm_sim_command(app);
  agora::cli::add_swarm_command(app);
  agora::cli::add_rl_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
