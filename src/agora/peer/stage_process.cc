#include "agora/peer/stage_process.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "agora/core/crash_point.h"
#include "agora/core/error.h"
#include "agora/data/data_meta.h"
#include "agora/data/sampler.h"
#include "agora/obs/event_log.h"
#include "agora/peer/stage_link.h"
#include "agora/pipeline/boundary.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/stage_checkpoint.h"
#include "agora/pipeline/stage_files.h"
#include "agora/pipeline/stage_model.h"
#include "agora/pipeline/stage_optimizer.h"
#include "agora/pipeline/subspace.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"

namespace agora::peer {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class StageRunner {
 public:
  StageRunner(const RunConfig& config, const net::Identity& identity, const StageOptions& options)
      : config_(config),
        options_(options),
        spans_(partition_model(config.model, config.pipeline.stages)),
        span_(spans_.at(static_cast<size_t>(options.stage))),
        S_(config.pipeline.stages),
        B_(config.train.batch_size),
        async_(config.pipeline.schedule == "async"),
        pieces_(async_ ? B_ / std::min(B_, config.train.micro_batch_size)
                       : config.pipeline.micro_batches),
        data_(Sampler::from_directory(config.data.dir, "train",
                                      static_cast<uint32_t>(config.data.seq_len), config.seed)),
        net_(identity, link_options(config, options, pieces_)),
        fingerprint_(stage_run_fingerprint(config)) {
    if (config.pipeline.codec == "subspace") {
      subspace_ = std::make_unique<SubspaceBasis>(config.model, config.pipeline.subspace_rank,
                                                  config.seed, torch::kCPU);
    }
    coder_.emplace(config.pipeline, config.model.hidden_size, subspace_.get());
    live_ = StageModel(config.model, span_, config.seed, subspace_.get());
    live_->train();
    if (async_ && !last()) {
      work_ = StageModel(config.model, span_, config.seed, subspace_.get());
      work_->train();
    }
    optimizer_ = std::make_unique<StageOptimizer>(config, live_->hf_parameters());
    if (!options.events.empty()) events_ = obs::EventLog(options.events, /*append=*/options.resume);
  }

  StageSummary run() {
    event({{"event", "start"},
           {"stage", span_.stage},
           {"stages", S_},
           {"first_layer", span_.first_layer},
           {"end_layer", span_.end_layer},
           {"parameters", span_.parameters},
           {"tokens_per_step", B_ * config_.data.seq_len},
           {"endpoint", net_.endpoint()}});
    say(fmt::format("stage {} of {}: layers {}-{}{}{}, {:.2f}M parameters", span_.stage, S_,
                    span_.first_layer, span_.end_layer - 1, first() ? " + embedding" : "",
                    last() ? " + norm and head" : "", span_.parameters / 1e6));
    const int64_t N = config_.train.steps;
    const std::vector<uint64_t> held =
        options_.resume ? stage_checkpoint_steps(options_.checkpoint_dir, span_.stage, fingerprint_)
                        : std::vector<uint64_t>{};
    const auto from = static_cast<int64_t>(net_.start(fingerprint_, held));
    if (from > 0) resume(from);
    const auto started = run_started_ = Clock::now();
    if (!async_) {
      for (int64_t s = from; s < N; ++s) {
        gpipe_step(s);
        checkpoint_after(s);
      }
    } else if (last()) {
      for (int64_t s = from; s < N; ++s) {
        last_stage_step(s);
        checkpoint_after(s);
      }
    } else {
      // 1F1B: S - i forwards in flight, then one backward, one forward. A resumed stage has
      // its forwards in flight from the checkpoint.
      const int64_t warm = std::min<int64_t>(S_ - span_.stage, N);
      if (from == 0) {
        for (int64_t s = 0; s < warm; ++s) forward_only(s);
      }
      for (int64_t k = from; k < N; ++k) {
        backward_and_update(k);
        if (k + warm < N) forward_only(k + warm);
        forget_consumed(k);
        checkpoint_after(k);
      }
    }
    net_.drain();
    StageSummary summary;
    summary.steps = N - from;
    summary.seconds = seconds_since(started);
    summary.tokens_per_second = static_cast<double>((N - from) * B_ * config_.data.seq_len) /
                                std::max(summary.seconds, 1e-9);
    summary.last_loss = last_loss_;
    summary.parameter_hash = stage_parameter_hash(live_);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    summary.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
    summary.bytes_sent = net_.bytes_sent();
    summary.bytes_received = net_.bytes_received();
    if (!options_.out_dir.empty()) save_stage_file(options_.out_dir, live_, subspace_.get(), N);
    event({{"event", "finish"},
           {"stage", span_.stage},
           {"steps", N},
           {"resumed_at", from},
           {"seconds", summary.seconds},
           {"tokens_per_second", summary.tokens_per_second},
           {"parameter_hash", summary.parameter_hash},
           {"peak_rss_bytes", summary.peak_rss_bytes},
           {"bytes_sent", summary.bytes_sent},
           {"bytes_received", summary.bytes_received},
           {"ignored_messages", net_.ignored()}});
    return summary;
  }

