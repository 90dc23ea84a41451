// The fixed rank-k subspace of "subspace networks" (docs/pipeline.md, "Compressed boundaries";
// docs/algorithms.md section 7): the residual stream of a pipelined model is kept as
//
//   x = E_fix[token] + U c
//
// with U (d x k, orthonormal columns) and E_fix (padded vocabulary x d) fixed, drawn from the
// run's seed, identical on every peer and never sent. A stage boundary then carries the k
// coefficients c = U^T (x - E_fix[token]) and the token id forward, and U^T g backward, and both
// are exact (not an approximation) as long as every matrix that writes into the residual stream
// lies in span(U) (StageModel::constrain_to_subspace).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "agora/config/model_config.h"

namespace agora {

class SubspaceBasis {
 public:
  // U from the QR of a seeded Gaussian d x k matrix (float64, then float32), E_fix ~
  // Normal(0, init_std) from the same seed. The Gaussians are the same bits everywhere; the QR is
  // LAPACK's, so machines with different LAPACK builds may differ in U's last bits (which moves
  // a boundary's reconstruction by float rounding, not its meaning). Throws Error unless
  // 1 <= rank <= hidden_size.
  SubspaceBasis(const ModelConfig& config, int64_t rank, uint64_t seed, torch::Device device);

  int64_t rank() const { return basis_.size(1); }
  const torch::Tensor& basis() const { return basis_; }                      // U [d, k]
  const torch::Tensor& fixed_embedding() const { return fixed_embedding_; }  // E_fix [V, d]

  // x [..., d] -> x U U^T: the part of each row in span(U).
  torch::Tensor project(const torch::Tensor& x) const;
  // x [B, T, d], tokens [B, T] -> c [B, T, k] = (x - E_fix[tokens]) U
  torch::Tensor coefficients(const torch::Tensor& x, const torch::Tensor& tokens) const;
  // c [B, T, k], tokens [B, T] -> E_fix[tokens] + c U^T
  torch::Tensor reconstruct(const torch::Tensor& c, const torch::Tensor& tokens) const;

 private:
  torch::Tensor basis_, fixed_embedding_;
};

// A CPU generator seeded from (seed, name): every parameter or fixed tensor draws from its own
// stream, so a stage initialises its parameters without drawing the others'.
torch::Generator seeded_generator(uint64_t seed, std::string_view name);

}  // namespace agora
