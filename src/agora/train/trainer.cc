#include "agora/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/corpus_tokenizer.h"
#include "agora/data/data_meta.h"
#include "agora/data/sampler.h"
#include "agora/data/tokenizer.h"
#include "agora/obs/progress.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"
#include "agora/train/parameter_hash.h"
#include "agora/train/step.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

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
        "step {:>6}/{}  loss {:.4f}{}  lr {:.2e}  |g| {:.3f}  {:.0f} tok/s  {}/peer  ETA {}",
        s.step + 1, total_, s.loss, s.bag > 1 ? fmt::format(" (bags of {})", s.bag) : "", s.lr,
        s.grad_norm, s.tokens_per_second, format_bytes(static_cast<double>(s.payload_bytes)),
        format_duration(eta_seconds));
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

// One simulated peer: its own copy of the model and its own strategy state.
struct Replica {
  std::string id;
  Learner learner;
};

// Training state keys: a single peer's strategy state as it is, several peers' under "peer-NNN.".
std::map<std::string, torch::Tensor> gather_state(const std::vector<Replica>& replicas) {
  if (replicas.size() == 1) return replicas[0].learner.strategy->state();
  std::map<std::string, torch::Tensor> out;
  for (const Replica& r : replicas) {
    for (auto& [name, tensor] : r.learner.strategy->state()) out[r.id + "." + name] = tensor;
  }
  return out;
}

void scatter_state(std::vector<Replica>& replicas,
                   const std::map<std::string, torch::Tensor>& state, const fs::path& checkpoint) {
  std::set<std::string> peers;
  for (const auto& item : state) {
    if (item.first.starts_with("peer-")) peers.insert(item.first.substr(0, item.first.find('.')));
  }
  const size_t trained_with = peers.empty() ? 1 : peers.size();
  if (!state.empty() && trained_with != replicas.size()) {
    fail("checkpoint {} holds the state of {}; resume it with --simulate-peers {}",
         checkpoint.string(),
         trained_with == 1 ? "one peer" : fmt::format("{} simulated peers", trained_with),
         trained_with);
  }
  if (replicas.size() == 1) return replicas[0].learner.strategy->load_state(state);
  for (Replica& r : replicas) {
    std::map<std::string, torch::Tensor> own;
    const std::string prefix = r.id + ".";
    for (const auto& [name, tensor] : state) {
      if (name.starts_with(prefix)) own[name.substr(prefix.size())] = tensor;
    }
    if (own.empty() && !state.empty()) {
      fail("checkpoint {} has no state for {}", checkpoint.string(), r.id);
    }
    r.learner.strategy->load_state(own);
  }
}

