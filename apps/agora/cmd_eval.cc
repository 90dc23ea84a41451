// agora eval: the mean next-token cross-entropy of a checkpoint on a token shard.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agora/data/sampler.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"
#include "commands.h"

namespace agora::cli {

void add_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, data, device = "auto";
    int64_t max_windows = 0, batch = 8;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("eval", "Validation loss of a checkpoint on a token shard");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint folder")->required();
  cmd->add_option("--data", args->data, "A token shard (.bin)")->required();
  cmd->add_option("--max-windows", args->max_windows, "Evaluate at most N windows (0: all)")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "Windows per forward pass")->capture_default_str();
  cmd->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the result as JSON");
  cmd->callback([args] {
    const torch::Device device = resolve_device(args->device);
    LoadedCheckpoint checkpoint = load_checkpoint(args->checkpoint, device);
    // Windows of the checkpoint's training sequence length, in file order.
    const auto shard = std::make_shared<const ShardReader>(ShardReader::open(args->data));
    const Sampler windows({shard}, static_cast<uint32_t>(checkpoint.model->config().max_seq_len),
                          0);
    const EvalResult r =
        evaluate(checkpoint.model, windows, args->max_windows, std::max<int64_t>(1, args->batch));
    if (args->json) {
      fmt::print("{}\n", nlohmann::json{{"val_loss", r.loss},
                                        {"windows", r.windows},
                                        {"tokens", r.tokens},
                                        {"checkpoint", args->checkpoint},
                                        {"data", args->data}}
                             .dump());
    } else {
      fmt::print("val_loss {:.6f}\n", r.loss);
    }
  });
}

}  // namespace agora::cli
