// How well a policy solves a task's held-out problems: the figure RL is judged by.
//
// The first `problems` held-out problems of the task (in id order, so every evaluation of a run,
// and of its base model, sees the same ones), each answered once greedily, scored by the task's
// checker. Greedy decoding makes the figure a property of the weights alone.
#pragma once

#include <cstdint>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"
#include "agora/rl/task.h"

namespace agora {

struct HeldOutScore {
  int64_t problems = 0;
  int64_t correct = 0;
  double accuracy() const { return problems ? static_cast<double>(correct) / problems : 0.0; }
};

HeldOutScore score_held_out(Llama& model, const Tokenizer& tokenizer, const Task& task,
                            int64_t problems, int64_t max_new_tokens);

// The text of a completion's tokens without the end-of-text token that may close it.
std::string completion_text(const Tokenizer& tokenizer, std::span<const TokenId> tokens);

}  // namespace agora
