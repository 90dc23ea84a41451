#include "agora/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"
#include "agora/data/sampler.h"
#include "agora/data/tokenizer.h"
#include "agora/obs/progress.h"
#include "agora/optim/adamw.h"
#include "agora/train/batches.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// The data folder's meta.json: which tokenizer made the shards (and so the vocabulary).
struct DataMeta {
  std::string tokenizer_spec;
  int64_t vocab_size = 0;
  int64_t eot_id = 0;
};

DataMeta read_data_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  if (!fs::exists(path)) {
    fail("data.dir {} has no meta.json; make it with 'agora tokenize' (it records the tokenizer)",
         dir.string());
  }
  try {
    const auto j = nlohmann::json::parse(read_file(path));
    return {resolve_tokenizer_spec(dir, j.at("tokenizer_spec").get<std::string>()),
            j.at("vocab_size").get<int64_t>(), j.at("eot_id").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed: {}", path.string(), e.what());
  }
}

std::unique_ptr<Strategy> make_strategy(const RunConfig& config, Llama& model) {
  if (config.optimizer.name != "adamw") {
    fail("optimizer.name = \"{}\" is not available (allowed: adamw)", config.optimizer.name);
  }
  std::vector<std::pair<std::string, torch::Tensor>> decay, no_decay;
  for (auto& item : model->named_parameters()) {
    (item.value().dim() >= 2 ? decay : no_decay).emplace_back(item.key(), item.value());
  }
  AdamWOptions options;
  options.beta1 = config.optimizer.beta1;
  options.beta2 = config.optimizer.beta2;
  options.eps = config.optimizer.eps;
  options.weight_decay = config.optimizer.weight_decay;
  return std::make_unique<AdamWStrategy>(std::move(decay), std::move(no_decay), options);
}

// The live line: redrawn in place on a terminal, one line per log interval otherwise.
class StepLine {
 public:
  StepLine(bool enabled, int64_t total_steps, int64_t log_interval)
      : enabled_(enabled),
        tty_(::isatty(STDERR_FILENO) == 1),
        total_(total_steps),
        interval_(std::max<int64_t>(1, log_interval)) {}

  void step(const StepStats& s, double eta_seconds) {
    if (!enabled_) return;
    const bool last = s.step + 1 == total_;
    if (!tty_ && (s.step + 1) % interval_ != 0 && !last) return;
    const std::string line = fmt::format(
        "step {:>6}/{}  loss {:.4f}  lr {:.2e}  |g| {:.3f}  {:.0f} tok/s  ETA {}", s.step + 1,
        total_, s.loss, s.lr, s.grad_norm, s.tokens_per_second, format_duration(eta_seconds));
    std::fprintf(stderr, tty_ ? "\r\033[2K%s" : "%s\n", line.c_str());
    std::fflush(stderr);
    pending_ = tty_;
  }
  void message(const std::string& text) {
    if (!enabled_) return;
    if (pending_) std::fputc('\n', stderr);
    std::fprintf(stderr, "%s\n", text.c_str());
    pending_ = false;
  }
  void finish() {
    if (pending_) std::fputc('\n', stderr);
    pending_ = false;
  }

 private:
  bool enabled_, tty_;
  int64_t total_, interval_;
  bool pending_ = false;
};

void point_latest(const fs::path& out_dir, const fs::path& checkpoint) {
  const fs::path link = out_dir / "latest", tmp = out_dir / "latest.tmp";
  fs::remove(tmp);
  fs::create_directory_symlink(checkpoint.filename(), tmp);
  fs::rename(tmp, link);  // atomic replacement of the old link
}

}  // namespace

