#include "agora/optim/chunking.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "agora/core/error.h"

namespace agora {

int64_t chunk_size_for(int64_t n, int64_t chunk) {
  if (n < 1 || chunk < 1) fail("chunk_size_for: n = {} and chunk = {} must be >= 1", n, chunk);
  if (n <= chunk) return n;
  for (int64_t d = chunk; d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

ChunkGeometry chunk_geometry(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk) {
  if (shape.empty() || shape.size() > 8) {
    fail("DeMo: a tensor of {} dimensions is not supported (allowed: 1 to 8)", shape.size());
  }
  if (topk < 1) fail("DeMo: topk = {} is invalid (allowed: an integer >= 1)", topk);
  for (int64_t d : shape) {
    if (d < 1) fail("DeMo: shape [{}] has an empty dimension", fmt::join(shape, ", "));
  }
  ChunkGeometry g;
  g.cols = chunk_size_for(shape.back(), chunk);
  if (shape.size() >= 2) g.rows = chunk_size_for(shape[shape.size() - 2], chunk);
  g.topk = std::min(topk, g.size());
  return g;
}

TensorLayout demo_tensor_layout(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk,
                                bool one_bit, ValueType value_type) {
  const ChunkGeometry g = chunk_geometry(shape, chunk, topk);
  TensorLayout layout;
  layout.shape = shape;
  layout.encoding = TensorEncoding::kDctTopK;
  layout.value_type = one_bit ? ValueType::kOneBit : value_type;
  layout.chunk_rows = g.rows;
  layout.chunk_cols = g.cols;
  layout.topk = g.topk;
  return layout;
}

double transmitted_density(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk) {
  const ChunkGeometry g = chunk_geometry(shape, chunk, topk);
  return static_cast<double>(g.topk) / static_cast<double>(g.size());
}

std::optional<std::string> compression_warning(std::string_view name,
                                               const std::vector<int64_t>& shape, int64_t chunk,
                                               int64_t topk) {
  const ChunkGeometry g = chunk_geometry(shape, chunk, topk);
  const size_t first = shape.size() >= 2 ? shape.size() - 2 : 0;
  for (size_t i = first; i < shape.size(); ++i) {
    const int64_t n = shape[i];
    const int64_t got = i + 1 == shape.size() ? g.cols : g.rows;
    const int64_t want = std::min(n, chunk);
    if (2 * got >= want) continue;
    // What the tensor would send with full-size chunks, against what it sends.
    const int64_t ideal_size =
        (shape.size() >= 2 ? std::min(shape[first], chunk) : 1) * std::min(shape.back(), chunk);
    const double ideal = static_cast<double>(std::min(topk, ideal_size)) / ideal_size;
    return fmt::format(
        "tensor {} [{}]: the dimension {} has no divisor between {} and {}, so its chunks are {} "
        "x {} and {:.2f}% of its coefficients travel each step instead of {:.2f}%; pad that "
        "dimension to a multiple of {} to compress it fully",
        name, fmt::join(shape, ", "), n, want / 2 + 1, want, g.rows, g.cols,
        100.0 * g.topk / g.size(), 100.0 * ideal, chunk);
  }
  return std::nullopt;
}

}  // namespace agora
