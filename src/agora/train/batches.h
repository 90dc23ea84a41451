// Turning sampler windows into model inputs: [B, T + 1] int64 token tensors, split into the
// inputs (the first T) and the targets (the last T, shifted by one).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "agora/data/sampler.h"

namespace agora {

// Windows for sequence ids first .. first + count - 1 (shuffled order).
torch::Tensor read_sequences(const Sampler& sampler, uint64_t first, int64_t count);

// Windows first .. first + count - 1 in file order (unshuffled: evaluation).
torch::Tensor read_windows(const Sampler& sampler, uint64_t first, int64_t count);

// Mean next-token cross-entropy of `logits` [B, T, V] against `targets` [B, T].
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace agora
