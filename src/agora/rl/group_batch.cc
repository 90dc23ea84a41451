#include "agora/rl/group_batch.h"

#include <algorithm>
#include <cmath>

#include "agora/rl/held_out.h"
#include "agora/rl/sampling.h"
#include "agora/rl/sapo_draw.h"

namespace agora {

std::vector<double> add_group(GroupBatch& batch, const Task& task, const Tokenizer& tokenizer,
                              const Problem& problem, const std::vector<TokenId>& prompt,
                              std::vector<Sample> group, const GrpoOptions& grpo) {
  std::vector<double> rewards;
  for (const Sample& c : group) {
    rewards.push_back(task.reward(problem, completion_text(tokenizer, c.tokens)));
  }
  if (group.size() < 2) return rewards;
  double sum = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    sum += rewards[i];
    batch.tokens += static_cast<double>(group[i].tokens.size());
  }
  batch.reward_sum += sum;
  batch.rewards.push_back(sum / static_cast<double>(group.size()));
  if (rewards_differ(rewards)) ++batch.informative;
  const std::vector<double> a = group_advantages(rewards, grpo);
  for (size_t i = 0; i < group.size(); ++i) {
    batch.prompts.push_back(prompt);
    batch.completions.push_back(std::move(group[i].tokens));
    batch.old_logprobs.push_back(std::move(group[i].logprobs));
    batch.advantages.push_back(static_cast<float>(a[i]));
  }
  return rewards;
}

GrpoLoss grpo_update(Llama& model, torch::optim::Optimizer& optimizer, TokenId eot_id,
                     const GroupBatch& batch, double temperature, double grad_clip,
                     const GrpoOptions& grpo) {
  GrpoLoss loss;
  if (batch.completions.empty()) return loss;
  const ScoredBatch scored =
      completion_logprobs(model, eot_id, batch.prompts, batch.completions, temperature);
  torch::Tensor old = completion_layout(batch.prompts, batch.old_logprobs, scored.logp.size(1))
                          .to(scored.logp.device());
  // Rows sampled elsewhere (no log-probabilities recorded) are scored on-policy.
  std::vector<float> recorded;
  for (const auto& l : batch.old_logprobs) recorded.push_back(l.empty() ? 0.0f : 1.0f);
  const torch::Tensor has = torch::tensor(recorded).to(old.device()).unsqueeze(1);
  old = old * has + scored.logp.detach() * (1 - has);
  loss = grpo_loss(scored.logp, old, torch::tensor(batch.advantages).to(scored.logp.device()),
                   scored.mask, grpo);
  optimizer.zero_grad();
  loss.loss.backward();
  // A non-finite loss or gradient would write NaN into every parameter (and every worker's
  // policy with it): the update is skipped instead.
  double norm_sq = 0;
  for (const auto& p : model->parameters()) {
    if (p.grad().defined()) norm_sq += p.grad().pow(2).sum().item<double>();
  }
  if (!std::isfinite(loss.loss.item<double>()) || !std::isfinite(norm_sq)) {
    optimizer.zero_grad();
    loss.skipped = true;
    return loss;
  }
  if (grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), grad_clip);
  optimizer.step();
  return loss;
}

}  // namespace agora
