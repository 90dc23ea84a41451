#include "agora/pipeline/stage_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <string_view>

#include "agora/config/hf_config.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/pipeline/stage_files.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kEmbedding = "model.embed_tokens.weight";

fs::path step_dir(const fs::path& dir, int64_t steps) {
  return dir / fmt::format("step_{}", steps);
}
fs::path params_file(const fs::path& dir, int64_t steps, int64_t stage) {
  return step_dir(dir, steps) / fmt::format("stage_{}.safetensors", stage);
}
fs::path state_file(const fs::path& dir, int64_t steps, int64_t stage) {
  return step_dir(dir, steps) / fmt::format("stage_{}.state.safetensors", stage);
}

std::optional<int64_t> parse_count(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

std::string metadata_of(const SafetensorsFile& file, const std::string& key) {
  const auto meta = file.metadata();
  const auto found = meta.find(key);
  return found == meta.end() ? "" : found->second;
}

// Whether step_<steps>/ holds both files of `stage`, agreeing with each other and the run.
bool complete(const fs::path& dir, int64_t steps, int64_t stage, const std::string& fingerprint) {
  try {
    if (!fs::exists(params_file(dir, steps, stage)) || !fs::exists(state_file(dir, steps, stage))) {
      return false;
    }
    const SafetensorsFile state = SafetensorsFile::open(state_file(dir, steps, stage));
    const SafetensorsFile params = SafetensorsFile::open(params_file(dir, steps, stage));
    const std::string n = std::to_string(steps);
    return metadata_of(state, "step") == n && metadata_of(params, "step") == n &&
           metadata_of(state, "stage") == std::to_string(stage) &&
           metadata_of(state, "fingerprint") == hex_encode(fingerprint);
  } catch (const Error&) {
    return false;  // a damaged file is no checkpoint
  }
}

torch::Tensor bytes_tensor(const std::string& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(t.data_ptr<uint8_t>()));
  return t;
}

std::pair<int64_t, int64_t> two_numbers(const std::string& name, std::string_view rest,
                                        const fs::path& path) {
  const size_t slash = rest.find('/');
  const auto a = parse_count(rest.substr(0, slash));
  const auto b =
      slash == std::string_view::npos ? std::nullopt : parse_count(rest.substr(slash + 1));
  if (!a || !b) fail("{}: tensor {} does not name a step and a number", path.string(), name);
  return {*a, *b};
}

}  // namespace

std::string stage_run_fingerprint(const RunConfig& config) {
  RunConfig shared;
  shared.model = config.model;
  shared.model_overrides = config.model_overrides;
  shared.seed = config.seed;
  shared.data.seq_len = config.data.seq_len;
  shared.train.steps = config.train.steps;
  shared.train.batch_size = config.train.batch_size;
  shared.train.micro_batch_size = config.train.micro_batch_size;
  shared.optimizer = config.optimizer;
  shared.schedule = config.schedule;
  shared.pipeline = config.pipeline;
  // The TOML names the model by preset and overrides; the HF config spells out every field.
  return blake2b256_bytes(shared.to_toml() + to_hf_config_json(config.model, 0));
}

void save_stage_checkpoint(const fs::path& dir, const StageModel& model,
                           const SubspaceBasis* subspace, const std::string& fingerprint,
                           const StageCheckpoint& state, int keep) {
  const int64_t stage = model->span().stage;
  fs::create_directories(step_dir(dir, state.steps));
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [key, t] : state.optimizer) tensors.emplace_back("optimizer/" + key, t);
  for (const auto& [step, stash] : state.stashes) {
    for (size_t k = 0; k < stash.version.size(); ++k) {
      tensors.emplace_back(fmt::format("stash/{}/version/{}", step, k), stash.version[k]);
    }
    for (size_t j = 0; j < stash.inputs.size(); ++j) {
      tensors.emplace_back(fmt::format("stash/{}/input/{}", step, j), stash.inputs[j]);
    }
  }
  for (const auto& [at, bytes] : state.unconsumed) {
    tensors.emplace_back(fmt::format("sent/{}/{}", at.first, at.second), bytes_tensor(bytes));
  }
  if (subspace != nullptr && model->first()) {
    for (const NamedParameter& p : model->hf_parameters()) {
      if (p.name == kEmbedding) tensors.emplace_back("param/" + p.name, p.tensor.detach());
    }
  }
  save_tensors(state_file(dir, state.steps, stage), tensors,
               {{"step", std::to_string(state.steps)},
                {"stage", std::to_string(stage)},
                {"fingerprint", hex_encode(fingerprint)}});
  crash_point("stage.checkpoint.after_state");
  save_stage_file(step_dir(dir, state.steps), model, subspace, state.steps);

  std::vector<uint64_t> held = stage_checkpoint_steps(dir, stage, fingerprint);
  const size_t kept = static_cast<size_t>(std::max(1, keep));
  for (size_t k = 0; k + kept < held.size(); ++k) {
    const int64_t old = static_cast<int64_t>(held[k]);
    std::error_code ignored;
    fs::remove(state_file(dir, old, stage), ignored);
    fs::remove(params_file(dir, old, stage), ignored);
    if (fs::is_empty(step_dir(dir, old), ignored)) fs::remove(step_dir(dir, old), ignored);
  }
}

