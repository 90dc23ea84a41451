// measure.h: bench_optimizer's options and agora's side of the measurement -- the model, the
// forward+backward of one optimizer step, DeMo's contribute() and apply() with P peers, and
// AdamW's step, each as the samples of its timed repeats.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "agora/model/llama.h"
#include "agora/optim/strategy.h"

namespace agora::bench {

// The learning rate and DeMo's constants, the same as reference_demo.py's.
constexpr double kLr = 1e-3, kBeta = 0.999, kWeightDecay = 0.1;

struct Options {
  std::string preset = "small";
  int64_t vocab = 8192;
  int64_t seq_len = 256;
  int64_t batch = 32;       // sequences per optimizer step
  int64_t micro_batch = 8;  // sequences per forward+backward
  int64_t topk = 32;
  int64_t chunk = 64;
  bool one_bit = false;
  bool single = false;  // only (topk, one_bit), not also Psyche's topk 4 one-bit
  std::string peers = "1,4,16,100,1000";
  int repeats = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t seed = 1234;
  std::string python = "/usr/bin/python3";
  std::string script = AGORA_DEMO_REFERENCE;
  bool skip_python = false;
  std::string json_path;
};

// One DeMo configuration of the run.
struct DemoConfig {
  int64_t topk = 32;
  int64_t chunk = 64;
  bool one_bit = false;
};

struct DemoSamples {
  size_t payload_bytes = 0;                      // this peer's contribution
  std::vector<double> contribute;                // seconds
  std::map<int64_t, std::vector<double>> apply;  // by peer count
  // The same with the payloads decoded beforehand (a network peer decodes each one it fetches
  // to check it, and apply() takes the result: DecoupledMomentum::decoded_payloads()).
  std::map<int64_t, std::vector<double>> apply_decoded;
};

double median(std::vector<double> v);
// Timed repeats of apply() with `peers` contributions: at most 3 above 100 peers, where one
// apply takes seconds.
int repeats_for(int repeats, int64_t peers);

// The model with random weights and tokens; its parameters hold real gradients once
// forward_backward() has run.
class AgoraBench {
 public:
  explicit AgoraBench(const Options& o);

  int64_t parameters() const { return parameters_; }
  const std::vector<NamedParameter>& named() const { return named_; }

  // The forward+backward of one optimizer step: batch / micro_batch micro-batches, gradients
  // accumulated (cleared before each step).
  std::vector<double> forward_backward();
  // contribute() of a fresh DecoupledMomentum on the gradients, then apply() with P contributions
  // for each P in `peers`: its own and P - 1 others made beforehand, untimed (up to 15 by other
  // DecoupledMomentum instances on random gradients, the rest drawn at random positions).
  // apply() moves the parameters; that does not matter for timing.
  DemoSamples demo(const DemoConfig& config, const std::vector<int64_t>& peers);
  // AdamWStrategy with one peer: contribute() (nothing) and apply() (torch's AdamW step).
  std::vector<double> adamw();

 private:
  Options options_;
  Llama model_{nullptr};
  std::vector<NamedParameter> named_;
  int64_t parameters_ = 0;
  torch::Tensor tokens_;  // [batch, seq_len + 1]
};

}  // namespace agora::bench
