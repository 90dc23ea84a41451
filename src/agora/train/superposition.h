// Token Superposition Training (docs/algorithms.md section 4): what a bag of tokens is to the
// model.
//
// A sampler built with bag = s (data/sampler.h) gives windows of T + 1 bags of s consecutive
// tokens, [B, s * (T + 1)]. Bag j is tokens [j * s, (j + 1) * s). The inputs are bags 0 .. T - 1,
// the targets bags 1 .. T. The example of docs/algorithms.md section 4, s = 2 and T = 2:
//   tokens 10 11 12 13 14 15  ->  inputs [10 11] [12 13], targets [12 13] [14 15].
//
// Position j enters the model as the mean of its bag's s token embeddings, so the model still
// processes T positions and a step costs the same FLOPs whatever s is; only the embedding mean
// and the loss's gathers grow with s. Position j's logits are scored against every token of bag
// j + 1: the loss is the mean of s ordinary cross-entropies of the same logits, so a token that
// appears twice in a bag counts twice.
//
// With s = 1 every function here is ordinary next-token training, operation for operation: the
// mean of one embedding is that embedding, and the loss is cross_entropy's own decomposition
// (log_softmax, then nll_loss). superposition_test.cc checks both bit for bit.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "agora/model/llama.h"

namespace agora {

struct Bags {
  torch::Tensor inputs;   // [B, T, s] int64: bags 0 .. T - 1
  torch::Tensor targets;  // [B, T, s] int64: bags 1 .. T
};

// Cuts windows [B, s * (T + 1)] into input and target bags. Throws Error when bag < 1 or the
// window length is not a multiple of bag with at least two bags.
Bags split_bags(const torch::Tensor& windows, int64_t bag);

// [B, T, s] token ids -> [B, T, hidden_size]: the mean of each bag's embeddings.
torch::Tensor bag_embeddings(Llama& model, const torch::Tensor& bags);

// logits [B, T, V], targets [B, T, s] -> the mean over k < s of the mean next-token
// cross-entropy of the logits against targets[..., k]. Computed in float32.
torch::Tensor bag_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// The training loss of a batch of sampler windows read with bag = s: split_bags, the model on
// bag_embeddings, bag_loss.
torch::Tensor superposition_loss(Llama& model, const torch::Tensor& windows, int64_t bag);

}  // namespace agora
