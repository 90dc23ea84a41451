// The learner's saves for a restart (learner_server.h, "Restarts"). Layout of out_dir/resume:
// step-<k>/ (model/, a checkpoint of the policy as trained; optimizer.pt, AdamW's state;
// published.safetensors, the copy workers hold) and state.json, which names the newest complete
// step-<k> and is replaced atomically only after that folder is written. A kill at any moment
// leaves the previous save or the new one; folders state.json does not name are removed.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/rl/learner_detail.h"
#include "agora/train/torch_safetensors.h"

namespace agora::learner_detail {
namespace fs = std::filesystem;

namespace {

fs::path resume_dir(const LearnerOptions& o) {
  return o.train.out_dir / "resume";
}

// Removes every save folder of `dir` but `keep` (listed first: no removal while iterating).
void remove_saves_but(const fs::path& dir, const fs::path& keep) {
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step-", 0) == 0 && entry.path() != keep) {
      stale.push_back(entry.path());
    }
  }
  for (const fs::path& p : stale) fs::remove_all(p);
}

}  // namespace

std::string Learner::fingerprint() const {
  const GrpoTrainOptions& t = options_.train;
  return fmt::format(
      "{}\n[rl]\nrun_id={}\ntask={}\ntask_seed={}\nsteps={}\nprompts={}\ngroup={}\nlr={}\n"
      "temperature={}\nmax_new_tokens={}\n",
      base_.run_config_toml, options_.run_id, options_.task_name, options_.task.seed, t.steps,
      t.prompts_per_step, t.group_size, t.lr, t.temperature, t.max_new_tokens);
}

void Learner::save_resume(bool finished) {
  const fs::path dir = resume_dir(options_);
  const std::string name = fmt::format("step-{}", step_);
  const fs::path folder = dir / name;
  fs::create_directories(folder);
  CheckpointMeta meta = base_.meta;
  meta.step = base_.meta.step + static_cast<uint64_t>(step_);
  save_checkpoint(folder / "model", live_, meta, base_.tokenizer_spec, base_.run_config_toml,
                  std::nullopt);
  {
    const fs::path tmp = folder / "optimizer.pt.tmp";
    torch::save(optimizer_, tmp.string());
    fs::rename(tmp, folder / "optimizer.pt");
  }
  std::vector<std::pair<std::string, torch::Tensor>> published;
  for (const auto& p : published_.model()->named_parameters())
    published.emplace_back(p.key(), p.value());
  save_tensors(folder / "published.safetensors", published, {{"format", "agora-rl-published"}});
  const nlohmann::json state = {{"fingerprint", fingerprint()},
                                {"finished", finished},
                                {"folder", name},
                                {"step", step_},
                                {"cursor", cursor_},
                                {"version", published_.version()},
                                {"strikes", intake_.strikes_by_worker()},
                                {"base_accuracy", summary_.base_accuracy},
                                {"held_out", last_held_out_}};
  write_file_atomic(dir / "state.json", state.dump(1));
  remove_saves_but(dir, folder);
  log_event({{"event", "rl_saved"}, {"step", step_}, {"version", published_.version()}});
}

bool Learner::resume() {
  const fs::path dir = resume_dir(options_);
  if (!fs::exists(dir / "state.json")) return false;
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_file(dir / "state.json"));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON ({}); remove the folder to start a new run", (dir / "state.json").string(),
         e.what());
  }
  if (state.value("finished", false)) return false;
  if (state.value("fingerprint", "") != fingerprint()) {
    fail(
        "{} holds an unfinished run started from another base checkpoint or with other options; "
        "start it again with those (to resume it), or give another --out",
        dir.string());
  }
  const fs::path folder = dir / state.at("folder").get<std::string>();
  remove_saves_but(dir, folder);  // a kill mid-save left a folder state.json does not name
  {
    LoadedCheckpoint saved = load_checkpoint(folder / "model", torch::kCPU);
    torch::NoGradGuard no_grad;
    const auto source = saved.model->named_parameters();
    for (auto& p : live_->named_parameters()) p.value().copy_(source[p.key()]);
  }
  torch::load(optimizer_, (folder / "optimizer.pt").string());
  {
    const std::map<std::string, torch::Tensor> tensors =
        load_tensors(folder / "published.safetensors");
    Llama published(live_->config());
    torch::NoGradGuard no_grad;
    for (auto& p : published->named_parameters()) {
      const auto it = tensors.find(p.key());
      if (it == tensors.end()) fail("{}: no tensor {}", folder.string(), p.key());
      p.value().copy_(it->second);
    }
    published_ = PublishedPolicy(published, state.at("version").get<uint64_t>());
    versions_ = PolicyVersions(published_.model(), options_.train.max_off_policy_steps,
                               published_.version());
  }
  step_ = state.at("step").get<int64_t>();
  cursor_ = state.at("cursor").get<uint64_t>();
  intake_.restore_strikes(state.at("strikes").get<std::map<std::string, int>>());
  summary_.base_accuracy = state.at("base_accuracy").get<double>();
  last_held_out_ = state.at("held_out").get<double>();
  feed_.reset(published_.version(), published_.state_hash());
  resumed_ = true;
  return true;
}

}  // namespace agora::learner_detail
