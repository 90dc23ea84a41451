// What a checkpointer peer does beyond training: it measures the validation loss for the run's
// page, and writes the run's checkpoints.
//
// The coordinator names checkpointers at join (Welcome.checkpointer). Every peer holds the same
// parameters, so one measurement and one checkpoint per step are enough; the others train on.
#pragma once

#include <memory>
#include <optional>

#include "agora/data/sampler.h"
#include "agora/peer/peer_context.h"

namespace agora::peer {

class Checkpointer {
 public:
  explicit Checkpointer(PeerContext& peer) : peer_(peer) {}

  // The next-token validation loss on the parameters round `round` trains from, every
  // train.eval_interval rounds (not round 0), on checkpointers only. A data folder without a
  // validation split is said once and never stops training.
  std::optional<double> validate(uint64_t round);

  // After a step is applied: writes a checkpoint every train.checkpoint_interval applied steps.
  void after_apply();
  // Writes PEER_ROOT/checkpoint_<applied>/ (replacing a folder of that name this process did not
  // write), points PEER_ROOT/latest at it, and reports it to the coordinator.
  void write();

 private:
  PeerContext& peer_;
  std::unique_ptr<Sampler> val_;  // opened on first use
  bool validation_failed_ = false;
  std::optional<uint64_t> written_step_;  // the step of the checkpoint this process wrote last
};

}  // namespace agora::peer
