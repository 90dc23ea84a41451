// agora merge-stages: the stage files of a pipelined run (agora stage --out DIR) as one Hugging
// Face checkpoint, which agora eval and agora generate read like any other.
#include <fmt/format.h>

#include "agora/data/data_meta.h"
#include "agora/pipeline/stage_files.h"
#include "agora/train/checkpoint.h"
#include "commands.h"

namespace agora::cli {

void add_merge_stages_command(CLI::App& app) {
  struct Args {
    std::string config, stages, out;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "merge-stages", "Merge a pipelined run's stage files into one Hugging Face checkpoint");
  cmd->add_option("--config", args->config, "The run config the stages ran with")->required();
  cmd->add_option("--set", args->overrides, "Override a config key, as the stages did");
  cmd->add_option("--stages", args->stages,
                  "The folder of stage_<i>.safetensors (agora stage --out)")
      ->required();
  cmd->add_option("--out", args->out, "The checkpoint folder to write")->required();
  cmd->callback([args] {
    RunConfig config = RunConfig::load(args->config, args->overrides);
    const DataMeta data = read_data_meta(config.data.dir);
    if (config.model.vocab_size == 0) config.set_vocab_size(data.vocab_size);
    int64_t step = 0;
    Llama model = merge_stage_files(config, args->stages, &step);
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens_seen = config.data_tokens_through(step);
    meta.eot_id = data.eot_id;
    save_checkpoint(args->out, model, meta, data.tokenizer_spec, config.to_toml(), TrainingState{});
    fmt::print("merged {} stage files (step {}) into {}\n", config.pipeline.stages, step,
               args->out);
  });
}

}  // namespace agora::cli
