#include "agora/train/checkpoint.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "agora/config/hf_config.h"
#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/train/torch_safetensors.h"

namespace agora {
namespace fs = std::filesystem;

namespace {

// Where a checkpoint is built before it is renamed into place, and where the checkpoint it
// replaces waits until the new one is durable.
fs::path tmp_of(const fs::path& dir) {
  return dir.string() + ".tmp";
}
fs::path aside_of(const fs::path& dir) {
  return dir.string() + ".replaced";
}

// Renames `from` to `to`; Error naming both.
void rename_folder(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) fail("cannot rename {} to {}: {}", from.string(), to.string(), ec.message());
}

// The folder name `name` less `suffix`, when it ends with it and names a checkpoint folder.
std::optional<std::string> checkpoint_base(const std::string& name, std::string_view suffix) {
  if (name.size() <= suffix.size() || !name.ends_with(suffix)) return std::nullopt;
  std::string base = name.substr(0, name.size() - suffix.size());
  if (!base.starts_with("checkpoint_")) return std::nullopt;
  return base;
}

// Whether `name` is a temporary of replace_symlink or AtomicFile: "<name>.tmp.<pid>.<n>".
bool is_file_temporary(const std::string& name) {
  const auto digits = [](std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const size_t last = name.rfind('.');
  if (last == std::string::npos || !digits(std::string_view(name).substr(last + 1))) return false;
  const size_t middle = name.rfind('.', last - 1);
  if (middle == std::string::npos || middle == 0 ||
      !digits(std::string_view(name).substr(middle + 1, last - middle - 1))) {
    return false;
  }
  return std::string_view(name).substr(0, middle).ends_with(".tmp");
}

}  // namespace

void recover_checkpoint(const fs::path& dir) {
  const fs::path aside = aside_of(dir);
  if (fs::is_directory(aside)) {
    if (fs::exists(dir)) {
      // The new one is in place (renamed, maybe not yet synced: syncing it now is harmless).
      sync_parent_folder(dir);
      fs::remove_all(aside);
    } else {
      // Interrupted between moving the old one aside and renaming the new one in: the old one
      // is the checkpoint of that name.
      rename_folder(aside, dir);
      sync_parent_folder(dir);
    }
  }
  fs::remove_all(tmp_of(dir));  // never renamed in, so never reported: half written or not
}

void recover_checkpoints(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  std::vector<fs::path> links;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // A link temporary of replace_symlink ("latest.tmp.<pid>.<n>") that a crash left behind.
    if (it->is_symlink()) {
      if (is_file_temporary(name)) links.push_back(it->path());
      continue;
    }
    if (!it->is_directory()) continue;
    for (std::string_view suffix : {std::string_view(".tmp"), std::string_view(".replaced")}) {
      if (auto base = checkpoint_base(name, suffix)) dirs.push_back(root / *base);
    }
  }
  for (const fs::path& dir : dirs) recover_checkpoint(dir);
  for (const fs::path& link : links) fs::remove(link, ec);
}

void save_checkpoint(const fs::path& dir, Llama& model, const CheckpointMeta& meta,
                     const std::string& tokenizer_spec, const std::string& run_config_toml,
                     const std::optional<TrainingState>& state) {
  // What a crash left behind in this folder of checkpoints goes first: an interrupted
  // replacement is undone or finished, and half-written folders are removed.
  if (dir.has_parent_path()) recover_checkpoints(dir.parent_path());
  recover_checkpoint(dir);
  crash_point("checkpoint.begin");
  const fs::path tmp = tmp_of(dir);
  const fs::path aside = aside_of(dir);
  fs::create_directories(tmp);

  // Every file is written with write_file_atomic or AtomicFile: fsynced, and the tmp folder
  // fsynced after each rename into it, so the folder is whole on disk before it is renamed.
  write_file_atomic(tmp / "config.json", to_hf_config_json(model->config(), meta.eot_id));
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  save_tensors(tmp / "model.safetensors", params, {{"format", "pt"}});
  crash_point("checkpoint.after_weights");

  CheckpointMeta written = meta;
  if (tokenizer_spec == "gpt2") {
    written.tokenizer = "gpt2";
  } else {
    // Not fs::copy_file: the copy would not be fsynced before the folder is renamed.
    write_file_atomic(tmp / "tokenizer.model", read_file(tokenizer_spec));
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
  crash_point("checkpoint.after_tmp");
  // Replace the folder whole, never deleting the old one before the new one is in place: the
  // old one is renamed aside, the new one renamed in, the parent folder fsynced, and only then
  // is the old one removed. A crash in between leaves DIR.replaced, which recover_checkpoint
  // (the next save into this folder) renames back or removes.
  const bool replacing = fs::exists(dir);
  if (replacing) {
    rename_folder(dir, aside);
    crash_point("checkpoint.after_aside");
  }
  rename_folder(tmp, dir);
  crash_point("checkpoint.after_rename");
  sync_parent_folder(dir);  // both renames survive a power cut, like every other file we write
  crash_point("checkpoint.after_sync");
  if (replacing) fs::remove_all(aside);
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
  if (!fs::is_directory(dir)) {
    // Loading never reads DIR.tmp (maybe half written) nor DIR.replaced; it only says so.
    if (fs::is_directory(aside_of(dir))) {
      fail(
          "checkpoint {}: no such folder, but {} holds the checkpoint a crash interrupted "
          "replacing; the next checkpoint written into {} puts it back (or rename it yourself)",
          dir.string(), aside_of(dir).string(), dir.parent_path().string());
    }
    fail("checkpoint {}: no such folder", dir.string());
  }
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