TrainSummary train(RunConfig config, const TrainOptions& options) {
  const DataMeta data = read_data_meta(config.data.dir);
  if (config.model.vocab_size == 0) {
    config.set_vocab_size(data.vocab_size);
  } else if (config.model.vocab_size < data.vocab_size) {
    fail("model.vocab_size = {} is smaller than the vocabulary of {} ({}, from its meta.json)",
         config.model.vocab_size, config.data.dir, data.vocab_size);
  }
  const auto& t = config.train;
  // libtorch's default can be a single thread (OpenMP's view of the machine); 0 means every core.
  torch::set_num_threads(t.threads > 0
                             ? static_cast<int>(t.threads)
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const torch::Device device = resolve_device(t.device);

  torch::manual_seed(config.seed);
  Llama model(config.model);
  model->to(device);
  model->train();
  std::unique_ptr<Strategy> strategy = make_strategy(config, model);

  const Sampler train_data =
      Sampler::from_directory(config.data.dir, "train", config.data.seq_len, config.seed);
  const Sampler val_data =
      Sampler::from_directory(config.data.dir, "val", config.data.seq_len, config.seed);

  TrainSummary summary;
  summary.parameters = config.model.num_parameters();
  int64_t start = 0;
  if (!options.resume.empty()) {
    const LoadedCheckpoint checkpoint = load_checkpoint(options.resume, device);
    if (checkpoint.run_config_toml != config.to_toml()) {
      fail(
          "checkpoint {} was written by a different run config; resume with the config in its "
          "run.toml (agora train --config {}/run.toml --resume {})",
          options.resume.string(), options.resume.string(), options.resume.string());
    }
    const TrainingState state = load_training_state(options.resume);
    {
      torch::NoGradGuard no_grad;
      auto target = model->named_parameters();
      for (auto& item : checkpoint.model->named_parameters())
        target[item.key()].copy_(item.value());
    }
    strategy->load_state(state.strategy);
    if (state.rng.defined()) {
      auto generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(state.rng);
    }
    start = checkpoint.meta.step;
  }
  summary.first_step = start;

  const int64_t B = t.batch_size, b = t.micro_batch_size, T = config.data.seq_len;
  const int64_t accumulation = B / b;
  const AutocastGuard autocast(device, t.dtype == "bfloat16");
  StepLine line(options.progress, t.steps, t.log_interval);
  line.message(fmt::format("training {} ({:.2f}M parameters) on {} for {} steps of {} x {} tokens",
                           config.model.preset, summary.parameters / 1e6, device.str(), t.steps, B,
                           T));

  const auto run_eval = [&](int64_t step) {
    const EvalResult r = evaluate(model, val_data, t.eval_windows, b);
    summary.val_history.emplace_back(step, r.loss);
    line.message(fmt::format("step {:>6}  val_loss {:.4f}  ({} windows)", step, r.loss, r.windows));
    return r.loss;
  };
  const auto save = [&](int64_t steps_done, double val_loss) {
    const fs::path dir = fs::path(t.out_dir) / fmt::format("checkpoint_{:06}", steps_done);
    fs::create_directories(t.out_dir);
    CheckpointMeta meta;
    meta.step = steps_done;
    meta.tokens_seen = static_cast<uint64_t>(steps_done * B * T);
    meta.eot_id = data.eot_id;
    meta.val_loss = val_loss;
    TrainingState state{strategy->state(), at::detail::getDefaultCPUGenerator().get_state()};
    save_checkpoint(dir, model, meta, data.tokenizer_spec, config.to_toml(), state);
    point_latest(t.out_dir, dir);
    summary.checkpoint = dir;
    line.message(fmt::format("step {:>6}  checkpoint {}", steps_done, dir.string()));
  };

  const auto started = Clock::now();
  double last_val = NAN;
  std::vector<torch::Tensor> params = model->parameters();
  for (int64_t step = start; step < t.steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = config.learning_rate(step);
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    double loss_sum = 0;
    for (int64_t k = 0; k < accumulation; ++k) {
      const uint64_t first = static_cast<uint64_t>(step * B + k * b);
      const torch::Tensor tokens = read_sequences(train_data, first, b).to(device);
      const torch::Tensor logits = model->forward(tokens.narrow(1, 0, T));
      const torch::Tensor loss = next_token_loss(logits, tokens.narrow(1, 1, T)) / accumulation;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (!std::isfinite(loss_sum)) {
      fail(
          "step {}: the loss is {} (diverged); lower optimizer.lr (now {}) or raise "
          "schedule.warmup_steps",
          step, loss_sum, config.optimizer.lr);
    }
    // Local clipping (ALGORITHMS.md: scale by min(1, c / (||g|| + 1e-6))); with clipping off the
    // norm is still measured for the log.
    const double clip = config.optimizer.grad_clip > 0 ? config.optimizer.grad_clip
                                                       : std::numeric_limits<double>::infinity();
    const double grad_norm = torch::nn::utils::clip_grad_norm_(params, clip);
    const StepContext context{step, lr};
    const Contribution own = strategy->contribute(context);
    strategy->apply(context, std::span<const Contribution>(&own, 1));

    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    const StepStats stats{step, loss_sum, lr, grad_norm, B * T / std::max(seconds, 1e-9)};
    summary.final_loss = loss_sum;
    if (options.on_step) options.on_step(stats);
    const int64_t done = step + 1 - start;
    line.step(stats, elapsed / done * (t.steps - step - 1));

    const bool last = step + 1 == t.steps;
    if (last || (t.eval_interval > 0 && (step + 1) % t.eval_interval == 0))
      last_val = run_eval(step + 1);
    if (last || (t.checkpoint_interval > 0 && (step + 1) % t.checkpoint_interval == 0)) {
      save(step + 1, last_val);
    }
  }
  line.finish();
  summary.last_step = t.steps;
  summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  summary.tokens_per_second =
      summary.seconds > 0 ? (t.steps - start) * B * T / summary.seconds : 0.0;
  summary.val_loss = last_val;
  return summary;
}

}  // namespace agora
