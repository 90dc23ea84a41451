#include "agora/train/checkpoint.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "agora/config/hf_config.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace fs = std::filesystem;

void save_checkpoint(const fs::path& dir, Llama& model, const CheckpointMeta& meta,
                     const std::string& tokenizer_spec, const std::string& run_config_toml,
                     const std::optional<TrainingState>& state) {
  const fs::path tmp = dir.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  write_file_atomic(tmp / "config.json", to_hf_config_json(model->config(), meta.eot_id));
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  save_tensors(tmp / "model.safetensors", params, {{"format", "pt"}});

  CheckpointMeta written = meta;
  if (tokenizer_spec == "gpt2") {
    written.tokenizer = "gpt2";
  } else {
    fs::copy_file(tokenizer_spec, tmp / "tokenizer.model");
    written.tokenizer = "tokenizer.model";
  }
  nlohmann::ordered_json j = {{"step", written.step},
                              {"tokens_seen", written.tokens_seen},
                              {"tokenizer", written.tokenizer},
                              {"eot_id", written.eot_id}};
  j["val_loss"] = std::isnan(written.val_loss) ? nlohmann::ordered_json(nullptr)
                                               : nlohmann::ordered_json(written.val_loss);
  write_file_atomic(tmp / "agora.json", j.dump(2) + "\n");
  if (!run_config_toml.empty()) write_file_atomic(tmp / "run.toml", run_config_toml);

  if (state) {
    std::vector<std::pair<std::string, torch::Tensor>> tensors(state->strategy.begin(),
                                                               state->strategy.end());
    if (state->rng.defined()) tensors.emplace_back("rng.cpu", state->rng);
    save_tensors(tmp / "training_state.safetensors", tensors,
                 {{"step", std::to_string(written.step)}});
  }
  // Replace the folder whole: a reader sees the old checkpoint or the new one.
  if (fs::exists(dir)) fs::remove_all(dir);
  fs::rename(tmp, dir);
  sync_parent_folder(dir);  // the rename survives a power cut, like every other file we write
}

void copy_parameters(Llama& model, const std::map<std::string, torch::Tensor>& source,
                     const std::string& where) {
  torch::NoGradGuard no_grad;
  std::set<std::string> expected;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    expected.insert(name);
    const auto it = source.find(name);
    if (it == source.end()) fail("{}: tensor {} is missing", where, name);
    const torch::Tensor& t = it->second;
    if (!t.sizes().equals(item.value().sizes())) {
      fail("{}: tensor {} has shape {}, the model's config needs {}", where, name,
           c10::str(t.sizes()), c10::str(item.value().sizes()));
    }
    if (!t.is_floating_point()) {
      fail("{}: tensor {} has dtype {}, expected a floating-point type", where, name,
           c10::toString(t.scalar_type()));
    }
    item.value().copy_(t);
  }
  for (const auto& [name, tensor] : source) {
    // A tied checkpoint written by HF may carry lm_head.weight as a copy of the embedding.
    if (!expected.count(name) && !(name == "lm_head.weight" && model->config().tie_embeddings)) {
      fail("{}: unexpected tensor {} (not part of this model)", where, name);
    }
  }
}

LoadedCheckpoint load_checkpoint(const fs::path& dir, torch::Device device) {
  if (!fs::is_directory(dir)) fail("checkpoint {}: no such folder", dir.string());
  LoadedCheckpoint out;
  const fs::path config_path = dir / "config.json";
  const ModelConfig config = from_hf_config_json(read_file(config_path), config_path.string());

  const fs::path meta_path = dir / "agora.json";
  if (fs::exists(meta_path)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(meta_path));
      out.meta.step = j.at("step").get<int64_t>();
      out.meta.tokens_seen = j.value("tokens_seen", uint64_t{0});
      out.meta.tokenizer = j.at("tokenizer").get<std::string>();
      out.meta.eot_id = j.at("eot_id").get<int64_t>();
      if (j.contains("val_loss") && j["val_loss"].is_number()) {
        out.meta.val_loss = j["val_loss"].get<double>();
      }
    } catch (const nlohmann::json::exception& e) {
      fail("{}: malformed: {}", meta_path.string(), e.what());
    }
    if (out.meta.tokenizer != "gpt2" && out.meta.tokenizer != "tokenizer.model") {
      fail("{}: tokenizer is '{}' (allowed: gpt2, tokenizer.model)", meta_path.string(),
           out.meta.tokenizer);
    }
    out.tokenizer_spec = out.meta.tokenizer == "gpt2" ? "gpt2" : (dir / "tokenizer.model").string();
  } else {
    // A checkpoint made elsewhere (e.g. by transformers): look for a tokenizer beside it.
    out.tokenizer_spec =
        fs::exists(dir / "tokenizer.model") ? (dir / "tokenizer.model").string() : "";
  }
  if (fs::exists(dir / "run.toml")) out.run_config_toml = read_file(dir / "run.toml");

  torch::manual_seed(0);  // the initial values are overwritten; seeding keeps this repeatable
  out.model = Llama(config);
  const fs::path weights = dir / "model.safetensors";
  copy_parameters(out.model, load_tensors(weights), weights.string());
  out.model->to(device);
  return out;
}

TrainingState load_training_state(const fs::path& dir) {
  const fs::path path = dir / "training_state.safetensors";
  if (!fs::exists(path)) {
    fail("checkpoint {} has no training_state.safetensors: it can be evaluated but not resumed",
         dir.string());
  }
  TrainingState state;
  for (auto& [name, tensor] : load_tensors(path)) {
    if (name == "rng.cpu")
      state.rng = tensor;
    else
      state.strategy.emplace(name, tensor);
  }
  return state;
}

}  // namespace agora
