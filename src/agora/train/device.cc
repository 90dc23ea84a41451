#include "agora/train/device.h"

#include <ATen/autocast_mode.h>

#include "agora/core/error.h"

namespace agora {

torch::Device resolve_device(std::string_view name) {
  const bool cuda = torch::cuda::is_available();
  if (name == "auto") return cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda") {
    if (!cuda) {
      fail("train.device = \"cuda\" but no CUDA device is usable ({}); use \"cpu\" or \"auto\"",
           at::hasCUDA() ? "no GPU found" : "this libtorch was built without CUDA");
    }
    return torch::kCUDA;
  }
  fail("train.device = \"{}\" is invalid (allowed: auto, cpu, cuda)", name);
}

AutocastGuard::AutocastGuard(torch::Device device, bool enabled)
    : device_(device),
      // Nested inside an enabled guard (the trainer holds one over training and evaluation, the
      // step its own) this guard changes nothing and leaves the outer one's cache alone.
      enabled_(enabled &&
               !(device.is_cuda() ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled())) {
  if (!enabled_) return;
  if (device_.is_cuda()) {
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  } else {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (device_.is_cuda())
    at::autocast::set_enabled(false);
  else
    at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
}

}  // namespace agora
