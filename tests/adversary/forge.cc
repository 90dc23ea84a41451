#include "forge.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "agora/optim/chunking.h"

namespace agora::adversary {

PayloadLayout demo_layout(const RunConfig& config) {
  PayloadLayout layout;
  layout.kind = PayloadKind::kDemo;
  for (const ParameterShape& p : parameter_shapes(config.model)) {
    layout.tensors.push_back(
        demo_tensor_layout(p.shape, config.demo.chunk, config.demo.topk, config.demo.one_bit));
  }
  return layout;
}

Payload synthetic_payload(const PayloadLayout& layout, uint64_t step, std::mt19937_64& rng) {
  Payload p;
  p.kind = layout.kind;
  p.step = step;
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (const TensorLayout& t : layout.tensors) {
    TensorPayload entry;
    entry.layout = t;
    for (int64_t c = 0; c < t.num_chunks(); ++c) {
      for (int64_t k = 0; k < t.topk; ++k) entry.positions.push_back(static_cast<uint32_t>(k));
    }
    entry.values.resize(static_cast<size_t>(t.value_count()));
    for (float& v : entry.values) {
      v = normal(rng);
      if (t.value_type == ValueType::kOneBit) v = v < 0 ? -1.0f : 1.0f;
      if (t.value_type == ValueType::kBF16) v = round_to_bf16(v);
    }
    p.tensors.push_back(std::move(entry));
  }
  return p;
}

Payload forge(Payload base, uint64_t step, Values values, double factor, std::mt19937_64& rng) {
  base.step = step;
  for (TensorPayload& t : base.tensors) {
    const bool one_bit = t.layout.value_type == ValueType::kOneBit;
    double square = 0;
    for (float v : t.values) square += double(v) * v;
    const double rms = t.values.empty() ? 1e-3 : std::sqrt(square / double(t.values.size()));
    switch (values) {
      case Values::kKeep:
        break;
      case Values::kScale:
        for (float& v : t.values) v = static_cast<float>(std::clamp(v * factor, -3e38, 3e38));
        break;
      case Values::kFltMax:  // the base's signs, times the factor's
        for (float& v : t.values) v = (v < 0) != (factor < 0) ? -3e38f : 3e38f;
        break;
      case Values::kSignFlip:
        for (float& v : t.values) v = -v;
        break;
      case Values::kZero:
        std::fill(t.values.begin(), t.values.end(), 0.0f);
        break;
      case Values::kNoise: {
        std::normal_distribution<double> normal(0.0, rms > 0 ? rms : 1e-3);
        std::vector<uint32_t> all(static_cast<size_t>(t.layout.chunk_size()));
        std::iota(all.begin(), all.end(), 0u);
        const auto k = static_cast<size_t>(t.layout.topk);
        for (size_t c = 0; c * k < t.positions.size(); ++c) {
          std::shuffle(all.begin(), all.end(), rng);
          std::sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k));
          std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k),
                    t.positions.begin() + static_cast<std::ptrdiff_t>(c * k));
        }
        for (float& v : t.values) v = static_cast<float>(normal(rng));
        break;
      }
    }
    for (float& v : t.values) {
      if (one_bit) v = v < 0 ? -1.0f : 1.0f;
      if (t.layout.value_type == ValueType::kBF16) v = round_to_bf16(v);
    }
  }
  return base;
}

}  // namespace agora::adversary
