// Asynchronous data parallelism among unequal machines, simulated in one process on an event
// clock (docs/algorithms.md section 8; bench/async).
//
// W workers, worker w taking step_times[w] simulated seconds per inner step (its real compute is
// whatever this machine takes: the clock is simulated, the training is real). Each worker holds
// its own model and inner AdamW (optimizer.*, moments kept across rounds) and trains rounds:
// pull the run's parameters theta, run H_w inner steps of train.batch_size / W sequences each,
// then deliver D = theta_pulled - theta_local (optionally through the int8_rows codec, the bytes
// counted). Methods:
//   sync       synchronous DiLoCo: every worker runs H steps from the same theta; the round
//              ends when the slowest finishes (max_w H t_w), then one Nesterov step on the mean D;
//   async      asynchronous DiLoCo as Liu et al. 2024 publish it: each worker's D is applied the
//              moment it arrives, with the delayed Nesterov rule (optim/async_outer.h; the momentum
//              moves once every N = W arrivals), and that worker pulls the new theta and goes on;
//              nobody waits. outer_rule = "nesterov" gives the naive form (a full Nesterov step
//              per arrival), which the paper shows diverging;
//   dylu       async with each worker's inner steps scaled to its speed:
//              H_w = max(1, floor(v_w / v_ref * H)), v = 1 / step time, v_ref the fastest;
//   lookahead, lookahead_discounted
//              async with the momentum look-ahead rules of optim/async_outer.h.
// Data: every inner step takes the next train.batch_size / W fresh sequence ids of the training
// set, handed out in event order, so no sequence is trained twice and the run is deterministic.
// Events at the same simulated time go in worker order.
//
// Validation of theta every eval_every simulated seconds (at the first arrival past each mark)
// and at the end; the run ends at the first arrival at or past sim_seconds. Deterministic: the
// same config and options give the same numbers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "agora/config/run_config.h"

namespace agora {

struct AsyncSimOptions {
  std::string method = "async";  // sync | async | dylu | lookahead | lookahead_discounted
  std::vector<double> step_times = {1.0, 1.3, 2.6, 5.7};  // simulated seconds per inner step
  int64_t inner_steps = 0;                                // H; 0 = diloco.inner_steps
  double sim_seconds = 600;                               // the run's simulated length
  double eval_every = 60;                                 // simulated seconds between validations
  int64_t eval_windows = 0;                               // 0 = train.eval_windows
  bool int8 = false;           // pseudo-gradients through the int8_rows codec
  double outer_lr = 0;         // 0 = diloco.outer_lr
  double outer_momentum = -1;  // < 0 = diloco.outer_momentum
  // The asynchronous methods' rule per arrival: "" = the method's as published
  // (outer_rule_of_method), else one of parse_outer_rule's names (not for sync).
  std::string outer_rule;
  int64_t outer_buffer = 0;  // delayed Nesterov's N; 0 = the number of workers
};

struct AsyncSimPoint {
  double sim_seconds = 0;
  int64_t tokens = 0;   // trained by all workers so far (delivered rounds only)
  int64_t updates = 0;  // outer updates applied so far
  double val_loss = 0;
  double wall_seconds = 0;  // this process's real time so far
};

struct AsyncSimSummary {
  std::vector<AsyncSimPoint> curve;
  int64_t updates = 0, rounds = 0, tokens = 0;
  double staleness_mean = 0;  // updates applied between a worker's pull and its delivery
  int64_t staleness_max = 0;
  std::vector<int64_t> inner_steps;  // H_w per worker
  double bytes_per_delivery = 0;     // one pseudo-gradient on the wire
  double final_val_loss = 0;
};

// The methods run_async_sim() knows.
const std::vector<std::string>& async_sim_methods();

// Throws Error naming the option for a method not known, no workers, a step time not positive,
// or a batch that does not split among the workers.
AsyncSimSummary run_async_sim(const RunConfig& config, const AsyncSimOptions& options,
                              const std::function<void(const AsyncSimPoint&)>& on_eval = {});

}  // namespace agora