  // Records the failure (with the neighbour to blame, if any) and tells the neighbours.
  void stopped(const std::string& what) {
    event(
        {{"event", "error"}, {"stage", span_.stage}, {"blamed", net_.blamed()}, {"message", what}});
    net_.tell_failure(what);
  }

 private:
  bool first() const { return span_.embedding; }
  bool last() const { return span_.head; }

  // The windows of step s's piece j; every stage reads them from its own copy of the data.
  torch::Tensor windows(int64_t s, int64_t j) const {
    const int64_t count = B_ / pieces_;
    return read_sequences(data_, static_cast<uint64_t>(s * B_ + j * count), count);
  }
  BoundaryPosition position(int64_t s, int64_t j, int64_t sender) const {
    return {static_cast<uint64_t>(s), static_cast<uint32_t>(j), static_cast<uint32_t>(sender)};
  }
  int64_t T() const { return config_.data.seq_len; }

  // This stage's input for step s piece j: token ids on stage 0, else the previous stage's
  // activations (leaf tensors that collect their gradient).
  torch::Tensor input(int64_t s, int64_t j, const torch::Tensor& tokens) {
    if (first()) return tokens;
    const BoundaryPosition at = position(s, j, span_.stage - 1);
    return coder_
        ->decode_forward(net_.await(BoundaryDirection::kForward, s, j), at, tokens, torch::kCPU)
        .requires_grad_(true);
  }

  // The last stage: the loss of piece j, its backward, the gradient back.
  double loss_and_backward(StageModel& module, int64_t s, int64_t j, const torch::Tensor& in,
                           const torch::Tensor& targets) {
    const torch::Tensor loss = next_token_loss(module->forward(in), targets) /
                               (static_cast<double>(B_) / static_cast<double>(B_ / pieces_));
    loss.backward();
    net_.send_backward(coder_->encode_backward(position(s, j, span_.stage), in.grad(), in));
    return loss.item<double>();
  }

  void clear(StageModel& module) {
    for (torch::Tensor& p : module->parameters()) p.mutable_grad() = torch::Tensor();
  }

  void update(int64_t s, double loss, Clock::time_point started) {
    const double lr = config_.learning_rate(s);
    const double norm = optimizer_->step(lr);
    live_->constrain_to_subspace();
    if (last()) last_loss_ = loss;
    const double seconds = seconds_since(started);
    event({{"event", "step"},
           {"step", s},
           {"loss", loss},
           {"lr", lr},
           {"grad_norm", norm},
           {"seconds", seconds},
           {"elapsed", seconds_since(run_started_)},
           {"bytes_sent", net_.bytes_sent()},
           {"bytes_received", net_.bytes_received()}});
    if (options_.progress && last() &&
        ((s + 1) % std::max<int64_t>(1, config_.train.log_interval) == 0 ||
         s + 1 == config_.train.steps)) {
      say(fmt::format("step {:>6}/{}  loss {:.4f}  lr {:.2e}", s + 1, config_.train.steps, loss,
                      lr));
    }
  }

