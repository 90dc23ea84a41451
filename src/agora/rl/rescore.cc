#include "agora/rl/rescore.h"

#include <algorithm>

#include "agora/core/error.h"
#include "agora/rl/sampling.h"
#include "agora/rl/seeded_draw.h"

namespace agora {

std::vector<double> rescore_gaps(Llama& policy, TokenId eot_id,
                                 const std::vector<std::vector<TokenId>>& prompts,
                                 const std::vector<const Rollout*>& rollouts, double temperature,
                                 const std::vector<uint64_t>* seeds,
                                 std::vector<double>* draw_gaps) {
  if (rollouts.empty()) return {};
  const bool check_draws = seeds != nullptr && draw_gaps != nullptr;
  if (check_draws && seeds->size() != rollouts.size()) {
    fail("rescore: {} seeds for {} rollouts", seeds->size(), rollouts.size());
  }
  torch::NoGradGuard no_grad;
  std::vector<std::vector<TokenId>> completions;
  std::vector<std::vector<float>> claimed;
  for (const Rollout* r : rollouts) {
    completions.emplace_back(r->tokens.begin(), r->tokens.end());
    claimed.push_back(r->logprobs);
  }
  const bool was_training = policy->is_training();
  policy->eval();
  torch::Tensor distribution;
  const ScoredBatch scored = completion_logprobs(policy, eot_id, prompts, completions, temperature,
                                                 check_draws ? &distribution : nullptr);
  policy->train(was_training);
  if (check_draws) {
    // Each completion token's interval [low, high) of the cumulative distribution, in float64 as
    // the sampler cumulates.
    draw_gaps->assign(rollouts.size(), 0.0);
    for (size_t i = 0; i < rollouts.size(); ++i) {
      const auto n = static_cast<int64_t>(completions[i].size());
      const auto start = static_cast<int64_t>(prompts[i].size());
      const torch::Tensor p = distribution[static_cast<int64_t>(i)]
                                  .narrow(0, start, n)
                                  .to(torch::kCPU)
                                  .exp()
                                  .to(torch::kFloat64);
      const torch::Tensor ids =
          torch::tensor(std::vector<int64_t>(completions[i].begin(), completions[i].end()),
                        torch::kInt64)
              .unsqueeze(1);
      const torch::Tensor high = p.cumsum(1).gather(1, ids).squeeze(1).contiguous();
      const torch::Tensor low = (high - p.gather(1, ids).squeeze(1)).contiguous();
      const auto h = high.accessor<double, 1>();
      const auto l = low.accessor<double, 1>();
      double worst = 0;
      for (int64_t t = 0; t < n; ++t) {
        const double u = slot_uniform((*seeds)[i], static_cast<uint32_t>(t));
        worst = std::max(worst, draw_gap(u, l[t], h[t]));
      }
      (*draw_gaps)[i] = worst;
    }
  }
  const torch::Tensor claims = completion_layout(prompts, claimed, scored.logp.size(1));
  const torch::Tensor gaps =
      ((scored.logp.to(torch::kCPU) - claims).abs() * scored.mask.to(torch::kCPU)).amax(1);
  std::vector<double> out(rollouts.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = gaps[static_cast<int64_t>(i)].item<double>();
  return out;
}

}  // namespace agora
