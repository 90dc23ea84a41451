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
#include <thread>
#include <tuple>
#include <zmq.hpp>

#include "agora/core/error.h"
#include "agora/data/data_meta.h"
#include "agora/data/sampler.h"
#include "agora/net/curve_socket.h"
#include "agora/pipeline/boundary.h"
#include "agora/pipeline/partition.h"
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

// The two connections of a stage and the messages that arrived before their turn.
class Neighbours {
 public:
  Neighbours(const RunConfig& config, const net::Identity& identity, const StageOptions& options,
             int64_t in_flight)
      : stage_(options.stage),
        stages_(config.pipeline.stages),
        timeout_(options.timeout_seconds),
        max_waiting_(in_flight) {
    net::DecodeLimits limits;
    if (stage_ > 0) {
      server_.emplace(context_, identity, options.listen, limits);
    }
    if (stage_ < stages_ - 1) {
      client_.emplace(context_, identity, options.next, options.next_key, limits);
    }
    last_heard_prev_ = last_heard_next_ = Clock::now();
  }

  std::string endpoint() const { return server_ ? server_->bound_endpoint() : ""; }

  void send_forward(std::string bytes) { client_->send(envelope(std::move(bytes), "", stage_)); }

  void send_backward(std::string bytes) {
    if (prev_route_.empty()) fail("stage {}: no previous stage to answer", stage_);
    server_->send(prev_route_, envelope(std::move(bytes), "", stage_));
  }

  // Waits for the message (direction, step, piece) from the neighbour it comes from, keeping
  // any other that arrives meanwhile.
  std::string await(BoundaryDirection direction, int64_t step, int64_t piece) {
    const auto key = std::make_tuple(static_cast<int>(direction), step, piece);
    const bool forward = direction == BoundaryDirection::kForward;
    while (true) {
      const auto found = waiting_.find(key);
      if (found != waiting_.end()) {
        std::string bytes = std::move(found->second);
        waiting_.erase(found);
        return bytes;
      }
      pump(std::chrono::milliseconds(50));
      const double silent = seconds_since(forward ? last_heard_prev_ : last_heard_next_);
      if (silent > timeout_) {
        blamed_ = forward ? stage_ - 1 : stage_ + 1;
        fail(
            "stage {}: stage {} sent nothing for {:.0f} s while this stage waited for its {} of "
            "step {} (it stopped, or the link is down; pipeline stages cannot be replaced during "
            "a run yet)",
            stage_, forward ? stage_ - 1 : stage_ + 1, silent,
            forward ? "activations" : "gradients", step);
      }
    }
  }

  // Best effort: the neighbours learn why this stage stops.
  void tell_failure(const std::string& what) {
    const int64_t first = blamed_ >= 0 ? blamed_ : stage_;
    try {
      if (client_) client_->send(envelope("", what, first));
      if (server_ && !prev_route_.empty()) server_->send(prev_route_, envelope("", what, first));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let ZeroMQ write them
    } catch (const std::exception&) {
    }
  }

  // Once the run is over: wait until what was sent is written (the neighbour may still read).
  void drain() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

  // The neighbour whose message or silence made this stage fail (-1: its own error), and the
  // first stage's own words when a neighbour relayed them.
  int64_t blamed() const { return blamed_; }

  uint64_t bytes_sent() const {
    return (server_ ? server_->bytes_sent() : 0) + (client_ ? client_->bytes_sent() : 0);
  }
  uint64_t bytes_received() const {
    return (server_ ? server_->bytes_received() : 0) + (client_ ? client_->bytes_received() : 0);
  }

 private:
  // `stage`: the sender's, or in an error the stage that failed first.
  static wire::Envelope envelope(std::string bytes, const std::string& error, int64_t stage) {
    wire::Envelope e;
    wire::StageData* data = e.mutable_stage_data();
    data->set_boundary(std::move(bytes));
    data->set_error(error);
    data->set_stage(static_cast<uint32_t>(stage));
    return e;
  }

  void pump(std::chrono::milliseconds wait) {
    std::vector<zmq::pollitem_t> items;
    if (server_) items.push_back({server_->socket().handle(), 0, ZMQ_POLLIN, 0});
    if (client_) items.push_back({client_->socket().handle(), 0, ZMQ_POLLIN, 0});
    zmq::poll(items.data(), items.size(), wait);
    if (server_) {
      while (auto in = server_->recv()) {
        prev_route_ = in->route;
        take(in->message, BoundaryDirection::kForward);
      }
    }
    if (client_) {
      while (auto in = client_->recv()) take(*in, BoundaryDirection::kBackward);
    }
  }