  void gpipe_step(int64_t s) {
    const auto started = Clock::now();
    clear(live_);
    std::vector<torch::Tensor> inputs(static_cast<size_t>(pieces_)),
        outputs(static_cast<size_t>(pieces_));
    double loss = 0;
    for (int64_t j = 0; j < pieces_; ++j) {
      const torch::Tensor w = windows(s, j);
      const torch::Tensor tokens = w.narrow(1, 0, T());
      inputs[j] = input(s, j, tokens);
      if (last()) {
        loss += loss_and_backward(live_, s, j, inputs[j], w.narrow(1, 1, T()));
        continue;
      }
      outputs[j] = live_->forward(inputs[j]);
      net_.send_forward(coder_->encode_forward(position(s, j, span_.stage), outputs[j], tokens));
    }
    if (!last()) {
      for (int64_t j = 0; j < pieces_; ++j) backward_piece(s, j, outputs[j], inputs[j]);
    }
    update(s, loss, started);
  }

  // The gradient of piece j's output arrives; it flows through this stage and on back.
  void backward_piece(int64_t s, int64_t j, const torch::Tensor& output, const torch::Tensor& in) {
    const BoundaryPosition from_next = position(s, j, span_.stage + 1);
    output.backward(coder_->decode_backward(net_.await(BoundaryDirection::kBackward, s, j),
                                            from_next, output.size(0), output.size(1),
                                            torch::kCPU));
    if (!first()) {
      net_.send_backward(coder_->encode_backward(position(s, j, span_.stage), in.grad(), in));
    }
  }

  // async, not the last stage: step s's forward at the current weights, which are stashed.
  void forward_only(int64_t s) {
    Stashed& stash = stashed_[s];
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : live_->parameters()) stash.version.push_back(p.detach().clone());
    for (int64_t j = 0; j < pieces_; ++j) {
      const torch::Tensor tokens = windows(s, j).narrow(1, 0, T());
      const torch::Tensor in = input(s, j, tokens);
      if (!first()) stash.inputs.push_back(in.detach());
      const torch::Tensor out = live_->forward(in);
      std::string bytes = coder_->encode_forward(position(s, j, span_.stage), out, tokens);
      if (checkpointing()) sent_[{s, j}] = bytes;
      net_.send_forward(std::move(bytes));
    }
  }

  // async, not the last stage: the forward again at the stashed weights, the gradient from the
  // next stage through it, applied to the newest weights.
  void backward_and_update(int64_t s) {
    const auto started = Clock::now();
    auto found = stashed_.find(s);
    if (found == stashed_.end()) fail("stage {}: step {} has no stashed forward", span_.stage, s);
    {
      torch::NoGradGuard no_grad;
      auto params = work_->parameters();
      for (size_t k = 0; k < params.size(); ++k) params[k].copy_(found->second.version[k]);
    }
    clear(work_);
    for (int64_t j = 0; j < pieces_; ++j) {
      const torch::Tensor in =
          first() ? windows(s, j).narrow(1, 0, T())
                  : found->second.inputs[static_cast<size_t>(j)].clone().requires_grad_(true);
      backward_piece(s, j, work_->forward(in), in);
    }
    stashed_.erase(found);
    auto from = work_->parameters(), to = live_->parameters();
    for (size_t k = 0; k < from.size(); ++k) to[k].mutable_grad() = from[k].grad();
    update(s, 0, started);
  }

  // async, the last stage: never stale; forward, loss and backward at once.
  void last_stage_step(int64_t s) {
    const auto started = Clock::now();
    clear(live_);
    double loss = 0;
    for (int64_t j = 0; j < pieces_; ++j) {
      const torch::Tensor w = windows(s, j);
      loss += loss_and_backward(live_, s, j, input(s, j, w.narrow(1, 0, T())), w.narrow(1, 1, T()));
    }
    update(s, loss, started);
  }

