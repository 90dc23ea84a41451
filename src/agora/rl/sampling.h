// Sampling completions for RL, and scoring completions under a policy.
//
// sample_completions() draws a group of completions of one prompt in one batch (the rows share
// the prompt, so no padding is needed) with the KV cache, and records for every token the
// log-probability it was sampled with. The distribution is softmax(logits / temperature) over
// the real vocabulary, with no top-k cut: the recorded log-probability is then exactly what
// completion_logprobs() recomputes for the same policy, which the learner needs for GRPO's ratio
// and for re-scoring a worker's claims. Temperature 0 is greedy (log-probabilities under the
// untempered softmax). A completion ends with the end-of-text token (kept, so stopping is
// learned) or at max_new_tokens (then `ended` is false). The same seed gives the same samples.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"

namespace agora {

struct Completion {
  std::vector<TokenId> tokens;  // the end-of-text token last when `ended`
  std::vector<float> logprobs;  // one per token
  bool ended = false;
};

struct CompletionSampling {
  int64_t count = 8;
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  uint64_t seed = 0;
  // When set, one per completion: row i's tokens are drawn by inverse transform sampling with
  // slot_uniform(row_seeds[i], position) (seeded_draw.h), so the learner can check each token
  // was drawn, not chosen; `seed` is then unused.
  std::vector<uint64_t> row_seeds;
};

// The context the model sees for `prompt`: end-of-text first, as every training document starts.
std::vector<TokenId> rl_context(TokenId eot_id, std::span<const TokenId> prompt);

// Errors: count < 1, max_new_tokens < 1, temperature < 0, or a context past the model's length.
std::vector<Completion> sample_completions(Llama& model, TokenId eot_id,
                                           std::span<const TokenId> prompt,
                                           const CompletionSampling& options);

// A batch of (prompt, completion) rows, right-padded, as the learner scores them.
struct ScoredBatch {
  torch::Tensor logp;  // [N, L - 1] log-probability of token t + 1 given tokens 0..t
  torch::Tensor mask;  // [N, L - 1] 1 where token t + 1 belongs to the completion
};

// Log-probabilities (differentiable when grad mode is on) of each completion's tokens after its
// prompt, under softmax(logits / temperature) (temperature 0 scores as 1). prompts[i] pairs with
// completions[i]. Error when the lengths differ or a row is longer than the model's context.
// `distribution`, when given, receives the whole tempered log-distribution, [N, L - 1, vocab].
ScoredBatch completion_logprobs(Llama& model, TokenId eot_id,
                                const std::vector<std::vector<TokenId>>& prompts,
                                const std::vector<std::vector<TokenId>>& completions,
                                double temperature, torch::Tensor* distribution = nullptr);

// The log-probability of each of `completion`'s tokens after `prompt` under `model`: what an
// honest worker would claim for those tokens, had it sampled them.
std::vector<float> teacher_forced_logprobs(Llama& model, TokenId eot_id,
                                           const std::vector<TokenId>& prompt,
                                           const std::vector<TokenId>& completion,
                                           double temperature);

// `values` (one vector per row) placed in the layout of completion_logprobs' [N, L - 1] tensors.
torch::Tensor completion_layout(const std::vector<std::vector<TokenId>>& prompts,
                                const std::vector<std::vector<float>>& values, int64_t width);

}  // namespace agora
