#include "agora/pipeline/stage_files.h"

#include <fmt/format.h>

#include <charconv>
#include <map>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/pipeline/partition.h"
#include "agora/tensor/safetensors.h"
#include "agora/train/checkpoint.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace fs = std::filesystem;

void save_stage_file(const fs::path& dir, const StageModel& stage, const SubspaceBasis* subspace,
                     int64_t step) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const NamedParameter& p : stage->hf_parameters()) {
    torch::Tensor t = p.tensor.detach();
    if (p.name == "model.embed_tokens.weight" && subspace != nullptr) {
      t = t + subspace->fixed_embedding();
    }
    tensors.emplace_back(p.name, t);
  }
  const StageSpan& span = stage->span();
  save_tensors(dir / fmt::format("stage_{}.safetensors", span.stage), tensors,
               {{"step", std::to_string(step)},
                {"stage", std::to_string(span.stage)},
                {"first_layer", std::to_string(span.first_layer)},
                {"end_layer", std::to_string(span.end_layer)}});
}

Llama merge_stage_files(const RunConfig& config, const fs::path& dir, int64_t* step) {
  const int64_t stages = config.pipeline.stages;
  std::map<std::string, torch::Tensor> all;
  std::string written_at;
  for (int64_t i = 0; i < stages; ++i) {
    const fs::path path = dir / fmt::format("stage_{}.safetensors", i);
    if (!fs::exists(path)) {
      fail(
          "{}: no stage_{}.safetensors (a pipeline of {} stages writes one per stage; was "
          "stage {} run with --out {}?)",
          dir.string(), i, stages, i, dir.string());
    }
    const SafetensorsFile file = SafetensorsFile::open(path);
    const auto meta = file.metadata();
    const auto at = meta.find("step");
    const std::string this_step = at == meta.end() ? "" : at->second;
    if (i == 0) written_at = this_step;
    if (this_step != written_at) {
      fail(
          "{}: written at step {}, stage_0.safetensors at step {} (allowed: every stage's file "
          "from the same step)",
          path.string(), this_step, written_at);
    }
    for (auto& [name, tensor] : load_tensors(path)) {
      if (!all.emplace(name, tensor).second) {
        fail("{}: tensor {} is also in another stage's file", path.string(), name);
      }
    }
  }
  Llama whole(config.model);
  copy_parameters(whole, all, dir.string());
  if (step != nullptr) {
    int64_t value = 0;
    const auto [end, error] =
        std::from_chars(written_at.data(), written_at.data() + written_at.size(), value);
    if (error != std::errc() || end != written_at.data() + written_at.size() || value < 0) {
      fail(
          "{}: stage_0.safetensors has step \"{}\" in its metadata (allowed: a whole number "
          ">= 0)",
          dir.string(), written_at);
    }
    *step = value;
  }
  return whole;
}

}  // namespace agora
