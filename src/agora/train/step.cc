#include "agora/train/step.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "agora/core/error.h"
#include "agora/train/batches.h"
#include "agora/train/device.h"
#include "agora/train/loss.h"
#include "agora/train/strategy_factory.h"

namespace agora {
namespace {

using Clock = std::chrono::steady_clock;

Sampler open_sampler(const RunConfig& config, int64_t bag) {
  return Sampler::from_directory(config.data.dir, "train",
                                 static_cast<uint32_t>(config.data.seq_len), config.seed,
                                 static_cast<uint32_t>(bag));
}

}  // namespace

Learner Learner::create(const RunConfig& config, torch::Device device) {
  Learner learner;
  torch::manual_seed(config.seed);  // every peer starts from the same initialisation
  learner.model = Llama(config.model);
  learner.model->to(device);
  learner.model->train();
  learner.reset_strategy(config);
  return learner;
}

void Learner::reset_strategy(const RunConfig& config) {
  strategy = make_strategy(config, model);
  params = model->parameters();
}

TrainStep::TrainStep(const RunConfig& config, torch::Device device)
    : config_(config), device_(device), tokens_(open_sampler(config, 1)) {
  if (config.tst_switch_step() > 0) bags_ = open_sampler(config, config.tst.bag);
}

int64_t TrainStep::bag(int64_t step) const {
  return step < config_.tst_switch_step() ? config_.tst.bag : 1;
}

const Sampler& TrainStep::sampler(int64_t step) const {
  return step < config_.tst_switch_step() ? *bags_ : tokens_;
}

StepResult TrainStep::run(Learner& learner, const StepContext& context,
                          std::span<const SequenceRange> ranges,
                          const std::atomic<bool>* stop) const {
  StepResult result;
  result.bag = bag(context.step);
  for (const SequenceRange& r : ranges) result.sequences += static_cast<int64_t>(r.count);
  const double total = static_cast<double>(result.sequences);
  const uint64_t micro = static_cast<uint64_t>(config_.train.micro_batch_size);
  const Sampler& data = sampler(context.step);

  learner.strategy->before_forward(context);
  for (auto& p : learner.params) p.mutable_grad() = torch::Tensor();
  const AutocastGuard autocast(device_, config_.train.dtype == "bfloat16");
  const auto started = Clock::now();
  for (const SequenceRange& range : ranges) {
    for (uint64_t done = 0; done < range.count; done += micro) {
      if (stop != nullptr && stop->load()) return result;
      const int64_t count = static_cast<int64_t>(std::min(micro, range.count - done));
      const torch::Tensor windows = read_sequences(data, range.first + done, count).to(device_);
      // Each micro-batch weighs its share of the sequences: the gradient is that of the mean.
      const torch::Tensor loss =
          window_loss(learner.model, windows, result.bag) / (total / static_cast<double>(count));
      loss.backward();
      result.loss += loss.item<double>();
    }
  }
  result.compute_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (!std::isfinite(result.loss)) {
    fail(
        "step {}: the loss is {} (diverged); lower optimizer.lr (now {}) or raise "
        "schedule.warmup_steps",
        context.step, result.loss, config_.optimizer.lr);
  }
  // Local clipping (docs/algorithms.md: scale by min(1, c / (||g|| + 1e-6))); with clipping off
  // the norm is still measured for the log.
  const double clip = config_.optimizer.grad_clip > 0 ? config_.optimizer.grad_clip
                                                      : std::numeric_limits<double>::infinity();
  result.grad_norm = torch::nn::utils::clip_grad_norm_(learner.params, clip);
  result.contribution = learner.strategy->contribute(context);
  result.completed = true;
  return result;
}

}  // namespace agora
