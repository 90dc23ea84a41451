// Rotary position embedding in Hugging Face Llama's "rotate half" convention, with YaRN.
//
// For head dimension D, frequency i (0 <= i < D/2) turns at inv_freq[i] = theta^(-2i/D) radians
// per position. A query or key vector x at position p becomes
//   x * cos(p * f) + rotate_half(x) * sin(p * f),  rotate_half([a, b]) = [-b, a],
// where f repeats inv_freq twice ([f0..f_{D/2-1}, f0..f_{D/2-1}]) — the layout HF uses, so
// checkpoints exchange with it without permuting q_proj/k_proj rows.
//
// YaRN (docs/algorithms.md section 5.3, HF's _compute_yarn_parameters): with scale s and original
// context L, frequencies that turn more than beta_fast times over L keep inv_freq, those that
// turn fewer than beta_slow times become inv_freq / s, a linear ramp over the dimension index
// blends between them, and cos and sin are both multiplied by 0.1 ln(s) + 1.
#pragma once

#include <torch/torch.h>

#include "agora/config/model_config.h"

namespace agora {

// The per-frequency inverse frequencies (D/2 values, float64 for exactness) and the factor
// that multiplies cos and sin (1 without YaRN).
struct RotaryFrequencies {
  torch::Tensor inv_freq;
  double attention_factor = 1.0;
};
RotaryFrequencies rotary_frequencies(const ModelConfig& config);

// cos and sin tables of shape [length, D], float32, for positions 0..length-1.
struct RotaryTables {
  torch::Tensor cos, sin;
};
RotaryTables rotary_tables(const ModelConfig& config, int64_t length, torch::Device device);

// x: [B, H, T, D]; cos/sin: [T, D] for the T positions of x.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

}  // namespace agora
