#include "agora/train/async_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "agora/core/error.h"
#include "agora/data/sampler.h"
#include "agora/optim/async_outer.h"
#include "agora/optim/payload_tensors.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"
#include "agora/train/step.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

struct Worker {
  Learner learner;
  std::vector<torch::Tensor> pulled;  // theta when this round began (fp32)
  int64_t pulled_at = 0;              // the outer updates applied by then
  int64_t local_steps = 0;            // inner steps taken: the lr schedule's position
  int64_t steps = 0;                  // H_w
  uint64_t first_sequence = 0;        // this round's data: steps x per_worker ids from here
  double busy_until = 0;              // simulated time the round ends
};

std::vector<torch::Tensor> fp32_copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) {
    out.push_back(t.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true));
  }
  return out;
}

void load_into(const std::vector<torch::Tensor>& theta, std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(theta[i]);
}

}  // namespace

const std::vector<std::string>& async_sim_methods() {
  static const std::vector<std::string> methods = {"sync", "async", "dylu", "lookahead",
                                                   "lookahead_discounted"};
  return methods;
}

AsyncSimSummary run_async_sim(const RunConfig& base, const AsyncSimOptions& options,
                              const std::function<void(const AsyncSimPoint&)>& on_eval) {
  const auto& methods = async_sim_methods();
  if (std::find(methods.begin(), methods.end(), options.method) == methods.end()) {
    fail("--method {} is not known (allowed: sync, async, dylu, lookahead, lookahead_discounted)",
         options.method);
  }
  const int64_t W = static_cast<int64_t>(options.step_times.size());
  if (W < 1) fail("--step-times names no worker (allowed: one positive number per worker)");
  for (double t : options.step_times) {
    if (!std::isfinite(t) || t <= 0) {
      fail("--step-times holds {}; each worker's seconds per step must be a positive number", t);
    }
  }
  if (!(options.sim_seconds > 0) || !(options.eval_every > 0)) {
    fail("--sim-seconds {} and --eval-every {} must both be positive", options.sim_seconds,
         options.eval_every);
  }
  RunConfig config = base;
  config.optimizer.name = "adamw";  // each worker's inner optimizer
  const int64_t B = config.train.batch_size;
  if (B % W != 0) {
    fail(
        "train.batch_size = {} does not split among {} workers (allowed: a multiple of the "
        "worker count)",
        B, W);
  }
  const int64_t per_worker = B / W;
  config.train.micro_batch_size = std::min(config.train.micro_batch_size, per_worker);
  if (per_worker % config.train.micro_batch_size != 0) {
    fail("each worker trains {} sequences a step, not a multiple of train.micro_batch_size = {}",
         per_worker, config.train.micro_batch_size);
  }
  const int64_t H = options.inner_steps > 0 ? options.inner_steps : config.diloco.inner_steps;
  const bool sync = options.method == "sync";
  AsyncOuterOptions outer_options;
  if (sync && !options.outer_rule.empty()) {
    fail(
        "--outer-rule {} was given with --method sync, whose round takes one Nesterov step on "
        "the mean (allowed: --outer-rule with an asynchronous method only)",
        options.outer_rule);
  }
  outer_options.rule = options.outer_rule.empty() ? outer_rule_of_method(options.method)
                                                  : parse_outer_rule(options.outer_rule);
  outer_options.buffer = options.outer_buffer > 0 ? options.outer_buffer : W;
  outer_options.lr = options.outer_lr > 0 ? options.outer_lr : config.diloco.outer_lr;
  outer_options.momentum =
      options.outer_momentum >= 0 ? options.outer_momentum : config.diloco.outer_momentum;

  const torch::Device device = resolve_device(config.train.device);
  torch::set_num_threads(config.train.threads > 0
                             ? static_cast<int>(config.train.threads)
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const TrainStep train_step(config, device);
  const Sampler val_data =
      Sampler::from_directory(config.data.dir, "val", config.data.seq_len, config.seed);
  const int64_t eval_windows =
      options.eval_windows > 0 ? options.eval_windows : config.train.eval_windows;

  std::vector<Worker> workers(static_cast<size_t>(W));
  const double fastest = *std::min_element(options.step_times.begin(), options.step_times.end());
  AsyncSimSummary summary;
  for (int64_t w = 0; w < W; ++w) {
    Worker& worker = workers[static_cast<size_t>(w)];
    worker.learner = Learner::create(config, device);
    // DyLU: the slow run fewer inner steps, so that every worker's round takes about as long.
    const double speed_ratio = fastest / options.step_times[static_cast<size_t>(w)];
    worker.steps = options.method == "dylu"
                       ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(speed_ratio * H)))
                       : H;
    summary.inner_steps.push_back(worker.steps);
  }
  Learner evaluator = Learner::create(config, device);
  AsyncOuter outer(workers[0].learner.params, outer_options);

  uint64_t next_sequence = 0;
  const auto begin_round = [&](Worker& worker, double now) {
    load_into(outer.theta(), worker.learner.params);
    worker.pulled = fp32_copies(outer.theta());
    worker.pulled_at = outer.updates();
    worker.first_sequence = next_sequence;
    next_sequence += static_cast<uint64_t>(worker.steps * per_worker);
    const size_t w = static_cast<size_t>(&worker - workers.data());
    worker.busy_until = now + static_cast<double>(worker.steps) * options.step_times[w];
  };
  // The worker's round, trained now (the clock is simulated); returns its D.
  const auto train_round = [&](Worker& worker) {
    for (int64_t s = 0; s < worker.steps; ++s) {
      StepContext context;
      context.step = worker.local_steps;
      context.lr = config.learning_rate(worker.local_steps);
      context.num_peers = 1;
      const SequenceRange range{worker.first_sequence + static_cast<uint64_t>(s * per_worker),
                                static_cast<uint64_t>(per_worker)};
      train_step.run(worker.learner, context, std::span<const SequenceRange>(&range, 1));
      worker.learner.strategy->apply(context, {});
      ++worker.local_steps;
    }
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> d;
    int64_t bytes = 0;
    Payload payload;
    payload.kind = PayloadKind::kPseudoGradient;
    for (size_t i = 0; i < worker.pulled.size(); ++i) {
      torch::Tensor delta =
          worker.pulled[i] - worker.learner.params[i].detach().to(torch::kFloat32);
      TensorPayload wire = tensor_payload(delta, options.int8 ? ValueType::kInt8 : ValueType::kF32);
      if (options.int8) delta = to_tensor(wire).to(delta.device());
      payload.tensors.push_back(std::move(wire));
      d.push_back(std::move(delta));
    }
    bytes = static_cast<int64_t>(encode_payload(payload).size());
    summary.bytes_per_delivery = static_cast<double>(bytes);
    summary.tokens += worker.steps * per_worker * config.data.seq_len;
    ++summary.rounds;
    return d;
  };

  const auto started = Clock::now();
  double next_mark = 0;
  int64_t staleness_sum = 0, deliveries = 0;
  const auto evaluate_at = [&](double sim_seconds) {
    load_into(outer.theta(), evaluator.params);
    AsyncSimPoint point;
    point.sim_seconds = sim_seconds;
    point.tokens = summary.tokens;
    point.updates = outer.updates();
    point.val_loss =
        evaluate(evaluator.model, val_data, eval_windows, config.train.micro_batch_size).loss;
    point.wall_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    summary.curve.push_back(point);
    if (on_eval) on_eval(point);
  };
  // Validations due before `now` see theta as it was then.
  const auto evaluations_before = [&](double now) {
    while (next_mark < options.sim_seconds && next_mark <= now) {
      evaluate_at(next_mark);
      next_mark += options.eval_every;
    }
  };

  if (sync) {
    double now = 0;
    while (true) {
      for (Worker& worker : workers) begin_round(worker, now);
      double end = now;
      for (const Worker& worker : workers) end = std::max(end, worker.busy_until);
      if (end > options.sim_seconds) break;
      evaluations_before(end);
      std::vector<torch::Tensor> mean;
      for (Worker& worker : workers) {
        std::vector<torch::Tensor> d = train_round(worker);
        if (mean.empty()) {
          mean = std::move(d);
        } else {
          for (size_t i = 0; i < mean.size(); ++i) mean[i].add_(d[i]);
        }
      }
      for (torch::Tensor& t : mean) t.div_(static_cast<double>(W));
      outer.apply(mean);
      ++deliveries;
      now = end;
    }
  } else {
    for (Worker& worker : workers) begin_round(worker, 0);
    while (true) {
      // The next arrival: the earliest end, the lower worker on a tie.
      Worker* next = &workers[0];
      for (Worker& worker : workers) {
        if (worker.busy_until < next->busy_until) next = &worker;
      }
      const double now = next->busy_until;
      if (now > options.sim_seconds) break;
      evaluations_before(now);
      std::vector<torch::Tensor> d = train_round(*next);
      const int64_t staleness = outer.updates() - next->pulled_at;
      staleness_sum += staleness;
      summary.staleness_max = std::max(summary.staleness_max, staleness);
      ++deliveries;
      outer.apply(d);
      begin_round(*next, now);
    }
  }
  evaluations_before(options.sim_seconds);
  evaluate_at(options.sim_seconds);
  summary.updates = outer.updates();
  summary.staleness_mean =
      deliveries > 0 ? static_cast<double>(staleness_sum) / static_cast<double>(deliveries) : 0;
  summary.final_val_loss = summary.curve.back().val_loss;
  return summary;
}

}  // namespace agora
