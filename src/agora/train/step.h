// One training step of one peer: everything a peer computes between applying the run's last
// update and handing its contribution to the network. The local trainer (each simulated peer)
// and a network peer (each round) call the same code, so they cannot drift apart.
//
// TrainStep::run() on a Learner, for the sequence ranges the peer was assigned:
//   1. the strategy's before_forward (Psyche's look-ahead moves the weights here);
//   2. gradients cleared;
//   3. per micro-batch of at most train.micro_batch_size sequences: the windows from the data of
//      the step's phase (TST bags before config.tst_switch_step(), next tokens after), the loss
//      (train/loss.h) scaled by the micro-batch's share of the peer's sequences, backward;
//   4. a loss that is not finite stops the run with an Error (it diverged; training on would
//      send NaN to every peer);
//   5. local clipping to optimizer.grad_clip (the norm is measured, and reported, even when
//      clipping is off);
//   6. the strategy's contribution (an encoded payload, or empty bytes).
//
// Determinism: the result depends only on the learner's state, the step and the ranges; for the
// same micro-batch split the trainer and a network peer compute the same bits. Each micro-batch
// loss is divided by (sequences / micro-batch sequences), which is the accumulation count when
// the split is even.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/data/sampler.h"
#include "agora/data/sequence_range.h"
#include "agora/model/llama.h"
#include "agora/optim/strategy.h"

namespace agora {

// What a peer trains with: the model, its parameters in the model's order, and the strategy
// state (DeMo's momentum, AdamW's moments, DiLoCo's inner optimizer).
struct Learner {
  Llama model{nullptr};
  std::unique_ptr<Strategy> strategy;
  std::vector<torch::Tensor> params;

  // The seed's initialisation (every peer computes the same bits), on `device`, in training
  // mode, with the strategy the config names.
  static Learner create(const RunConfig& config, torch::Device device);
  // A cold strategy state over the current parameters (a joiner's momentum starts at zero).
  void reset_strategy(const RunConfig& config);
};

struct StepResult {
  bool completed = false;  // false: *stop was set between micro-batches; nothing contributed
  double loss = 0;         // mean over the sequences (the bag loss during TST phase 1)
  int64_t sequences = 0;
  double grad_norm = 0;        // before clipping
  double compute_seconds = 0;  // forward and backward only: what throughput is measured on
  int64_t bag = 1;             // the TST bag this step trained with (1 = next tokens)
  Contribution contribution;   // Contribution::peer is left to the caller
};

class TrainStep {
 public:
  // Opens the training samplers of config.data.dir (and the bag sampler for TST phase 1).
  TrainStep(const RunConfig& config, torch::Device device);

  // The step `context.step` over `ranges`. Checks `stop` before every micro-batch. Throws Error
  // when the loss is not finite.
  StepResult run(Learner& learner, const StepContext& context,
                 std::span<const SequenceRange> ranges,
                 const std::atomic<bool>* stop = nullptr) const;

  // The bag size step `step` trains with: tst.bag in TST phase 1, else 1.
  int64_t bag(int64_t step) const;

 private:
  const Sampler& sampler(int64_t step) const;

  RunConfig config_;
  torch::Device device_;
  Sampler tokens_;
  std::optional<Sampler> bags_;  // TST phase 1 (steps < config_.tst_switch_step())
};

}  // namespace agora
