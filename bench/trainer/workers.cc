#include "workers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "agora/config/model_config.h"
#include "agora/model/llama.h"
#include "agora/optim/adamw.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"
#include "agora/train/strategy_factory.h"

namespace agora::bench {

using nlohmann::json;

namespace {

// What getrusage(RUSAGE_SELF) counts for every thread of this process: CPU seconds in user and
// kernel mode, and minor page faults (a page touched for the first time since it was mapped).
struct Usage {
  double user_s = 0, system_s = 0;
  int64_t minor_faults = 0;

  static Usage now() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    const auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
    return {secs(u.ru_utime), secs(u.ru_stime), static_cast<int64_t>(u.ru_minflt)};
  }
};

}  // namespace

json agora_worker(const Options& o) {
  const Case c = parse_case(o.worker_case, o.warmup, o.steps);
  const agora::ModelConfig config = agora::model_preset(c.preset, o.vocab, c.seq_len);
  torch::set_num_threads(o.threads);

  torch::manual_seed(o.seed);  // as the trainer does, before building the model
  agora::Llama model(config);
  model->train();
  // Decay on matrices only, as the trainer does.
  agora::AdamWStrategy strategy(agora::named_parameters(model),
                                agora::AdamWOptions{kBeta1, kBeta2, kEps, kWeightDecay});
  std::vector<torch::Tensor> params = model->parameters();
  int64_t parameters = 0;
  for (const auto& p : params) parameters += p.numel();

  // Every batch up front, from their own generator (the Python side draws the same ids).
  const int64_t B = c.batch, T = c.seq_len, M = c.micro_batch;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1);
  const torch::Tensor batches =
      torch::randint(0, o.vocab, {c.warmup + c.steps * o.repeats, B, T + 1}, generator,
                     torch::TensorOptions().dtype(torch::kInt64));

  // The trainer's step (train/step.cc): gradients cleared to undefined; per micro-batch the
  // forward, the loss scaled by the micro-batch's share of the batch, backward; the loss read
  // back; global-norm clipping; the strategy's update.
  const auto step = [&](int64_t index) {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    double value = 0;
    for (int64_t first = 0; first < B; first += M) {
      const torch::Tensor tokens = batches[index].narrow(0, first, M);
      const torch::Tensor logits = model->forward(tokens.narrow(1, 0, T));
      const torch::Tensor loss =
          agora::next_token_loss(logits, tokens.narrow(1, 1, T)) / static_cast<double>(B / M);
      loss.backward();
      value += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(params, kGradClip);
    const agora::StepContext context{index, kLr};
    const agora::Contribution own = strategy.contribute(context);
    strategy.apply(context, std::span<const agora::Contribution>(&own, 1));
    return value;
  };

  std::vector<double> losses;
  int64_t index = 0;
  for (; index < c.warmup; ++index) losses.push_back(step(index));
  std::vector<double> rates;
  const Usage before = Usage::now();
  for (int r = 0; r < o.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < c.steps; ++s, ++index) losses.push_back(step(index));
    rates.push_back(static_cast<double>(c.steps * B * T) / seconds_since(start));
  }
  const Usage after = Usage::now();
  const double cpu = (after.user_s - before.user_s) + (after.system_s - before.system_s);
  return {{"parameters", parameters},
          {"threads", torch::get_num_threads()},
          {"first_loss", losses.front()},
          {"last_loss", losses.back()},
          {"tokens_per_s", rates},
          {"faults_per_step", static_cast<double>(after.minor_faults - before.minor_faults) /
                                  static_cast<double>(c.steps * o.repeats)},
          {"system_share", cpu > 0 ? (after.system_s - before.system_s) / cpu : 0.0}};
}

json sgemm_worker(const Options& o) {
  torch::set_num_threads(o.threads);
  torch::manual_seed(o.seed);
  const int64_t n = o.sgemm_size;
  const torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::Tensor c = torch::matmul(a, b);  // warm-up: BLAS threads and buffers
  std::vector<double> gflops;
  for (int r = 0; r < o.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.sgemm_iters; ++i) c = torch::matmul(a, b);
    const double seconds = seconds_since(start);
    gflops.push_back(2.0 * n * n * n * o.sgemm_iters / seconds / 1e9);
  }
  return {{"threads", torch::get_num_threads()}, {"gflops", gflops}};
}

}  // namespace agora::bench