  static StageLinkOptions link_options(const RunConfig& config, const StageOptions& options,
                                       int64_t pieces) {
    StageLinkOptions o;
    // A boundary message carries one piece's activations or their gradient (float32 at most,
    // and its tokens): a neighbour's frame is bounded by that, not by the network's 1 GiB.
    const auto piece = static_cast<size_t>(config.train.batch_size / pieces) *
                       static_cast<size_t>(config.data.seq_len) *
                       static_cast<size_t>(config.model.hidden_size + 1) * 4;
    o.max_boundary_bytes = 2 * piece + (size_t{1} << 20);
    o.stage = options.stage;
    o.stages = config.pipeline.stages;
    o.listen = options.listen;
    o.next = options.next;
    o.next_key = options.next_key;
    o.prev_key = options.prev_key;
    o.timeout_seconds = options.timeout_seconds;
    o.start_timeout_seconds = std::max(600.0, options.timeout_seconds);
    o.max_waiting = 2 * (o.stages + 1) * pieces;
    return o;
  }

  // async: drops the forward messages the next stage has used by the end of its iteration k
  // (stage_checkpoint.h): the last stage uses step k's in iteration k, a stage j < S - 1 the
  // forward of step k + S - j.
  void forget_consumed(int64_t k) {
    const int64_t next = span_.stage + 1;
    const int64_t used = next == S_ - 1 ? k : k + std::min<int64_t>(S_ - next, config_.train.steps);
    while (!sent_.empty() && sent_.begin()->first.first <= used) sent_.erase(sent_.begin());
  }

  // After iteration k, every train.checkpoint_interval steps (not after the last: the run's
  // end writes the stage file), the stage's state into options.checkpoint_dir.
  void checkpoint_after(int64_t k) {
    save_checkpoint_if_due(k);
    crash_point("stage.after_step");
  }
  bool checkpointing() const {
    return config_.train.checkpoint_interval > 0 && !options_.checkpoint_dir.empty();
  }

  void save_checkpoint_if_due(int64_t k) {
    const int64_t every = config_.train.checkpoint_interval;
    if (!checkpointing() || (k + 1) % every != 0 || k + 1 >= config_.train.steps) return;
    const auto started = Clock::now();
    StageCheckpoint state;
    state.steps = k + 1;
    state.optimizer = optimizer_->state();
    for (const auto& [step, stash] : stashed_) {
      state.stashes[step] = {stash.version, stash.inputs};
    }
    state.unconsumed = sent_;
    // Stages drift apart by up to S + 1 steps under async (one under gpipe): each keeps enough
    // checkpoints that the newest step all hold survives on every stage, and no stage prunes
    // a step folder another is still writing.
    const int keep = static_cast<int>(2 + (async_ ? (S_ + 1 + every - 1) / every : 0));
    save_stage_checkpoint(options_.checkpoint_dir, live_, subspace_.get(), fingerprint_, state,
                          keep);
    event({{"event", "checkpoint"},
           {"stage", span_.stage},
           {"steps", k + 1},
           {"seconds", seconds_since(started)},
           {"dir", options_.checkpoint_dir.string()}});
  }

