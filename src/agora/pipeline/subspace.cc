#include "agora/pipeline/subspace.h"

#include <ATen/CPUGeneratorImpl.h>

#include "agora/core/error.h"

namespace agora {

torch::Generator seeded_generator(uint64_t seed, std::string_view name) {
  // FNV-1a over the name, mixed with the seed by splitmix64: stable across platforms and
  // releases, unlike std::hash.
  uint64_t h = 1469598103934665603ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return at::detail::createCPUGenerator(z ^ (z >> 31));
}

SubspaceBasis::SubspaceBasis(const ModelConfig& config, int64_t rank, uint64_t seed,
                             torch::Device device) {
  const int64_t d = config.hidden_size;
  if (rank < 1 || rank > d) {
    fail("pipeline.subspace_rank = {} is invalid (allowed: 1 to hidden_size = {})", rank, d);
  }
  torch::NoGradGuard no_grad;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  // QR in float64 so the columns are orthonormal to float32 rounding once cast.
  const torch::Tensor gaussian =
      torch::empty({d, rank}, f64).normal_(0.0, 1.0, seeded_generator(seed, "subspace.basis"));
  basis_ = std::get<0>(torch::linalg_qr(gaussian)).to(torch::kFloat32).to(device);
  fixed_embedding_ =
      torch::empty({config.padded_vocab_size(), d})
          .normal_(0.0, config.init_std, seeded_generator(seed, "subspace.fixed_embedding"))
          .to(device);
}

torch::Tensor SubspaceBasis::project(const torch::Tensor& x) const {
  return torch::matmul(torch::matmul(x, basis_), basis_.t());
}

torch::Tensor SubspaceBasis::coefficients(const torch::Tensor& x,
                                          const torch::Tensor& tokens) const {
  return torch::matmul(x - fixed_embedding_.index({tokens}), basis_);
}

torch::Tensor SubspaceBasis::reconstruct(const torch::Tensor& c,
                                         const torch::Tensor& tokens) const {
  return fixed_embedding_.index({tokens}) + torch::matmul(c, basis_.t());
}

}  // namespace agora
