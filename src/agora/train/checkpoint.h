// Checkpoints: a folder that Hugging Face opens as a LlamaForCausalLM and agora resumes from.
//
//   DIR/config.json                 HF LlamaConfig (config/hf_config.h)
//   DIR/model.safetensors           the parameters under HF's names, float32
//   DIR/agora.json                  step, tokens seen, tokenizer, end-of-text id, last val loss
//   DIR/run.toml                    the resolved run config the run was started with
//   DIR/training_state.safetensors  the strategy's state (e.g. AdamW moments) and the RNG state
//   DIR/tokenizer.model             a copy of the SentencePiece model, when the run used one
//
// Promises: the folder appears whole or not at all (written as DIR.tmp, fsynced file by file,
// renamed); loading checks every tensor's presence, dtype and shape against config.json and
// rejects extras, naming the file and the tensor; a model saved and loaded is bit-exact.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "agora/model/llama.h"
#include "agora/optim/strategy.h"

namespace agora {

struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  uint64_t tokens_seen = 0;
  std::string tokenizer;  // "gpt2", or "tokenizer.model" (the copy inside the checkpoint)
  int64_t eot_id = 0;
  double val_loss = NAN;
};

struct TrainingState {
  std::map<std::string, torch::Tensor> strategy;
  torch::Tensor rng;  // torch's CPU generator state
};

// `tokenizer_spec` is what the run used: "gpt2" or a SentencePiece .model path (copied in).
void save_checkpoint(const std::filesystem::path& dir, Llama& model, const CheckpointMeta& meta,
                     const std::string& tokenizer_spec, const std::string& run_config_toml,
                     const std::optional<TrainingState>& state);

struct LoadedCheckpoint {
  Llama model{nullptr};
  CheckpointMeta meta;
  std::string run_config_toml;  // empty when the checkpoint has none (e.g. made elsewhere)
  // The tokenizer spec to load: "gpt2" or the path of DIR/tokenizer.model.
  std::string tokenizer_spec;
};

LoadedCheckpoint load_checkpoint(const std::filesystem::path& dir, torch::Device device);

// DIR/training_state.safetensors; Error when it is missing or malformed.
TrainingState load_training_state(const std::filesystem::path& dir);

// Copies `source`'s parameters into `model` (same config), keeping `model`'s device.
void copy_parameters(Llama& model, const std::map<std::string, torch::Tensor>& source,
                     const std::string& where);

}  // namespace agora
