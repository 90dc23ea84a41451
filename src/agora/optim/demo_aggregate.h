// DeMo's step 6 (docs/algorithms.md section 1.6) straight from decoded payloads: per DCT
// coefficient, the mean of the values of the payloads that selected it, 0 where none did.
//
// All of a tensor's selections, from every payload, go into one buffer in plain loops over the
// decoded positions and values; nothing is densified per payload (a payload holds topk / chunk
// of the coefficients, 0.8% at top-k 32 of 64 x 64, so a dense tensor per payload was mostly
// zeros to write and add), and the caller runs one inverse transform per tensor.
//
// Determinism: the work is split by chunks, never inside a coefficient. Each coefficient's sum is
// formed by one thread, in float32, adding the payloads' values in the order given (the canonical
// one), and divided once by its count: the same bits whatever the thread count, and the same as
// scatter-adding one payload after another into zeros and dividing by max(count, 1), which is
// what DeMo did before (tests/train/demo_apply_test.cc checks both).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "agora/optim/payload.h"

namespace agora {

// Every payload's entry `tensor` must be dct_topk with `layout` (decode_payload against the
// strategy's layout guarantees it). Results are float32 on the CPU.

// The dense aggregate: [num_chunks, chunk_size], chunk c's coefficient x the mean over the
// payloads that selected x in c.
torch::Tensor mean_coefficients(const std::vector<Payload>& payloads, size_t tensor,
                                const TensorLayout& layout);

// The same mean as one weight per selection, for dct.h's sparse_chunked_idct: positions (int64)
// and weights, both [num_chunks, P * topk]; chunk c's row holds payload 0's selections, then
// payload 1's, and so on, each value divided by how many payloads selected its position in c.
struct WeightedSelections {
  torch::Tensor positions;
  torch::Tensor weights;
};
WeightedSelections weighted_selections(const std::vector<Payload>& payloads, size_t tensor,
                                       const TensorLayout& layout);

}  // namespace agora
