#include "agora/train/evaluate.h"

#include <algorithm>

#include "agora/core/error.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"

namespace agora {

EvalResult evaluate(Llama& model, const Sampler& windows, int64_t max_windows, int64_t batch) {
  const int64_t available = static_cast<int64_t>(windows.windows_per_epoch());
  const int64_t n = max_windows > 0 ? std::min(max_windows, available) : available;
  if (n == 0)
    fail("evaluation: the data holds no complete window of {} tokens", windows.window_tokens());
  const torch::Device device = model->parameters().front().device();
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t T = windows.seq_len();
  double total = 0;  // sum of per-token losses, in double so the order of batches barely matters
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t count = std::min(batch, n - first);
    const torch::Tensor tokens = read_windows(windows, first, count).to(device);
    const torch::Tensor loss = window_loss(model, tokens, windows.bag());
    total += loss.item<double>() * count * T;
  }
  model->train(was_training);
  return {total / double(n * T), n, n * T};
}

}  // namespace agora
