// The local trainer: one process training a Llama on token shards with a Strategy.
//
// A run can simulate N peers in one process (--simulate-peers N): N model replicas, each with its
// own strategy state (DeMo momentum, DiLoCo inner optimizer), each training on its own slice of
// every global batch, exchanging contributions exactly as peers on a network would, but in memory.
//
// Per optimizer step s (0-based), with global batch B, N peers, micro-batch b, sequence length T:
//   1. the learning rate comes from the run's schedule;
//   2. peer i runs the step (train/step.h, the same code a network peer runs) on sequence ids
//      s*B + i*B/N .. s*B + (i+1)*B/N - 1 (so the data position is a function of the step alone),
//      in micro-batches of min(b, B/N): forward, backward, local clipping to
//      optimizer.grad_clip, and its strategy's payload, sent by "peer-000", ...;
//   3. every peer's strategy applies all N contributions; after every exchange the trainer checks
//      that all replicas hold bit-identical parameters, and stops with an error if they do not.
// Validation every eval_interval steps and at the end; checkpoints every checkpoint_interval
// steps and at the end, as OUT/checkpoint_<step>/ with OUT/latest pointing at the newest.
//
// Token Superposition Training ([tst], docs/algorithms.md): steps before
// config.tst_switch_step() read their sequences from a sampler with bag = tst.bag and train on
// superposition_loss (train/superposition.h); the rest train on next tokens. The model, the
// strategy state and the lr schedule carry across the switch untouched; the switch is logged.
// Validation reports the ordinary next-token loss always, and while the model has trained on
// bags only, the bag loss as well.
//
// Determinism: the same config and seed give the same losses and parameters, number for number,
// for the same thread count; a run resumed from a checkpoint continues bit-identically to one
// that never stopped (the step fixes the data, the checkpoint holds weights, moments and RNG).
#pragma once

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "agora/config/run_config.h"

namespace agora {

struct Contribution;  // optim/strategy.h

struct StepStats {
  int64_t step = 0;  // the step just completed (0-based)
  double loss = 0;   // mean over the peers
  double lr = 0;
  double grad_norm = 0;  // mean over the peers, before clipping
  double tokens_per_second = 0;
  int64_t payload_bytes = 0;  // bytes one peer sent this step (the mean over peers)
  int64_t bag = 1;            // TST: the bag size this step trained with (1 = next tokens)
  // What applying the step decided (optim/strategy.h ApplyReport): contributions left out,
  // contribution tensors scaled down to the influence bound, and whether the step was skipped.
  int64_t refused = 0, clipped = 0;
  bool skipped = false;
};

struct EvalPoint {
  int64_t step = 0;           // steps completed
  double val_loss = 0;        // ordinary next-token loss
  double bag_val_loss = NAN;  // TST phase 1 only: the superposition loss with tst.bag
  double train_seconds = 0;   // time in training steps so far, evaluations and checkpoints excluded
};

struct TrainOptions {
  std::filesystem::path resume;                   // a checkpoint folder to continue from
  bool progress = true;                           // the live progress line on stderr
  int64_t simulate_peers = 1;                     // N >= 1; the global batch splits N ways
  std::filesystem::path save_payloads;            // if set: DIR/step_<s>_peer-<i>.agp
  std::function<void(const StepStats&)> on_step;  // e.g. tests recording the loss curve
  std::function<void(const EvalPoint&)> on_eval;  // after each validation
  // Called with every step's contributions (peer i's at index i) before they are applied; it
  // may rewrite them. bench/poisoning plays hostile peers here; no run config can reach it.
  std::function<void(int64_t step, std::vector<Contribution>& contributions)> on_contributions;
};

struct TrainSummary {
  int64_t parameters = 0;
  int64_t first_step = 0, last_step = 0;                    // steps run: [first_step, last_step)
  double final_loss = 0;                                    // training loss of the last step
  double val_loss = 0;                                      // at the end
  std::vector<std::pair<int64_t, double>> val_history;      // (step, val loss)
  std::vector<std::pair<int64_t, double>> bag_val_history;  // TST phase 1: (step, bag val loss)
  int64_t tst_switch_step = 0;                              // config.tst_switch_step()
  double seconds = 0;
  double tokens_per_second = 0;
  int64_t simulated_peers = 1;
  uint64_t payload_bytes_per_peer = 0;  // everything one peer sent over the run (mean)
  std::string parameter_hash;           // of the final parameters (identical on every peer)
  std::filesystem::path checkpoint;     // the last one written
};

TrainSummary train(RunConfig config, const TrainOptions& options = {});

}  // namespace agora
