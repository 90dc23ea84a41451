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
  torch::Tensor total;
  for (int64_t k = 0; k < s; ++k) {
    const torch::Tensor ce =
        torch::nn::functional::nll_loss(log_probs, flat.select(1, k).contiguous());
    total = k == 0 ? ce : total + ce;
  }
  return total / static_cast<double>(s);
}

torch::Tensor superposition_loss(Llama& model, const torch::Tensor& windows, int64_t bag) {
  const Bags bags = split_bags(windows, bag);
  return bag_loss(model->forward_embeddings(bag_embeddings(model, bags.inputs)), bags.targets);
}

}  // namespace agora
