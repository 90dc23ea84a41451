// GRPO's loss for verifiable rewards (docs/rl.md, docs/algorithms.md section 11).
//
// For each prompt a group of G completions is sampled and scored. Each completion's advantage is
// its reward against its group's (DeepSeekMath, Shao et al. 2024, section 4.1.2):
//
//   A_i = (r_i - mean(r)) / (std(r) + eps)          std with Bessel's correction, as TRL's
//
// so a group that all failed or all succeeded teaches nothing (every A_i = 0). Per completion
// token, with the ratio between the policy being trained and the one that sampled the token,
//
//   ratio = exp(logp - logp_old)
//   term  = min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)      PPO's clipped surrogate
//
// with DAPO's asymmetric clip (eps_low 0.2, eps_high 0.28: Yu et al. 2025, "clip-higher"). For
// A < 0 the ratio is first capped at `ratio_cap` (4), INTELLECT-2's two-sided clipping (Prime
// Intellect 2025): without it a token whose probability grew a lot since sampling gets an
// unbounded negative term. The loss is -term averaged over every completion token of the batch
// (DAPO's token-level mean, so long completions weigh by their length). No KL term.
#pragma once

#include <torch/torch.h>

#include <span>
#include <vector>

namespace agora {

struct GrpoOptions {
  double eps_low = 0.2;
  double eps_high = 0.28;
  double ratio_cap = 4.0;       // for negative advantages; 0 turns the cap off
  double advantage_eps = 1e-6;  // in the advantage's denominator
};

// The advantages of one group's rewards. Error for an empty group.
std::vector<double> group_advantages(std::span<const double> rewards, const GrpoOptions& options);

struct GrpoLoss {
  torch::Tensor loss;           // scalar, differentiable through `logp`
  double clipped_fraction = 0;  // of completion tokens whose ratio left the clip range
  double capped_fraction = 0;   // of completion tokens with A < 0 and ratio above the cap
  double mean_ratio = 0;        // over completion tokens
  bool skipped = false;         // grpo_update took no step: the loss or a gradient was not finite
};

// logp, logp_old, mask: [N, T] (mask 1 on completion tokens, 0 on prompt and padding);
// advantages: [N]. Error when the shapes disagree or the mask selects no token.
GrpoLoss grpo_loss(const torch::Tensor& logp, const torch::Tensor& logp_old,
                   const torch::Tensor& advantages, const torch::Tensor& mask,
                   const GrpoOptions& options);

}  // namespace agora
