#include "agora/model/rotary.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace agora {
namespace {

// The dimension index whose frequency turns `rotations` times over `context` positions
// (HF's find_correction_dim).
double correction_dim(double rotations, int64_t dim, double base, int64_t context) {
  return dim * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

RotaryFrequencies rotary_frequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  // theta^(2i/D) for i = 0..D/2-1.
  const torch::Tensor pos_freqs =
      torch::pow(config.rope_theta, torch::arange(0, dim, 2, opts) / static_cast<double>(dim));
  const torch::Tensor extrapolation = 1.0 / pos_freqs;
  if (config.yarn_factor == 1.0) return {extrapolation, 1.0};

  const double s = config.yarn_factor;
  const torch::Tensor interpolation = 1.0 / (s * pos_freqs);
  // Dimensions below `low` rotate fast (keep), above `high` slowly (interpolate).
  double low = std::floor(correction_dim(config.yarn_beta_fast, dim, config.rope_theta,
                                         config.yarn_original_max_seq_len));
  double high = std::ceil(correction_dim(config.yarn_beta_slow, dim, config.rope_theta,
                                         config.yarn_original_max_seq_len));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a division by zero in the ramp
  const torch::Tensor ramp = ((torch::arange(dim / 2, opts) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor keep = 1.0 - ramp;  // 1: extrapolate (keep), 0: interpolate
  return {interpolation * (1.0 - keep) + extrapolation * keep, 0.1 * std::log(s) + 1.0};
}

RotaryTables rotary_tables(const ModelConfig& config, int64_t length, torch::Device device) {
  const RotaryFrequencies freqs = rotary_frequencies(config);
  const torch::Tensor positions =
      torch::arange(length, torch::TensorOptions().dtype(torch::kFloat64));
  const torch::Tensor angles = torch::outer(positions, freqs.inv_freq);  // [T, D/2]
  const torch::Tensor doubled = torch::cat({angles, angles}, -1);        // [T, D]
  return {(doubled.cos() * freqs.attention_factor).to(torch::kFloat32).to(device),
          (doubled.sin() * freqs.attention_factor).to(torch::kFloat32).to(device)};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.dtype()) + rotated * sin.to(x.dtype());
}

}  // namespace agora
