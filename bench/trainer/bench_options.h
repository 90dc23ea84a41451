// bench_options.h: what bench_trainer's launcher and its workers share -- the command-line
// Options, the Cases it measures (a preset at a shape), the optimizer of the comparison, and the
// small numeric helpers (median, timing, FLOPs per token).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "agora/config/model_config.h"

namespace agora::bench {

// The optimizer of the comparison (both sides): a constant learning rate, AdamW, clipping.
constexpr double kLr = 3e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;
constexpr double kGradClip = 1.0;

// The shapes measured by default: the original short-window shapes (tiny 8 x 64, small 8 x 256),
// the shape the demo and the convergence lab train at (tiny, 32 x 128 tokens in micro-batches
// of 8), and a sweep of that step's micro-batch size. Sized so the whole default run (every
// case, four implementations each, and the sgemm ceiling) stays under about six minutes on 2
// cores.
inline constexpr const char* kDefaultCases =
    "tiny:8x64/8,tiny:32x128/4,tiny:32x128/8,tiny:32x128/16,tiny:32x128/32,small:8x256/8";

// Untimed warm-up steps and timed steps per repeat for each preset at its reference shape
// (tiny 8 x 64, small 8 x 256, ...); a case with more tokens per step gets proportionally fewer
// (at least 2 timed steps and 1 warm-up step).
struct PresetDefaults {
  const char* name;
  int64_t tokens_per_step, warmup, steps;
};
inline constexpr PresetDefaults kPresetDefaults[] = {
    {"tiny", 8 * 64, 5, 30},
    {"small", 8 * 256, 2, 3},
    {"gpt2-124m", 8 * 1024, 1, 2},
    {"1b", 8 * 2048, 1, 1},
};

// One measurement: a preset trained at batch x seq_len tokens per step, in micro-batches of
// micro_batch sequences (the loss of each scaled by micro_batch / batch, as the trainer does).
struct Case {
  std::string preset;
  int64_t batch = 0, seq_len = 0, micro_batch = 0;
  int64_t warmup = 0, steps = 0;

  // "tiny:32x128/8" (preset:batchxseq_len/micro_batch), the form --cases takes.
  std::string name() const;
  int64_t tokens_per_step() const { return batch * seq_len; }
};

// Parses one "preset:BxT/M" (with the step counts from the preset's defaults unless `warmup` >= 0
// or `steps` > 0). Throws Error naming the text and the form allowed, or an unknown preset.
Case parse_case(const std::string& text, int64_t warmup, int64_t steps);

struct Options {
  std::string cases = kDefaultCases;
  int64_t vocab = 8192;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t warmup = -1;  // -1: the preset's default
  int64_t steps = 0;    // 0: the preset's default
  int repeats = 3;
  uint64_t seed = 1234;
  int64_t sgemm_size = 2048;
  int sgemm_iters = 5;
  std::string python = "/usr/bin/python3";
  std::string script = AGORA_TRAINER_REFERENCE;
  bool no_python = false;
  bool no_python_mallopt = false;
  bool no_system_malloc = false;
  std::string json_path;
  // Worker mode (internal): "agora" or "sgemm", for one --case.
  std::string worker;
  std::string worker_case;
};

// The median of `v`; NaN when empty.
double median(std::vector<double> v);

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// 6 * matmul parameters + 12 * num_layers * seq_len * hidden_size (PaLM's formula; the matmul
// parameters are all but an untied input embedding, which is looked up, not multiplied).
int64_t flops_per_token(const ModelConfig& c);

}  // namespace agora::bench