// Every replica must hold replica 0's bits after an exchange; anything else is a bug in a
// strategy's determinism, and training on would hide it.
void check_identical(std::vector<Replica>& replicas, int64_t step) {
  for (size_t i = 1; i < replicas.size(); ++i) {
    for (size_t k = 0; k < replicas[0].learner.params.size(); ++k) {
      if (!torch::equal(replicas[0].learner.params[k], replicas[i].learner.params[k])) {
        fail(
            "step {}: simulated {} holds different parameters from {} (tensor {}); the "
            "strategy is not deterministic",
            step, replicas[i].id, replicas[0].id, k);
      }
    }
  }
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

  const int64_t N = options.simulate_peers;
  const int64_t B = t.batch_size, T = config.data.seq_len;
  if (N < 1 || B % N != 0) {
    fail(
        "--simulate-peers {} does not divide train.batch_size = {} (allowed: a divisor of the "
        "global batch, so every peer trains the same number of sequences)",
        N, B);
  }
  const int64_t per_peer = B / N, b = std::min(t.micro_batch_size, per_peer);
  if (per_peer % b != 0) {
    fail(
        "each of the {} simulated peers trains {} sequences a step, which is not a multiple of "
        "train.micro_batch_size = {} (allowed: a micro-batch size that divides batch_size / peers)",
        N, per_peer, b);
  }

  std::vector<Replica> replicas(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    Replica& r = replicas[static_cast<size_t>(i)];
    r.id = fmt::format("peer-{:03}", i);
    r.learner = Learner::create(config, device);
  }
  Llama& model = replicas[0].learner.model;

  // Each simulated peer trains its slice of the global batch in micro-batches of b.
  RunConfig step_config = config;
  step_config.train.micro_batch_size = b;
  const TrainStep train_step(step_config, device);
  const Sampler val_data =
      Sampler::from_directory(config.data.dir, "val", config.data.seq_len, config.seed);
  // TST phase 1 validates on bags as well, from a sampler of its own.
  const int64_t switch_step = config.tst_switch_step(), bag = config.tst.bag;
  std::optional<Sampler> bag_val;
  if (switch_step > 0 && bag > 1) {
    bag_val = Sampler::from_directory(config.data.dir, "val", config.data.seq_len, config.seed,
                                      static_cast<uint32_t>(bag));
  }

  TrainSummary summary;
  summary.parameters = config.model.num_parameters();
  summary.simulated_peers = N;
  summary.tst_switch_step = switch_step;
  int64_t start = 0;
  if (!options.resume.empty()) {
    const LoadedCheckpoint checkpoint = load_checkpoint(options.resume, device);
    // Compared as configs, not as text: a run.toml written before a section existed (such as
    // [tst]) still names the same run when the new keys keep their defaults.
    bool same_run = false;
    try {
      same_run = !checkpoint.run_config_toml.empty() &&
                 RunConfig::parse(checkpoint.run_config_toml, "run.toml") == config;
    } catch (const Error&) {
      same_run = false;  // an unreadable run.toml cannot vouch for the run
    }
    if (!same_run) {
      fail(
          "checkpoint {} was written by a different run config; resume with the config in its "
          "run.toml (agora train --config {}/run.toml --resume {})",
          options.resume.string(), options.resume.string(), options.resume.string());
    }
    const TrainingState state = load_training_state(options.resume);
    {
      torch::NoGradGuard no_grad;
      for (Replica& r : replicas) {
        auto target = r.learner.model->named_parameters();
        for (auto& item : checkpoint.model->named_parameters())
          target[item.key()].copy_(item.value());
      }
    }
    scatter_state(replicas, state.strategy, options.resume);
    if (state.rng.defined()) {
      auto generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(state.rng);
    }
    start = checkpoint.meta.step;
  }
  summary.first_step = start;

  const AutocastGuard autocast(device, t.dtype == "bfloat16");
  StepLine line(options.progress, t.steps, t.log_interval);
  line.message(
      fmt::format("training {} ({:.2f}M parameters) on {} for {} steps of {} x {} tokens with {}{}",
                  config.model.preset, summary.parameters / 1e6, device.str(), t.steps, B, T,
                  config.optimizer.name, N > 1 ? fmt::format(", {} simulated peers", N) : ""));
  if (switch_step > start) {
    line.message(fmt::format(
        "token superposition: steps 0-{} read bags of {} tokens ({} data tokens per sequence), "
        "then next-token training",
        switch_step - 1, bag, bag * T));
  }
  for (const std::string& warning : replicas[0].learner.strategy->warnings()) {
    line.message("warning: " + warning);
  }
  if (!options.save_payloads.empty()) fs::create_directories(options.save_payloads);

  double train_seconds = 0;  // in training steps only: what bench/tst compares
  const auto run_eval = [&](int64_t step) {
    const EvalResult r = evaluate(model, val_data, t.eval_windows, b);
    summary.val_history.emplace_back(step, r.loss);
    EvalPoint point{step, r.loss, NAN, train_seconds};
    std::string bag_text;
    // While the model has only ever seen bags, the bag loss says how phase 1 itself is going.
    if (bag_val && step <= switch_step) {
      point.bag_val_loss = evaluate(model, *bag_val, t.eval_windows, b).loss;
      summary.bag_val_history.emplace_back(step, point.bag_val_loss);
      bag_text = fmt::format("  bag_val_loss {:.4f} (bags of {})", point.bag_val_loss, bag);
    }
    line.message(fmt::format("step {:>6}  val_loss {:.4f}{}  ({} windows)", step, r.loss, bag_text,
                             r.windows));
    if (options.on_eval) options.on_eval(point);
    return r.loss;
  };
  const auto save = [&](int64_t steps_done, double val_loss) {
    const fs::path dir = fs::path(t.out_dir) / fmt::format("checkpoint_{:06}", steps_done);
    fs::create_directories(t.out_dir);
    CheckpointMeta meta;
    meta.step = steps_done;
    meta.tokens_seen = config.data_tokens_through(steps_done);
    meta.eot_id = data.eot_id;
    meta.val_loss = val_loss;
    TrainingState state{gather_state(replicas), at::detail::getDefaultCPUGenerator().get_state()};
    save_checkpoint(dir, model, meta, data.tokenizer_spec, config.to_toml(), state);
    replace_symlink(fs::path(t.out_dir) / "latest", dir.filename());
    summary.checkpoint = dir;
    line.message(fmt::format("step {:>6}  checkpoint {}", steps_done, dir.string()));
  };

  const auto started = Clock::now();
  double last_val = NAN;
  std::vector<Contribution> contributions(static_cast<size_t>(N));
  for (int64_t step = start; step < t.steps; ++step) {
    if (step == switch_step && switch_step > 0) {
      line.message(fmt::format(
          "step {:>6}  token superposition ends: next-token training from here on, same "
          "weights, optimizer state and schedule (the loss jumps for a while)",
          step));
    }
    const auto step_start = Clock::now();
    const StepContext context{step, config.learning_rate(step), N};
    double loss_sum = 0, norm_sum = 0;
    int64_t bytes = 0;
    for (int64_t i = 0; i < N; ++i) {
      Replica& r = replicas[static_cast<size_t>(i)];
      const SequenceRange share{static_cast<uint64_t>(step * B + i * per_peer),
                                static_cast<uint64_t>(per_peer)};
      StepResult result = train_step.run(r.learner, context, {&share, 1});
      loss_sum += result.loss;
      norm_sum += result.grad_norm;
      Contribution& own = contributions[static_cast<size_t>(i)];
      own = std::move(result.contribution);
      own.peer = r.id;
      bytes += static_cast<int64_t>(own.bytes.size());
      if (!options.save_payloads.empty() && !own.bytes.empty()) {
        write_file_atomic(options.save_payloads / fmt::format("step_{:06}_{}.agp", step, r.id),
                          own.bytes);
      }
    }
    if (options.on_contributions) options.on_contributions(step, contributions);
    bool exchanged = false;
    ApplyReport applied;
    for (Replica& r : replicas) applied = r.learner.strategy->apply(context, contributions);
    for (const Contribution& c : contributions) exchanged = exchanged || !c.bytes.empty();
    if (exchanged) check_identical(replicas, step);

    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    train_seconds += seconds;
    StepStats stats{
        step,      loss_sum / N,        context.lr, norm_sum / N, B * T / std::max(seconds, 1e-9),
        bytes / N, train_step.bag(step)};
    stats.refused = static_cast<int64_t>(applied.refused.size());
    stats.clipped = applied.clipped;
    stats.skipped = applied.skipped;
    summary.final_loss = stats.loss;
    summary.payload_bytes_per_peer += static_cast<uint64_t>(stats.payload_bytes);
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
  summary.parameter_hash = parameter_hash(model);
  return summary;
}

}  // namespace agora
