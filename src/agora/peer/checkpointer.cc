#include "agora/peer/checkpointer.h"

#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/peer/model_state.h"
#include "agora/peer/state_sync.h"
#include "agora/train/checkpoint.h"
#include "agora/train/evaluate.h"

namespace agora::peer {
namespace fs = std::filesystem;

std::optional<double> Checkpointer::validate(uint64_t round) {
  const RunConfig& config = peer_.config;
  const int64_t interval = config.train.eval_interval;
  if (!peer_.checkpointer || validation_failed_ || interval <= 0 || round == 0 ||
      round % static_cast<uint64_t>(interval) != 0) {
    return std::nullopt;
  }
  try {
    if (!val_) {
      val_ = std::make_unique<Sampler>(Sampler::from_directory(
          config.data.dir, "val", static_cast<uint32_t>(config.data.seq_len), config.seed));
    }
    const EvalResult r = evaluate(peer_.learner.model, *val_, config.train.eval_windows,
                                  config.train.micro_batch_size);
    peer_.log(fmt::format("step {:>5}  val_loss {:.4f}  ({} windows, parameters after {} steps)",
                          round, r.loss, r.windows, peer_.applied),
              "validation", {{"round", round}, {"val_loss", r.loss}, {"windows", r.windows}});
    return r.loss;
  } catch (const Error& e) {
    peer_.log(fmt::format("validation skipped: {}", e.what()));
    validation_failed_ = true;
    return std::nullopt;
  }
}

void Checkpointer::after_apply() {
  const int64_t every = peer_.config.train.checkpoint_interval;
  if (peer_.checkpointer && every > 0 && peer_.applied > 0 &&
      peer_.applied % static_cast<uint64_t>(every) == 0) {
    write();
  }
}

void Checkpointer::write() {
  const auto started = std::chrono::steady_clock::now();
  const fs::path root = checkpoint_root(peer_);
  fs::create_directories(root);
  const fs::path dir = root / fmt::format("checkpoint_{:06}", peer_.applied);
  CheckpointMeta meta;
  meta.step = static_cast<int64_t>(peer_.applied);
  meta.tokens_seen = peer_.config.data_tokens_through(static_cast<int64_t>(peer_.applied));
  meta.eot_id = peer_.data.eot_id;
  // A folder of that name from an earlier run, or from before the run went back to a
  // checkpoint, holds other parameters: it is replaced, so the report below tells the truth.
  // Only this process's own checkpoint of the step (finish() after after_apply()) is kept.
  if (written_step_ != peer_.applied || !fs::exists(dir)) {
    save_checkpoint(dir, peer_.learner.model, meta, peer_.data.tokenizer_spec,
                    peer_.config.to_toml(), std::nullopt);
    written_step_ = peer_.applied;
  }
  replace_symlink(root / "latest", dir.filename());
  peer_.summary.checkpoint = dir;
  wire::Envelope report;
  auto* r = report.mutable_checkpoint_report();
  r->set_applied_steps(peer_.applied);
  r->set_state_hash(state_record(peer_.learner.model, peer_.applied).state_hash());
  r->set_path(fs::absolute(dir).string());
  peer_.link.send_to_coordinator(report);
  peer_.metrics.checkpoint_written(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  peer_.log(fmt::format("checkpoint {}", dir.string()), "checkpoint",
            {{"applied_steps", peer_.applied}, {"path", dir.string()}});
}

}  // namespace agora::peer
