#include "agora/optim/demo_aggregate.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "agora/core/error.h"

namespace agora {
namespace {

// Raw views of entry `tensor` of every payload, in the order given.
struct Entries {
  std::vector<const uint32_t*> positions;
  std::vector<const float*> values;
  int64_t chunks = 0, topk = 0, size = 0;
};

Entries entries_of(const std::vector<Payload>& payloads, size_t tensor,
                   const TensorLayout& layout) {
  Entries out;
  out.chunks = layout.num_chunks();
  out.topk = layout.topk;
  out.size = layout.chunk_size();
  const auto count = static_cast<size_t>(out.chunks * out.topk);
  for (const Payload& payload : payloads) {
    const TensorPayload& entry = payload.tensors.at(tensor);
    if (entry.positions.size() != count || entry.values.size() != count) {
      fail(
          "DeMo aggregation: tensor {} of a payload has {} positions and {} values (allowed: {} "
          "of each, its layout's chunks x topk)",
          tensor, entry.positions.size(), entry.values.size(), count);
    }
    out.positions.push_back(entry.positions.data());
    out.values.push_back(entry.values.data());
  }
  return out;
}

// Chunks per parallel task: about 64K element operations each, so small tensors stay on one
// thread. The split changes which thread forms a coefficient, never how.
int64_t grain(int64_t work_per_chunk) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, work_per_chunk));
}

}  // namespace

torch::Tensor mean_coefficients(const std::vector<Payload>& payloads, size_t tensor,
                                const TensorLayout& layout) {
  const Entries e = entries_of(payloads, tensor, layout);
  const auto P = static_cast<int64_t>(payloads.size());
  torch::Tensor out = torch::empty({e.chunks, e.size}, torch::kFloat32);
  float* sums = out.data_ptr<float>();
  at::parallel_for(0, e.chunks, grain(e.size + P * e.topk), [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> selected_by(static_cast<size_t>(e.size));
    for (int64_t c = begin; c < end; ++c) {
      float* row = sums + c * e.size;
      std::fill(row, row + e.size, 0.0f);
      std::fill(selected_by.begin(), selected_by.end(), 0u);
      for (int64_t j = 0; j < P; ++j) {
        const uint32_t* position = e.positions[j] + c * e.topk;
        const float* value = e.values[j] + c * e.topk;
        for (int64_t i = 0; i < e.topk; ++i) {
          row[position[i]] += value[i];
          ++selected_by[position[i]];
        }
      }
      // x / 1 == x exactly, so only coefficients two or more payloads selected need dividing.
      for (int64_t x = 0; x < e.size; ++x) {
        if (selected_by[x] > 1) row[x] /= static_cast<float>(selected_by[x]);
      }
    }
  });
  return out;
}

WeightedSelections weighted_selections(const std::vector<Payload>& payloads, size_t tensor,
                                       const TensorLayout& layout) {
  const Entries e = entries_of(payloads, tensor, layout);
  const auto P = static_cast<int64_t>(payloads.size());
  const int64_t width = P * e.topk;
  WeightedSelections out{torch::empty({e.chunks, width}, torch::kInt64),
                         torch::empty({e.chunks, width}, torch::kFloat32)};
  int64_t* positions = out.positions.data_ptr<int64_t>();
  float* weights = out.weights.data_ptr<float>();
  at::parallel_for(0, e.chunks, grain(2 * width), [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> selected_by(static_cast<size_t>(e.size), 0u);
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t j = 0; j < P; ++j) {
        const uint32_t* position = e.positions[j] + c * e.topk;
        for (int64_t i = 0; i < e.topk; ++i) ++selected_by[position[i]];
      }
      int64_t* position_out = positions + c * width;
      float* weight_out = weights + c * width;
      for (int64_t j = 0; j < P; ++j) {
        const uint32_t* position = e.positions[j] + c * e.topk;
        const float* value = e.values[j] + c * e.topk;
        for (int64_t i = 0; i < e.topk; ++i) {
          *position_out++ = position[i];
          *weight_out++ = value[i] / static_cast<float>(selected_by[position[i]]);
        }
      }
      // Back to zeros by the positions just counted: cheaper than clearing the whole chunk.
      for (int64_t j = 0; j < P; ++j) {
        const uint32_t* position = e.positions[j] + c * e.topk;
        for (int64_t i = 0; i < e.topk; ++i) selected_by[position[i]] = 0;
      }
    }
  });
  return out;
}

}  // namespace agora
