#include "agora/peer/test_hooks.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

namespace agora::peer {

const std::string& test_cheat() {
  static const std::string cheat = [] {
    const char* v = std::getenv("AGORA_TEST_CHEAT");
    return std::string(v == nullptr ? "" : v);
  }();
  return cheat;
}

bool false_verdicts() {
  static const bool on = [] {
    const char* v = std::getenv("AGORA_TEST_FALSE_VERDICTS");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

std::vector<SequenceRange> cheat_share(const std::vector<SequenceRange>& share) {
  if (test_cheat() == "half_batch") {
    uint64_t total = 0;
    for (const SequenceRange& r : share) total += r.count;
    uint64_t left = std::max<uint64_t>(1, total / 2);
    std::vector<SequenceRange> half;
    for (const SequenceRange& r : share) {
      if (left == 0) break;
      half.push_back({r.first, std::min(left, r.count)});
      left -= half.back().count;
    }
    return half;
  }
  if (test_cheat() == "other_data") {
    std::vector<SequenceRange> other;
    for (const SequenceRange& r : share) other.push_back({r.first + 7919, r.count});
    return other;
  }
  return share;
}

CheatPerturbation::CheatPerturbation(std::vector<torch::Tensor>& params) : params_(params) {
  if (test_cheat() != "perturbed") return;
  static auto generator = at::make_generator<at::CPUGeneratorImpl>(7919);
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : params_) {
    saved_.push_back(p.detach().clone());
    const double rms = p.detach().pow(2).mean().sqrt().item<double>();
    const torch::Tensor noise =
        torch::randn(p.sizes(), generator, p.options().device(torch::kCPU)).to(p.device());
    p.add_(noise * (0.05 * rms));
  }
}

CheatPerturbation::~CheatPerturbation() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < saved_.size(); ++i) params_[i].copy_(saved_[i]);
}

}  // namespace agora::peer
