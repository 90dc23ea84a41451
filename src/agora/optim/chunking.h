// Chunking: how DeMo cuts a tensor into the blocks its DCT and top-k run over
// (docs/algorithms.md section 1.3, "Chunked DCT").
//
// For a dimension of size n and a target chunk c, the chunk is the largest divisor of n that is
// <= c (n itself when n <= c). A 1-D tensor [N] is cut into rows of chunk(N); a tensor [..., M, N]
// into blocks of chunk(M) x chunk(N) over its last two dimensions, the leading dimensions being a
// batch. A dimension with few divisors (a prime vocabulary size) gets tiny chunks, and top-k of a
// tiny chunk is a dense payload: compression_warning() says so, naming the tensor.
//
// Torch-free: the payload codec, the config checks and the network use it without libtorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agora/optim/payload.h"

namespace agora {

// The largest divisor of n that is <= chunk; n when n <= chunk. Requires n >= 1, chunk >= 1.
int64_t chunk_size_for(int64_t n, int64_t chunk);

struct ChunkGeometry {
  int64_t rows = 1;  // 1 for a 1-D tensor
  int64_t cols = 1;
  int64_t topk = 1;  // min(requested top-k, rows * cols)
  int64_t size() const { return rows * cols; }
};

// The geometry of `shape` (1 to 8 dimensions, each >= 1) for a target chunk and top-k.
ChunkGeometry chunk_geometry(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk);

// The payload layout DeMo uses for a tensor: dct_topk with the geometry above, values one-bit or
// of `value_type`.
TensorLayout demo_tensor_layout(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk,
                                bool one_bit, ValueType value_type = ValueType::kF32);

// Transmitted coefficients per parameter: topk / chunk size.
double transmitted_density(const std::vector<int64_t>& shape, int64_t chunk, int64_t topk);

// A warning when a dimension of `shape` gets a chunk under half of min(dimension, chunk), so the
// tensor is sent far denser than the target: "tensor model.embed_tokens.weight [50257, 768]: the
// dimension 50257 has no divisor between 33 and 64, so its chunks are 29 x 64 and 0.22% of its
// coefficients travel each step instead of 0.78% ... (pad it to a multiple of 64)".
std::optional<std::string> compression_warning(std::string_view name,
                                               const std::vector<int64_t>& shape, int64_t chunk,
                                               int64_t topk);

}  // namespace agora
