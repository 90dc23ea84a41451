// agora demo --pipeline S (cmd_demo_pipeline.cc): the demo of a pipelined run.
#pragma once

#include <cstdint>
#include <string>

namespace agora::cli {

struct PipelineDemoArgs {
  int64_t stages = 4;
  int64_t steps = 0;  // 0 = the config's
  std::string config = "configs/pipeline.toml";
  std::string data = "data/tokens/sp8k";
  std::string out = "runs/pipeline-demo";
  std::string schedule, codec;  // "" = the config's
  std::string prompt = "And God said";
};

void run_pipeline_demo(const PipelineDemoArgs& args);

// A TCP port that was free a moment ago on 127.0.0.1 (cmd_demo.cc).
int free_loopback_port();

}  // namespace agora::cli
