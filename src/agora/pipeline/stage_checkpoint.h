// A pipeline stage's resumable state on disk (docs/pipeline.md, "Checkpoints and resume").
//
// A stage checkpoints at the end of one iteration of its schedule, after the update of step
// n - 1 (so `steps` = n updates are done) and, under the asynchronous schedule, after the
// forward that follows it. Every stage's checkpoint of the same n together is a consistent cut
// of the run, once two things are added to the parameters and optimizer state:
//   - the stashed forwards (async): the weights each forward in flight ran at, and the inputs it
//     received, which its backward recomputes from;
//   - the forward messages this stage sent that the next stage had not used at the cut (async:
//     one step ahead, two towards the last stage), which the stage sends again on resume.
// Under GPipe both are empty (the flush leaves nothing in flight).
//
// Files, in DIR/step_<n>/ (one folder per checkpoint step, each stage writing its own files, so
// stages on separate machines each hold their own and stages sharing a disk fill one folder):
//   stage_<i>.safetensors        the parameters, exactly as save_stage_file writes them
//                                (merge_stage_files / agora merge-stages read the folder)
//   stage_<i>.state.safetensors  optimizer/<key>, stash/<step>/version/<k>,
//                                stash/<step>/input/<piece>, sent/<step>/<piece> (the bytes as
//                                uint8), and, under a subspace, param/<embedding name> (the
//                                trainable part; the parameters file holds E_fix + E)
// The state file is written first and both atomically; a checkpoint counts only when both exist
// and their metadata agree on the step, the stage and the run's fingerprint.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/subspace.h"

namespace agora {

// What every stage of a run must agree on, hashed (BLAKE2b-256, raw bytes): the model, the seed,
// data.seq_len, train steps, batch and micro-batch sizes, [optimizer], [schedule] and
// [pipeline]. Paths, threads, devices and intervals may differ from stage to stage.
std::string stage_run_fingerprint(const RunConfig& config);

struct StageCheckpoint {
  int64_t steps = 0;  // updates done: the run resumes at this step
  std::map<std::string, torch::Tensor> optimizer;
  struct Stash {
    std::vector<torch::Tensor> version;  // the stage's parameters the forward ran at
    std::vector<torch::Tensor> inputs;   // per piece (stages > 0)
  };
  std::map<int64_t, Stash> stashes;                               // by step
  std::map<std::pair<int64_t, int64_t>, std::string> unconsumed;  // (step, piece) -> bytes
};

// Writes stage `model`'s checkpoint into DIR/step_<state.steps>/ and then removes this stage's
// files of every older step but the newest `keep` (>= 1) steps in all.
void save_stage_checkpoint(const std::filesystem::path& dir, const StageModel& model,
                           const SubspaceBasis* subspace, const std::string& fingerprint,
                           const StageCheckpoint& state, int keep = 2);

// The steps of DIR's complete checkpoints of `stage` for this fingerprint, ascending.
std::vector<uint64_t> stage_checkpoint_steps(const std::filesystem::path& dir, int64_t stage,
                                             const std::string& fingerprint);

// Loads the checkpoint of `model`'s stage at `steps` into `model` and returns the rest. Throws
// Error naming the file and what is wrong (a missing or misshapen tensor, another stage's or
// run's file).
StageCheckpoint load_stage_checkpoint(const std::filesystem::path& dir, int64_t steps,
                                      StageModel& model, const std::string& fingerprint);

}  // namespace agora
