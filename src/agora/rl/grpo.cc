#include "agora/rl/grpo.h"

#include <cmath>

#include "agora/core/error.h"

namespace agora {

std::vector<double> group_advantages(std::span<const double> rewards, const GrpoOptions& options) {
  if (rewards.empty()) fail("a GRPO group needs at least one completion (got 0)");
  const double n = static_cast<double>(rewards.size());
  double mean = 0;
  for (double r : rewards) mean += r;
  mean /= n;
  double squares = 0;
  for (double r : rewards) squares += (r - mean) * (r - mean);
  // A group of one has no spread: its advantage is 0, as for a group of equal rewards.
  const double std = rewards.size() > 1 ? std::sqrt(squares / (n - 1)) : 0.0;
  std::vector<double> advantages;
  advantages.reserve(rewards.size());
  for (double r : rewards) advantages.push_back((r - mean) / (std + options.advantage_eps));
  return advantages;
}

GrpoLoss grpo_loss(const torch::Tensor& logp, const torch::Tensor& logp_old,
                   const torch::Tensor& advantages, const torch::Tensor& mask,
                   const GrpoOptions& options) {
  if (logp.dim() != 2 || logp.sizes() != logp_old.sizes() || logp.sizes() != mask.sizes() ||
      advantages.dim() != 1 || advantages.size(0) != logp.size(0)) {
    fail("grpo_loss: logp {}, logp_old {} and mask {} must be [N, T] alike and advantages {} [N]",
         c10::str(logp.sizes()), c10::str(logp_old.sizes()), c10::str(mask.sizes()),
         c10::str(advantages.sizes()));
  }
  const torch::Tensor m = mask.to(torch::kFloat32);
  const double tokens = m.sum().item<double>();
  if (tokens == 0) fail("grpo_loss: the mask selects no completion token");

  const torch::Tensor a = advantages.to(torch::kFloat32).unsqueeze(1).expand_as(logp);
  const torch::Tensor ratio = torch::exp(logp.to(torch::kFloat32) - logp_old.to(torch::kFloat32));
  torch::Tensor capped = ratio;
  torch::Tensor over_cap = torch::zeros_like(m);
  if (options.ratio_cap > 0) {
    over_cap = ((a < 0) & (ratio > options.ratio_cap)).to(torch::kFloat32);
    capped = torch::where(a < 0, torch::clamp_max(ratio, options.ratio_cap), ratio);
  }
  const torch::Tensor clipped = torch::clamp(ratio, 1.0 - options.eps_low, 1.0 + options.eps_high);
  const torch::Tensor term = torch::min(capped * a, clipped * a);
  GrpoLoss out;
  out.loss = -(term * m).sum() / tokens;

  torch::NoGradGuard no_grad;
  const torch::Tensor outside =
      ((ratio < 1.0 - options.eps_low) | (ratio > 1.0 + options.eps_high)).to(torch::kFloat32);
  out.clipped_fraction = (outside * m).sum().item<double>() / tokens;
  out.capped_fraction = (over_cap * m).sum().item<double>() / tokens;
  out.mean_ratio = (ratio * m).sum().item<double>() / tokens;
  return out;
}

}  // namespace agora