  // Continues from the checkpoint of `steps` updates: weights, optimizer state, the forwards in
  // flight (async) and, sent again, the messages the next stage had not used.
  void resume(int64_t steps) {
    StageCheckpoint state =
        load_stage_checkpoint(options_.checkpoint_dir, steps, live_, fingerprint_);
    optimizer_->load_state(state.optimizer);  // the weights were saved constrained already
    // What the schedule holds after iteration steps - 1 (stage_checkpoint.h), and nothing else.
    const int64_t N = config_.train.steps;
    const int64_t warm = async_ && !last() ? std::min<int64_t>(S_ - span_.stage, N) : 0;
    const auto params = live_->parameters();
    for (auto& [step, stash] : state.stashes) {
      bool fits = step >= steps && step < std::min(steps + warm, N) &&
                  stash.inputs.size() == static_cast<size_t>(first() ? 0 : pieces_);
      for (size_t k = 0; fits && k < params.size(); ++k) {
        fits = stash.version[k].sizes() == params[k].sizes();
      }
      if (!fits) {
        fail(
            "stage {}: the checkpoint at step {} stashes a forward of step {} that this stage's "
            "schedule cannot hold (allowed: steps {} to {}, {} inputs, the stage's shapes)",
            span_.stage, steps, step, steps, std::min(steps + warm, N) - 1, first() ? 0 : pieces_);
      }
      stashed_[step] = {std::move(stash.version), std::move(stash.inputs)};
    }
    if (static_cast<int64_t>(stashed_.size()) !=
        std::max<int64_t>(0, std::min(steps + warm, N) - steps)) {
      fail("stage {}: the checkpoint at step {} stashes {} forwards (expected {})", span_.stage,
           steps, stashed_.size(), std::min(steps + warm, N) - steps);
    }
    for (const auto& [at, bytes] : state.unconsumed) {
      if (!async_ || last() || at.first < steps || at.first >= steps + warm || at.second < 0 ||
          at.second >= pieces_) {
        fail(
            "stage {}: the checkpoint at step {} holds a sent message of step {} piece {} "
            "(allowed: async, steps {} to {}, pieces below {})",
            span_.stage, steps, at.first, at.second, steps, steps + warm - 1, pieces_);
      }
    }
    sent_ = std::move(state.unconsumed);
    for (const auto& [at, bytes] : sent_) net_.send_forward(bytes);
    event({{"event", "resume"}, {"stage", span_.stage}, {"step", steps}});
    say(fmt::format("stage {}: resumed at step {} from {}", span_.stage, steps,
                    options_.checkpoint_dir.string()));
  }

  void event(const nlohmann::json& e) { events_.write(e); }
  void say(const std::string& text) const {
    if (options_.progress) std::fprintf(stderr, "%s\n", text.c_str());
  }

  struct Stashed {
    std::vector<torch::Tensor> version;  // the weights the forward ran at
    std::vector<torch::Tensor> inputs;   // per piece (stages > 0)
  };

  RunConfig config_;
  StageOptions options_;
  std::vector<StageSpan> spans_;
  StageSpan span_;
  int64_t S_, B_;
  bool async_;
  int64_t pieces_;
  Sampler data_;
  StageLink net_;
  std::string fingerprint_;
  std::unique_ptr<SubspaceBasis> subspace_;
  std::optional<BoundaryCoder> coder_;
  StageModel live_{nullptr}, work_{nullptr};
  std::unique_ptr<StageOptimizer> optimizer_;
  std::map<int64_t, Stashed> stashed_;
  // async: the forward messages sent that the next stage may not have used yet, for checkpoints.
  std::map<std::pair<int64_t, int64_t>, std::string> sent_;
  double last_loss_ = 0;
  Clock::time_point run_started_ = Clock::now();
  obs::EventLog events_;  // --events, or closed
};

}  // namespace

StageSummary run_stage(const RunConfig& config, const net::Identity& identity,
                       const StageOptions& options) {
  if (!config.pipeline.enabled()) fail("agora stage: pipeline.stages is 1 (no pipeline)");
  if (options.stage < 0 || options.stage >= config.pipeline.stages) {
    fail("--stage {} is invalid (allowed: 0 to {})", options.stage, config.pipeline.stages - 1);
  }
  if (options.stage > 0 && options.listen.empty()) {
    fail("stage {} needs --listen (where stage {} connects)", options.stage, options.stage - 1);
  }
  if (options.stage < config.pipeline.stages - 1 && options.next.empty()) {
    fail("stage {} needs --next and --next-key (stage {}'s endpoint and key)", options.stage,
         options.stage + 1);
  }
  StageRunner runner(config, identity, options);
  try {
    return runner.run();
  } catch (const std::exception& error) {
    runner.stopped(error.what());
    throw;
  }
}

}  // namespace agora::peer