std::vector<uint64_t> stage_checkpoint_steps(const fs::path& dir, int64_t stage,
                                             const std::string& fingerprint) {
  std::vector<uint64_t> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !name.starts_with("step_")) continue;
    const auto steps = parse_count(std::string_view(name).substr(5));
    if (steps && *steps > 0 && complete(dir, *steps, stage, fingerprint)) {
      out.push_back(static_cast<uint64_t>(*steps));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

StageCheckpoint load_stage_checkpoint(const fs::path& dir, int64_t steps, StageModel& model,
                                      const std::string& fingerprint) {
  const int64_t stage = model->span().stage;
  const fs::path path = state_file(dir, steps, stage);
  if (!complete(dir, steps, stage, fingerprint)) {
    fail(
        "{}: no complete checkpoint of stage {} at step {} for this run (both files, the same "
        "step, stage and fingerprint)",
        step_dir(dir, steps).string(), stage, steps);
  }
  std::map<std::string, torch::Tensor> params = load_tensors(params_file(dir, steps, stage));
  StageCheckpoint out;
  out.steps = steps;
  for (auto& [name, t] : load_tensors(path)) {
    const std::string_view n = name;
    if (n.starts_with("optimizer/")) {
      out.optimizer.emplace(name.substr(10), t);
    } else if (n.starts_with("param/")) {
      params[name.substr(6)] = t;
    } else if (n.starts_with("sent/")) {
      if (t.scalar_type() != torch::kUInt8 || t.dim() != 1) {
        fail("{}: tensor {} is not bytes (uint8, one dimension)", path.string(), name);
      }
      out.unconsumed[two_numbers(name, n.substr(5), path)] = std::string(
          reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(t.numel()));
    } else if (n.starts_with("stash/")) {
      const std::string_view rest = n.substr(6);
      const size_t slash = rest.find('/');
      const auto step = parse_count(rest.substr(0, slash));
      const std::string_view kind = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
      const bool version = kind.starts_with("version/"), input = kind.starts_with("input/");
      const auto index = parse_count(kind.substr(kind.find('/') + 1));
      if (!step || !(version || input) || !index || *index > 100000) {
        fail("{}: tensor {} is not stash/<step>/version|input/<index>", path.string(), name);
      }
      auto& list = version ? out.stashes[*step].version : out.stashes[*step].inputs;
      if (list.size() <= static_cast<size_t>(*index)) list.resize(static_cast<size_t>(*index) + 1);
      list[static_cast<size_t>(*index)] = t;
    } else {
      fail("{}: unknown tensor {} (allowed: optimizer/, param/, sent/, stash/)", path.string(),
           name);
    }
  }
  const size_t count = model->parameters().size();
  for (const auto& [step, stash] : out.stashes) {
    const bool whole = stash.version.size() == count &&
                       std::all_of(stash.version.begin(), stash.version.end(),
                                   [](const torch::Tensor& t) { return t.defined(); }) &&
                       std::all_of(stash.inputs.begin(), stash.inputs.end(),
                                   [](const torch::Tensor& t) { return t.defined(); });
    if (!whole) fail("{}: the stash of step {} is incomplete", path.string(), step);
  }
  torch::NoGradGuard no_grad;
  for (const NamedParameter& p : model->hf_parameters()) {
    const auto found = params.find(p.name);
    if (found == params.end() || !found->second.sizes().equals(p.tensor.sizes())) {
      fail("{}: parameter {} is missing or has another shape (expected {})",
           params_file(dir, steps, stage).string(), p.name, c10::str(p.tensor.sizes()));
    }
    p.tensor.copy_(found->second);
  }
  return out;
}

}  // namespace agora
