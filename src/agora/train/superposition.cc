#include "agora/train/superposition.h"

#include "agora/core/error.h"

namespace agora {

Bags split_bags(const torch::Tensor& windows, int64_t bag) {
  if (bag < 1) fail("superposition: bag = {} is invalid (allowed: an integer >= 1)", bag);
  if (windows.dim() != 2 || windows.size(1) % bag != 0 || windows.size(1) / bag < 2) {
    fail(
        "superposition: windows of shape {} cannot be cut into bags of {} (allowed: [batch, "
        "bag * (T + 1)] with T >= 1)",
        c10::str(windows.sizes()), bag);
  }
  const int64_t T = windows.size(1) / bag - 1;
  const torch::Tensor bags = windows.reshape({windows.size(0), T + 1, bag});
  return {bags.narrow(1, 0, T), bags.narrow(1, 1, T)};
}

torch::Tensor bag_embeddings(Llama& model, const torch::Tensor& bags) {
  return model->model->embed_tokens(bags).mean(2);
}

torch::Tensor bag_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t s = targets.size(-1);
  // One log_softmax for all s targets: they score the same logits.
  const torch::Tensor log_probs =
      torch::log_softmax(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), 1);
  const torch::Tensor flat = targets.reshape({-1, s});
  // s = 1 is cross_entropy's own decomposition, so ordinary training is reproduced bit for bit.
  if (s == 1) return torch::nn::functional::nll_loss(log_probs, flat.select(1, 0).contiguous());
  // Every one of the s cross-entropies averages the same number of positions, so their mean is
  // the mean of all N * s picked log-probabilities. One gather instead of s nll_losses: its
  // backward scatters into one [N, V] gradient rather than building s dense ones.
  return -log_probs.gather(1, flat).mean();
}

torch::Tensor superposition_loss(Llama& model, const torch::Tensor& windows, int64_t bag) {
  const Bags bags = split_bags(windows, bag);
  return bag_loss(model->forward_embeddings(bag_embeddings(model, bags.inputs)), bags.targets);
}

}  // namespace agora
