#include "agora/pipeline/pipeline_trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/data_meta.h"
#include "agora/obs/event_log.h"
#include "agora/obs/progress.h"
#include "agora/pipeline/simulation.h"
#include "agora/train/checkpoint.h"
#include "agora/train/device.h"
#include "agora/train/evaluate.h"

namespace agora {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

PipelineTrainSummary train_pipeline(RunConfig config, const PipelineTrainOptions& options) {
  if (!config.pipeline.enabled()) fail("train_pipeline: pipeline.stages is 1 (no pipeline)");
  const DataMeta data = read_data_meta(config.data.dir);
  if (config.model.vocab_size == 0) config.set_vocab_size(data.vocab_size);
  const TrainConfig& t = config.train;
  torch::set_num_threads(t.threads > 0
                             ? static_cast<int>(t.threads)
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const torch::Device device = resolve_device(t.device);
  const PipelineConfig& pipe = config.pipeline;
  const int64_t B = t.batch_size, T = config.data.seq_len;

  PipelineSimulation pipeline(config, device);
  PipelineTrainSummary summary;
  summary.cut = describe(pipeline.spans());
  for (const StageSpan& span : pipeline.spans())
    summary.stage_parameters.push_back(span.parameters);
  const double whole = static_cast<double>(config.model.num_parameters());

  obs::EventLog events = options.events.empty() ? obs::EventLog() : obs::EventLog(options.events);
  const auto say = [&](const std::string& text) {
    if (options.progress) std::fprintf(stderr, "%s\n", text.c_str());
  };
  say(fmt::format(
      "pipeline of {} stages ({} schedule, {} boundaries, {} per stage) over {} "
      "({:.2f}M parameters), {} steps of {} x {} tokens",
      pipe.stages, pipe.schedule,
      pipe.codec == "subspace" ? fmt::format("subspace k={}", pipe.subspace_rank) : pipe.codec,
      pipe.optimizer, config.model.preset, whole / 1e6, t.steps, B, T));
  nlohmann::json start = {
      {"event", "start"},    {"stages", pipe.stages},       {"schedule", pipe.schedule},
      {"codec", pipe.codec}, {"optimizer", pipe.optimizer}, {"subspace_rank", pipe.subspace_rank},
      {"parameters", whole}, {"cut", summary.cut}};
  for (const StageSpan& span : pipeline.spans()) {
    say(fmt::format("  stage {}: layers {}-{}{}{}, {:.2f}M parameters ({:.0f}% of the model)",
                    span.stage, span.first_layer, span.end_layer - 1,
                    span.embedding ? " + embedding" : "", span.head ? " + norm and head" : "",
                    span.parameters / 1e6, 100.0 * span.parameters / whole));
    start["stage_parameters"].push_back(span.parameters);
  }
  events.write(start);

  const Sampler val_data =
      Sampler::from_directory(config.data.dir, "val", static_cast<uint32_t>(T), config.seed);
  double train_seconds = 0;
  const auto run_eval = [&](int64_t steps_done) {
    Llama model = pipeline.assemble();
    const EvalResult r = evaluate(model, val_data, t.eval_windows, t.micro_batch_size);
    summary.val_history.emplace_back(steps_done, r.loss);
    say(fmt::format("step {:>6}  val_loss {:.4f}  ({} windows)", steps_done, r.loss, r.windows));
    events.write({{"event", "eval"},
                  {"step", steps_done},
                  {"val_loss", r.loss},
                  {"train_seconds", train_seconds}});
    return r.loss;
  };

  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const int64_t interval = std::max<int64_t>(1, t.log_interval);
  int64_t forward_bytes = 0, backward_bytes = 0;
  const auto started = Clock::now();
  for (int64_t step = 0; step < t.steps; ++step) {
    const auto step_start = Clock::now();
    const PipelineStepReport r = pipeline.step(step);
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    train_seconds += seconds;
    forward_bytes += r.forward_bytes;
    backward_bytes += r.backward_bytes;
    summary.final_loss = r.loss;
    events.write({{"event", "step"},
                  {"step", step},
                  {"loss", r.loss},
                  {"lr", r.lr},
                  {"seconds", seconds},
                  {"forward_bytes", r.forward_bytes},
                  {"backward_bytes", r.backward_bytes},
                  {"grad_norms", r.grad_norms}});
    const bool last = step + 1 == t.steps;
    if (options.progress && (tty || (step + 1) % interval == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      const double tokens = static_cast<double>(B * T);
      const std::string line = fmt::format(
          "step {:>6}/{}  loss {:.4f}  lr {:.2e}  {:.0f} tok/s  boundary {:.0f} B/token fwd, "
          "{:.0f} B/token bwd  ETA {}",
          step + 1, t.steps, r.loss, r.lr, tokens / std::max(seconds, 1e-9),
          r.forward_bytes / tokens, r.backward_bytes / tokens,
          format_duration(elapsed / static_cast<double>(step + 1) *
                          static_cast<double>(t.steps - step - 1)));
      std::fprintf(stderr, tty && !last ? "\r\033[2K%s" : "\r\033[2K%s\n", line.c_str());
    }
    if (last || (t.eval_interval > 0 && (step + 1) % t.eval_interval == 0)) {
      if (tty && !last && options.progress) std::fputc('\n', stderr);
      summary.val_loss = run_eval(step + 1);
    }
  }
  summary.steps = t.steps;
  summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const double tokens = static_cast<double>(t.steps * B * T);
  summary.tokens_per_second = summary.seconds > 0 ? tokens / summary.seconds : 0;
  summary.forward_bytes_per_token = static_cast<double>(forward_bytes) / tokens;
  summary.backward_bytes_per_token = static_cast<double>(backward_bytes) / tokens;

  // The whole model, as one Hugging Face checkpoint (the stages' parameters carry its names).
  const fs::path dir = fs::path(t.out_dir) / fmt::format("checkpoint_{:06}", t.steps);
  fs::create_directories(t.out_dir);
  CheckpointMeta meta;
  meta.step = t.steps;
  meta.tokens_seen = config.data_tokens_through(t.steps);
  meta.eot_id = data.eot_id;
  meta.val_loss = summary.val_loss;
  Llama model = pipeline.assemble();
  save_checkpoint(dir, model, meta, data.tokenizer_spec, config.to_toml(), TrainingState{});
  replace_symlink(fs::path(t.out_dir) / "latest", dir.filename());
  summary.checkpoint = dir;
  std::vector<std::string> stage_hashes;
  for (const StageModel& stage : pipeline.stages())
    stage_hashes.push_back(stage_parameter_hash(stage));
  events.write({{"event", "finish"},
                {"stage_hashes", stage_hashes},
                {"steps", t.steps},
                {"final_loss", summary.final_loss},
                {"val_loss", summary.val_loss},
                {"seconds", summary.seconds},
                {"tokens_per_second", summary.tokens_per_second},
                {"forward_bytes_per_token", summary.forward_bytes_per_token},
                {"backward_bytes_per_token", summary.backward_bytes_per_token},
                {"checkpoint", dir.string()}});
  return summary;
}

}  // namespace agora
