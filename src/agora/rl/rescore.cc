#include "agora/rl/rescore.h"

#include "agora/rl/sampling.h"

namespace agora {

std::vector<double> rescore_gaps(Llama& policy, TokenId eot_id,
                                 const std::vector<std::vector<TokenId>>& prompts,
                                 const std::vector<const Rollout*>& rollouts, double temperature) {
  if (rollouts.empty()) return {};
  torch::NoGradGuard no_grad;
  std::vector<std::vector<TokenId>> completions;
  std::vector<std::vector<float>> claimed;
  for (const Rollout* r : rollouts) {
    completions.emplace_back(r->tokens.begin(), r->tokens.end());
    claimed.push_back(r->logprobs);
  }
  const bool was_training = policy->is_training();
  policy->eval();
  const ScoredBatch scored = completion_logprobs(policy, eot_id, prompts, completions, temperature);
  policy->train(was_training);
  const torch::Tensor claims = completion_layout(prompts, claimed, scored.logp.size(1));
  const torch::Tensor gaps =
      ((scored.logp.to(torch::kCPU) - claims).abs() * scored.mask.to(torch::kCPU)).amax(1);
  std::vector<double> out(rollouts.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = gaps[static_cast<int64_t>(i)].item<double>();
  return out;
}

}  // namespace agora
