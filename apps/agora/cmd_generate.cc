// agora generate: sample text from a checkpoint.
#include <fmt/format.h>

#include <cstdio>

#include "agora/core/error.h"
#include "agora/data/utf8.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/generate.h"
#include "commands.h"

namespace agora::cli {

void add_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, device = "auto";
    SampleOptions sample;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint folder")->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", args->sample.max_new_tokens, "New tokens at most")
      ->capture_default_str();
  cmd->add_option("--temperature", args->sample.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", args->sample.top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", args->sample.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--device", args->device, "auto, cpu or cuda")->capture_default_str();
  cmd->callback([args] {
    const torch::Device device = resolve_device(args->device);
    LoadedCheckpoint checkpoint = load_checkpoint(args->checkpoint, device);
    if (checkpoint.tokenizer_spec.empty()) {
      fail("checkpoint {} names no tokenizer (agora.json or tokenizer.model)", args->checkpoint);
    }
    const auto tokenizer = load_tokenizer(checkpoint.tokenizer_spec);
    const std::vector<TokenId> prompt = tokenizer->encode(args->prompt);
    // Decode prompt and continuation together (a tokenizer may render a token differently at the
    // start of a text), print as tokens arrive, and hold back bytes that end mid-character.
    std::vector<TokenId> all = prompt;
    std::string text = tokenizer->decode(all);
    std::fputs(text.c_str(), stdout);
    size_t printed = text.size();
    generate(checkpoint.model, static_cast<TokenId>(checkpoint.meta.eot_id), prompt, args->sample,
             [&](TokenId id) {
               all.push_back(id);
               text = tokenizer->decode(all);
               if (!is_valid_utf8(text) || text.size() <= printed) return;
               std::fputs(text.c_str() + printed, stdout);
               std::fflush(stdout);
               printed = text.size();
             });
    if (text.size() > printed) std::fputs(repair_utf8(text.substr(printed)).c_str(), stdout);
    std::fputs("\n", stdout);
  });
}

}  // namespace agora::cli
