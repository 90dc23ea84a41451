// The chunked orthonormal DCT-II that DeMo compresses momentum with (docs/algorithms.md
// section 1.3).
//
// With C[k, j] = a_k cos(pi (2j + 1) k / (2n)), a_0 = sqrt(1/n), a_k = sqrt(2/n):
//   1-D [N], chunk n:            each row of the [N/n, n] view becomes C x;
//   [..., M, N], chunk m x n:    each m x n block B of the last two dimensions becomes
//                                C_m B C_n^T (leading dimensions are a batch).
// Coefficients come out as [num_chunks, m * n]: chunks in row-major block order, each chunk's
// coefficients row-major (position = row * n + column), which is the order payload positions
// use. The inverse is the transpose, and chunked_idct(chunked_dct(x)) == x up to rounding.
//
// Both run as a few large matrix products on the tensor's device, in float32 (the basis is
// computed in double and rounded once, so every peer uses the same bits).
#pragma once

#include <torch/torch.h>

#include "agora/optim/chunking.h"

namespace agora {

// C for size n on `device`, float32, cached per (n, device); thread-safe.
torch::Tensor dct_basis(int64_t n, const torch::Device& device = torch::kCPU);

// `x` (any shape chunk_geometry accepts, float32) -> [num_chunks, g.size()].
torch::Tensor chunked_dct(const torch::Tensor& x, const ChunkGeometry& g);
// [num_chunks, g.size()] -> a float32 tensor of `shape`.
torch::Tensor chunked_idct(const torch::Tensor& coefficients, at::IntArrayRef shape,
                           const ChunkGeometry& g);

// The same inverse for coefficients given sparsely: chunk c holds values[c, i] at positions[c, i]
// (int64, [num_chunks, K]; a position may repeat, its values add up). Each entry adds one outer
// product of basis vectors, K * m * n multiply-adds a chunk instead of the dense m * n * (m + n),
// so it is the cheaper way when K < m + n (sparse_is_cheaper). Equal to chunked_idct of the
// scattered coefficients up to float rounding.
torch::Tensor sparse_chunked_idct(const torch::Tensor& positions, const torch::Tensor& values,
                                  at::IntArrayRef shape, const ChunkGeometry& g);
bool sparse_is_cheaper(int64_t entries_per_chunk, const ChunkGeometry& g);

}  // namespace agora
