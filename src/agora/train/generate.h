// Text generation from a trained model: sampling with a KV cache.
//
// The prompt is prefixed with the end-of-text token, since every training document starts with
// one. The prompt runs through the model once; each new token then costs one position of
// compute. Temperature 0 is greedy (argmax); otherwise logits are divided by the temperature,
// cut to the top k (0: no cut), and sampled from a generator seeded with `seed`, so the same
// seed gives the same text. Generation stops at `max_new_tokens` or at an end-of-text token.
// Padded vocabulary rows never get sampled.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"

namespace agora {

struct SampleOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 0;
};

// Returns the new tokens (without the prompt); `on_token` sees each as it is chosen.
std::vector<TokenId> generate(Llama& model, TokenId eot_id, std::span<const TokenId> prompt,
                              const SampleOptions& options,
                              const std::function<void(TokenId)>& on_token = {});

}  // namespace agora
