#include "agora/train/batches.h"

#include <vector>

namespace agora {
namespace {

template <typename ReadOne>
torch::Tensor read_batch(const Sampler& sampler, int64_t count, ReadOne read_one) {
  const int64_t width = sampler.window_tokens();
  std::vector<TokenId> buffer(static_cast<size_t>(width));
  torch::Tensor out = torch::empty({count, width}, torch::kInt64);
  int64_t* data = out.data_ptr<int64_t>();
  for (int64_t row = 0; row < count; ++row) {
    read_one(row, buffer.data());
    for (int64_t i = 0; i < width; ++i) data[row * width + i] = buffer[static_cast<size_t>(i)];
  }
  return out;
}

}  // namespace

torch::Tensor read_sequences(const Sampler& sampler, uint64_t first, int64_t count) {
  return read_batch(sampler, count,
                    [&](int64_t row, TokenId* out) { sampler.read(first + row, out); });
}

torch::Tensor read_windows(const Sampler& sampler, uint64_t first, int64_t count) {
  return read_batch(sampler, count, [&](int64_t row, TokenId* out) {
    const Sampler::Window w = sampler.window_at(first + row);
    sampler.shard(w.shard).copy(w.first_token, sampler.window_tokens(), out);
  });
}

}  // namespace agora
