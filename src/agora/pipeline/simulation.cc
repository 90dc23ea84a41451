#include "agora/pipeline/simulation.h"

#include <cmath>

#include "agora/core/error.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"

namespace agora {
namespace {

std::vector<torch::Tensor> snapshot(const StageModel& stage) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : stage->parameters()) out.push_back(p.detach().clone());
  return out;
}

void load(StageModel& stage, const std::vector<torch::Tensor>& version) {
  torch::NoGradGuard no_grad;
  auto params = stage->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(version[i]);
}

}  // namespace

PipelineSimulation::PipelineSimulation(const RunConfig& config, torch::Device device,
                                       Options options)
    : config_(config),
      device_(device),
      options_(options),
      spans_(partition_model(config.model, config.pipeline.stages)),
      data_(Sampler::from_directory(config.data.dir, "train",
                                    static_cast<uint32_t>(config.data.seq_len), config.seed)) {
  const PipelineConfig& pipe = config.pipeline;
  if (config.model.vocab_size <= 0) {
    fail("PipelineSimulation: model.vocab_size is not set (RunConfig::set_vocab_size first)");
  }
  if (pipe.codec == "subspace") {
    subspace_ =
        std::make_unique<SubspaceBasis>(config.model, pipe.subspace_rank, config.seed, device);
  }
  coder_.emplace(pipe, config.model.hidden_size, subspace_.get());
  const bool async = pipe.schedule == "async";
  for (const StageSpan& span : spans_) {
    StageModel stage(config.model, span, config.seed, subspace_.get());
    stage->to(device);
    stage->train();
    optimizers_.push_back(std::make_unique<StageOptimizer>(config, stage->hf_parameters()));
    live_.push_back(stage);
    versions_.emplace_back();
    if (async && options_.stale && delay(span.stage) > 0) {
      // The stash module's own initialisation is overwritten by a version before every use.
      StageModel spare(config.model, span, config.seed, subspace_.get());
      spare->to(device);
      spare->train();
      stash_.push_back(spare);
      versions_.back().push_back(snapshot(stage));
    } else {
      stash_.push_back(nullptr);
    }
  }
}

PipelineSimulation::~PipelineSimulation() = default;

int64_t PipelineSimulation::delay(int64_t stage) const {
  return config_.pipeline.stages - 1 - stage;
}

void PipelineSimulation::clear_gradients(const std::vector<StageModel>& modules) {
  for (const StageModel& m : modules) {
    for (torch::Tensor& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  }
}

double PipelineSimulation::run_micro_batch(std::vector<StageModel>& modules,
                                           const torch::Tensor& windows, double weight_divisor,
                                           int64_t step, int64_t micro, Traffic& traffic) {
  const int64_t B = windows.size(0), T = windows.size(1) - 1;
  const torch::Tensor tokens = windows.narrow(1, 0, T), targets = windows.narrow(1, 1, T);
  const size_t S = modules.size();
  std::vector<torch::Tensor> inputs(S), outputs(S);
  for (size_t i = 0; i < S; ++i) {
    if (i == 0) {
      outputs[i] = modules[i]->forward(tokens);
      continue;
    }
    const BoundaryPosition at{static_cast<uint64_t>(step), static_cast<uint32_t>(micro),
                              static_cast<uint32_t>(i - 1)};
    const std::string bytes = coder_->encode_forward(at, outputs[i - 1], tokens);
    traffic.forward += static_cast<int64_t>(bytes.size());
    inputs[i] = coder_->decode_forward(bytes, at, tokens, device_).requires_grad_(true);
    outputs[i] = modules[i]->forward(inputs[i]);
  }
  // The same weighting as the single-process step (train/step.cc): the mean over the sequences.
  const torch::Tensor loss = next_token_loss(outputs[S - 1], targets) / weight_divisor;
  loss.backward();
  for (size_t i = S - 1; i > 0; --i) {
    const BoundaryPosition at{static_cast<uint64_t>(step), static_cast<uint32_t>(micro),
                              static_cast<uint32_t>(i)};
    const std::string bytes = coder_->encode_backward(at, inputs[i].grad(), inputs[i]);
    traffic.backward += static_cast<int64_t>(bytes.size());
    outputs[i - 1].backward(coder_->decode_backward(bytes, at, B, T, device_));
  }
  return loss.item<double>();
}

double PipelineSimulation::gradients(int64_t step) {
  const int64_t B = config_.train.batch_size, M = config_.pipeline.micro_batches;
  const int64_t count = B / M;
  clear_gradients(live_);
  Traffic traffic;
  double loss = 0;
  for (int64_t j = 0; j < M; ++j) {
    const torch::Tensor windows =
        read_sequences(data_, static_cast<uint64_t>(step * B + j * count), count).to(device_);
    loss += run_micro_batch(live_, windows, static_cast<double>(B) / static_cast<double>(count),
                            step, j, traffic);
  }
  return loss;
}

PipelineStepReport PipelineSimulation::step(int64_t step) {
  const PipelineConfig& pipe = config_.pipeline;
  const int64_t B = config_.train.batch_size;
  const bool async = pipe.schedule == "async";
  PipelineStepReport report;
  report.step = step;
  report.lr = config_.learning_rate(step);

  // The modules each stage computes this step with: its newest weights, or (async) the stashed
  // version s - tau_i, the oldest it keeps.
  std::vector<StageModel> modules = live_;
  for (size_t i = 0; i < live_.size(); ++i) {
    if (stash_[i]) {
      load(stash_[i], versions_[i].front());
      modules[i] = stash_[i];
    }
  }
  clear_gradients(modules);
  // gpipe: the micro-batches of the flush. async: the step is one pipeline micro-batch, run in
  // pieces of train.micro_batch_size only to bound memory (the sum is the same gradient).
  const int64_t pieces =
      async ? B / std::min(B, config_.train.micro_batch_size) : pipe.micro_batches;
  const int64_t count = B / pieces;
  Traffic traffic;
  for (int64_t j = 0; j < pieces; ++j) {
    const torch::Tensor windows =
        read_sequences(data_, static_cast<uint64_t>(step * B + j * count), count).to(device_);
    report.loss += run_micro_batch(
        modules, windows, static_cast<double>(B) / static_cast<double>(count), step, j, traffic);
  }
  if (!std::isfinite(report.loss)) {
    fail("step {}: the loss is {} (diverged); lower optimizer.lr (now {})", step, report.loss,
         config_.optimizer.lr);
  }
  const int64_t boundaries = std::max<int64_t>(1, pipe.stages - 1);
  report.forward_bytes = traffic.forward / boundaries;
  report.backward_bytes = traffic.backward / boundaries;

  for (size_t i = 0; i < live_.size(); ++i) {
    if (stash_[i]) {
      // Weight stashing: the gradient of the old version is applied to the newest weights.
      auto from = stash_[i]->parameters(), to = live_[i]->parameters();
      for (size_t k = 0; k < from.size(); ++k) to[k].mutable_grad() = from[k].grad();
    }
    report.grad_norms.push_back(optimizers_[i]->step(report.lr));
    live_[i]->constrain_to_subspace();
    if (stash_[i]) {
      versions_[i].push_back(snapshot(live_[i]));
      while (static_cast<int64_t>(versions_[i].size()) > delay(static_cast<int64_t>(i)) + 1)
        versions_[i].pop_front();
    }
  }
  return report;
}

Llama PipelineSimulation::assemble() const {
  Llama whole(config_.model);
  whole->to(device_);
  for (const StageModel& stage : live_) stage->copy_into(whole);
  return whole;
}

}  // namespace agora
