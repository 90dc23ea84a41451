// bench_options.h: what bench_trainer's launcher and its workers share -- the command-line
// Options, the per-preset defaults and the Shape they resolve to, the optimizer of the
// comparison, and the small numeric helpers (median, timing, FLOPs per token).
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

// Per-preset defaults sized so the whole default run (tiny and small, both sides, sgemm) stays
// under about three minutes on 2 cores.
struct PresetDefaults {
  const char* name;
  int64_t seq_len, warmup, steps;
};
inline constexpr PresetDefaults kPresetDefaults[] = {
    {"tiny", 64, 5, 30},
    {"small", 256, 2, 3},
    {"gpt2-124m", 1024, 1, 2},
    {"1b", 2048, 1, 1},
};

struct Options {
  std::string presets = "tiny,small";
  int64_t vocab = 8192;
  int64_t seq_len = 0;  // 0: the preset's default
  int64_t batch = 8;
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
  std::string json_path;
  // Worker mode (internal): "agora" or "sgemm", for one --preset.
  std::string worker;
  std::string preset;
};

// The defaults of preset `name`; fails (listing the presets) for an unknown one.
const PresetDefaults& defaults_for(const std::string& name);

struct Shape {
  int64_t seq_len, warmup, steps;
};

// The sequence length and step counts for `preset`: the options where set, else its defaults.
Shape shape_for(const Options& o, const std::string& preset);

// The median of `v`; NaN when empty.
double median(std::vector<double> v);

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// 6 * parameters + 12 * num_layers * seq_len * hidden_size (PaLM's formula).
int64_t flops_per_token(const ModelConfig& c);

}  // namespace agora::bench
