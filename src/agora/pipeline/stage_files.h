// A pipelined run's parameters on disk: one stage_<i>.safetensors per stage in one folder, each
// holding that stage's parameters under the whole model's Hugging Face names (stage 0's embedding
// as it computes with it: E_fix + E under a subspace). Together they are exactly the tensors of
// one LlamaForCausalLM checkpoint, and merge_stage_files() makes that checkpoint.
#pragma once

#include <filesystem>

#include "agora/config/run_config.h"
#include "agora/model/llama.h"
#include "agora/pipeline/stage_model.h"

namespace agora {

// Writes DIR/stage_<i>.safetensors atomically, with the step and the stage's layers as metadata.
void save_stage_file(const std::filesystem::path& dir, const StageModel& stage,
                     const SubspaceBasis* subspace, int64_t step);

// The whole model from DIR's stage files. Throws Error naming the file and tensor when a stage
// file is missing, two files hold the same tensor, a tensor is missing or has the wrong shape,
// or the files were written at different steps. `step` receives the step they were written at.
Llama merge_stage_files(const RunConfig& config, const std::filesystem::path& dir,
                        int64_t* step = nullptr);

}  // namespace agora
