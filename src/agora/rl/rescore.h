// Re-scoring rollouts: does each one's claimed log-probabilities match its claimed policy?
//
// A worker claims, per token, the log-probability it sampled the token with (sampling.h). The
// learner recomputes them with one forward pass of the claimed policy version over the prompt
// and the completion, and compares. Sampling and re-scoring compute the same function, so on one
// machine they agree to about 1e-6; the tolerance allows for other hardware or kernels. A worker
// that sampled from another model, or wrote the tokens itself (an answer it was not given by
// the policy, with invented probabilities), disagrees by far more on most tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "agora/data/tokenizer.h"
#include "agora/model/llama.h"
#include "agora/rl/rollout.h"

namespace agora {

// The largest |claimed - recomputed| over each rollout's tokens, under `policy` at `temperature`.
// prompts[i] is rollouts[i]'s prompt tokens.
//
// With `seeds` (one per rollout) and `draw_gaps`, the same forward pass also checks that every
// token was drawn by its slot's uniform numbers (seeded_draw.h): draw_gaps[i] receives the
// largest distance, over rollout i's tokens, from u_t to the token's interval of the policy's
// cumulative distribution (0 when every token is the one the seed draws). Same hardware agrees
// to about 1e-7; a chosen token is off by about its neighbours' probability.
std::vector<double> rescore_gaps(Llama& policy, TokenId eot_id,
                                 const std::vector<std::vector<TokenId>>& prompts,
                                 const std::vector<const Rollout*>& rollouts, double temperature,
                                 const std::vector<uint64_t>* seeds = nullptr,
                                 std::vector<double>* draw_gaps = nullptr);

}  // namespace agora
