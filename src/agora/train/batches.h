// Turning sampler windows into model inputs: [B, bag * (T + 1)] int64 token tensors (train/loss.h
// turns them into a loss).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "agora/data/sampler.h"

namespace agora {

// Windows for sequence ids first .. first + count - 1 (shuffled order).
torch::Tensor read_sequences(const Sampler& sampler, uint64_t first, int64_t count);

// Windows first .. first + count - 1 in file order (unshuffled: evaluation).
torch::Tensor read_windows(const Sampler& sampler, uint64_t first, int64_t count);

}  // namespace agora
