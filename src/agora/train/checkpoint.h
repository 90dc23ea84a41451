// Checkpoints: a folder that Hugging Face opens as a LlamaForCausalLM and agora resumes from.
//
//   DIR/config.json                 HF LlamaConfig (config/hf_config.h)
//   DIR/model.safetensors           the parameters under HF's names, float32
//   DIR/agora.json                  step, tokens seen, tokenizer, end-of-text id, last val loss
//   DIR/run.toml                    the resolved run config the run was started with
//   DIR/training_state.safetensors  the strategy's state (e.g. AdamW moments) and the RNG state
//   DIR/tokenizer.model             a copy of the SentencePiece model, when the run used one
//
// Promises:
//   - the folder appears whole or not at all: it is written as DIR.tmp, every file fsynced, and
//     renamed to DIR, and the parent folder is fsynced;
//   - a checkpoint that replaces an existing DIR never deletes it before the new one is in
//     place: the old one is renamed to DIR.replaced, the new one renamed in, the parent fsynced,
//     and only then is DIR.replaced removed. A crash (SIGKILL, power cut) at any point leaves
//     DIR whole (old or new), or DIR.replaced whole and DIR absent;
//   - the next save_checkpoint into the same parent folder first recovers what a crash left
//     there (recover_checkpoints): a DIR.replaced whose DIR is absent is renamed back, one whose
//     DIR exists is removed, and every DIR.tmp is removed, as are symlink temporaries
//     ("latest.tmp.<pid>.<n>", core/file.h) a crash left. Only folders named checkpoint_* are
//     swept among the siblings (plus DIR's own); one writer per parent folder at a time;
//   - loading never reads DIR.tmp or DIR.replaced (a missing DIR with a DIR.replaced beside it
//     is an Error that says so); it checks every tensor's presence, dtype and shape against
//     config.json and rejects extras, naming the file and the tensor; a model saved and loaded
//     is bit-exact.
// The crash points of this path (core/crash_point.h) are checkpoint.begin ... after_sync.
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

// Finishes or undoes what a crash left of a save_checkpoint(dir): see the promises above.
// Throws Error naming the folders when a rename is refused.
void recover_checkpoint(const std::filesystem::path& dir);
// recover_checkpoint for every checkpoint_*.tmp and checkpoint_*.replaced folder in `root`. Call
// it before reading a folder of checkpoints that a crashed process may have been writing.
void recover_checkpoints(const std::filesystem::path& root);

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
