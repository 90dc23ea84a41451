#include "agora/rl/held_out.h"

#include "agora/rl/sampling.h"

namespace agora {

std::string completion_text(const Tokenizer& tokenizer, std::span<const TokenId> tokens) {
  if (!tokens.empty() && tokens.back() == tokenizer.eot_id())
    tokens = tokens.first(tokens.size() - 1);
  return tokenizer.decode(tokens);
}

HeldOutScore score_held_out(Llama& model, const Tokenizer& tokenizer, const Task& task,
                            int64_t problems, int64_t max_new_tokens) {
  HeldOutScore score;
  uint64_t id = 0;
  CompletionSampling greedy;
  greedy.count = 1;
  greedy.max_new_tokens = max_new_tokens;
  greedy.temperature = 0;
  for (int64_t i = 0; i < problems; ++i) {
    const Problem problem = task.next(id, /*want_held_out=*/true);
    const std::vector<TokenId> prompt = tokenizer.encode(problem.prompt);
    const Completion c = sample_completions(model, tokenizer.eot_id(), prompt, greedy).front();
    score.correct += task.reward(problem, completion_text(tokenizer, c.tokens)) > 0.5 ? 1 : 0;
    ++score.problems;
  }
  return score;
}

}  // namespace agora
