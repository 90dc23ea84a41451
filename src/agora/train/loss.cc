#include "agora/train/loss.h"

#include "agora/train/superposition.h"

namespace agora {

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

torch::Tensor window_loss(Llama& model, const torch::Tensor& windows, int64_t bag) {
  if (bag > 1) return superposition_loss(model, windows, bag);
  const int64_t T = windows.size(1) - 1;
  return next_token_loss(model->forward(windows.narrow(1, 0, T)), windows.narrow(1, 1, T));
}

}  // namespace agora
