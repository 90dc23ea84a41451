// The losses a step trains on and evaluation reports, over batches of sampler windows.
//
// A window of a sampler with bag s is s * (T + 1) tokens (data/sampler.h). With s = 1 the loss is
// ordinary next-token cross-entropy: inputs are the first T tokens, targets the last T. With
// s > 1 it is Token Superposition Training's loss (train/superposition.h). For s = 1 both paths
// are the same operations, so choosing by s never changes a number.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "agora/model/llama.h"

namespace agora {

// Mean next-token cross-entropy of `logits` [B, T, V] against `targets` [B, T], in float32.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// The mean loss of `windows` [B, bag * (T + 1)] read from a sampler with this bag.
torch::Tensor window_loss(Llama& model, const torch::Tensor& windows, int64_t bag);

}  // namespace agora
