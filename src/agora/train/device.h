// Where and in what precision a run computes: device choice and bf16 autocast.
#pragma once

#include <torch/torch.h>

#include <string_view>

namespace agora {

// "auto" (CUDA when this libtorch has it and a GPU is present, else CPU), "cpu" or "cuda".
// Throws Error for "cuda" without a usable GPU, naming what this build has.
torch::Device resolve_device(std::string_view name);

// While alive, eligible ops run in bfloat16 (torch autocast) on `device`; a no-op when disabled
// or when autocast is already on (an outer guard keeps it on past this one).
class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::Device device_;
  bool enabled_;
};

}  // namespace agora