  void take(const wire::Envelope& message, BoundaryDirection expected) {
    const bool forward = expected == BoundaryDirection::kForward;
    const int64_t from = forward ? stage_ - 1 : stage_ + 1;
    if (!message.has_stage_data()) {
      fail("stage {}: stage {} sent a {} message (allowed: stage_data)", stage_, from,
           net::kind_name(message));
    }
    const wire::StageData& data = message.stage_data();
    if (!data.error().empty()) {
      // A stopped stage names the stage that failed first (itself, or the one that stopped it).
      blamed_ = static_cast<int64_t>(data.stage()) < stages_ ? data.stage() : from;
      fail("stage {}: stopping because stage {} stopped: {}", stage_, data.stage(), data.error());
    }
    blamed_ = from;  // until the message proves well-formed
    const BoundaryMessage decoded = decode_boundary(data.boundary());
    const BoundaryHeader& h = decoded.header;
    if (h.direction != expected || static_cast<int64_t>(h.stage) != from) {
      fail(
          "stage {}: a message from the {} neighbour claims direction {} from stage {} "
          "(allowed: direction {} from stage {})",
          stage_, forward ? "previous" : "next", static_cast<int>(h.direction), h.stage,
          static_cast<int>(expected), from);
    }
    blamed_ = -1;
    (forward ? last_heard_prev_ : last_heard_next_) = Clock::now();
    if (static_cast<int64_t>(waiting_.size()) >= max_waiting_) {
      blamed_ = from;
      fail(
          "stage {}: stage {} sent more than {} messages ahead of this stage (allowed: the "
          "schedule's messages in flight)",
          stage_, from, max_waiting_);
    }
    const auto key = std::make_tuple(static_cast<int>(h.direction), static_cast<int64_t>(h.step),
                                     static_cast<int64_t>(h.micro_batch));
    if (!waiting_.emplace(key, data.boundary()).second) {
      blamed_ = from;
      fail("stage {}: stage {} sent step {} micro-batch {} twice", stage_, from, h.step,
           h.micro_batch);
    }
  }

  int64_t stage_, stages_;
  double timeout_;
  int64_t max_waiting_;
  net::Context context_;
  std::optional<net::Server> server_;
  std::optional<net::Client> client_;
  std::string prev_route_;
  int64_t blamed_ = -1;
  Clock::time_point last_heard_prev_, last_heard_next_;
  std::map<std::tuple<int, int64_t, int64_t>, std::string> waiting_;
};

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
        net_(config, identity, options, 2 * (S_ + 1) * pieces_) {
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
    if (!options.events.empty()) {
      if (options.events.has_parent_path()) fs::create_directories(options.events.parent_path());
      events_.open(options.events, std::ios::trunc);
    }
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
    const auto started = run_started_ = Clock::now();
    const int64_t N = config_.train.steps;
    if (!async_) {
      for (int64_t s = 0; s < N; ++s) gpipe_step(s);
    } else if (last()) {
      for (int64_t s = 0; s < N; ++s) last_stage_step(s);
    } else {
      // 1F1B: S - i forwards in flight, then one backward, one forward.
      const int64_t warm = std::min<int64_t>(S_ - span_.stage, N);
      for (int64_t s = 0; s < warm; ++s) forward_only(s);
      for (int64_t k = 0; k < N; ++k) {
        backward_and_update(k);
        if (k + warm < N) forward_only(k + warm);
      }
    }
    net_.drain();
    StageSummary summary;
    summary.steps = N;
    summary.seconds = seconds_since(started);
    summary.tokens_per_second =
        static_cast<double>(N * B_ * config_.data.seq_len) / std::max(summary.seconds, 1e-9);
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
           {"seconds", summary.seconds},
           {"tokens_per_second", summary.tokens_per_second},
           {"parameter_hash", summary.parameter_hash},
           {"peak_rss_bytes", summary.peak_rss_bytes},
           {"bytes_sent", summary.bytes_sent},
           {"bytes_received", summary.bytes_received}});
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
    net_.send_backward(coder_->encode_backward(position(s, j, span_.stage), in.grad()));
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
      net_.send_backward(coder_->encode_backward(position(s, j, span_.stage), in.grad()));
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
      net_.send_forward(coder_->encode_forward(position(s, j, span_.stage), out, tokens));
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

  void event(const nlohmann::json& e) {
    if (events_.is_open()) events_ << e.dump() << '\n' << std::flush;
  }
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
  Neighbours net_;
  std::unique_ptr<SubspaceBasis> subspace_;
  std::optional<BoundaryCoder> coder_;
  StageModel live_{nullptr}, work_{nullptr};
  std::unique_ptr<StageOptimizer> optimizer_;
  std::map<int64_t, Stashed> stashed_;
  double last_loss_ = 0;
  Clock::time_point run_started_ = Clock::now();
  std::ofstream events_;
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
