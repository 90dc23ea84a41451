#include "agora/optim/dct.h"

#include <cmath>
#include <map>
#include <mutex>
#include <numbers>
#include <string>
#include <utility>

#include "agora/core/error.h"

namespace agora {
namespace {

torch::Tensor make_basis(int64_t n) {
  auto basis = torch::empty({n, n}, torch::kFloat64);
  auto c = basis.accessor<double, 2>();
  for (int64_t k = 0; k < n; ++k) {
    const double a = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (int64_t j = 0; j < n; ++j) {
      c[k][j] = a * std::cos(std::numbers::pi * static_cast<double>((2 * j + 1) * k) /
                             static_cast<double>(2 * n));
    }
  }
  return basis.to(torch::kFloat32);
}

// Rows of the [R, N] view the 2-D transform works on: every dimension but the last. Blocks of
// chunk rows never straddle two leading indices, since the chunk divides the second-to-last
// dimension.
int64_t leading_rows(at::IntArrayRef shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

}  // namespace

torch::Tensor dct_basis(int64_t n, const torch::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, std::string>, torch::Tensor> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{n, device.str()}];
  if (!slot.defined()) slot = make_basis(n).to(device);
  return slot;
}

torch::Tensor chunked_dct(const torch::Tensor& x, const ChunkGeometry& g) {
  const torch::Tensor cols = dct_basis(g.cols, x.device());
  if (x.dim() == 1) return x.reshape({-1, g.cols}).matmul(cols.t());
  const int64_t R = leading_rows(x.sizes()), N = x.size(-1);
  // [R/m, m, N/n, n]: transform the columns of every block in one product, then the rows.
  torch::Tensor y = x.reshape({R / g.rows, g.rows, N / g.cols, g.cols}).matmul(cols.t());
  y = torch::matmul(dct_basis(g.rows, x.device()), y.reshape({R / g.rows, g.rows, N}));
  return y.reshape({R / g.rows, g.rows, N / g.cols, g.cols})
      .permute({0, 2, 1, 3})
      .reshape({-1, g.size()});
}

torch::Tensor chunked_idct(const torch::Tensor& coefficients, at::IntArrayRef shape,
                           const ChunkGeometry& g) {
  const torch::Tensor cols = dct_basis(g.cols, coefficients.device());
  if (shape.size() == 1) return coefficients.reshape({-1, g.cols}).matmul(cols).reshape(shape);
  const int64_t R = leading_rows(shape), N = shape.back();
  torch::Tensor y = coefficients.reshape({R / g.rows, N / g.cols, g.rows, g.cols})
                        .permute({0, 2, 1, 3})
                        .reshape({R / g.rows, g.rows, N});
  y = torch::matmul(dct_basis(g.rows, coefficients.device()).t(), y);
  return y.reshape({R / g.rows, g.rows, N / g.cols, g.cols}).matmul(cols).reshape(shape);
}

torch::Tensor sparse_chunked_idct(const torch::Tensor& positions, const torch::Tensor& values,
                                  at::IntArrayRef shape, const ChunkGeometry& g) {
  const int64_t chunks = positions.size(0), K = positions.size(1);
  const torch::Device device = values.device();
  const torch::Tensor flat = positions.reshape({-1});
  // Row r and column c of a coefficient contribute value * C_m[r, :]^T C_n[c, :] to its block.
  const torch::Tensor rows = dct_basis(g.rows, device).index_select(0, flat.div(g.cols, "floor"));
  const torch::Tensor cols = dct_basis(g.cols, device).index_select(0, flat.remainder(g.cols));
  const torch::Tensor weighted = rows.reshape({chunks, K, g.rows}) * values.unsqueeze(-1);
  const torch::Tensor blocks = weighted.transpose(1, 2).bmm(cols.reshape({chunks, K, g.cols}));
  if (shape.size() == 1) return blocks.reshape(shape);
  const int64_t R = leading_rows(shape), N = shape.back();
  return blocks.reshape({R / g.rows, N / g.cols, g.rows, g.cols})
      .permute({0, 2, 1, 3})
      .reshape(shape);
}

bool sparse_is_cheaper(int64_t entries_per_chunk, const ChunkGeometry& g) {
  // Dense: C_m^T X C_n, m*n*(m + n) multiply-adds (n*n for 1-D, where m = 1); sparse: K*m*n.
  return entries_per_chunk < (g.rows == 1 ? g.cols : g.rows + g.cols);
}

}  // namespace agora
