#include "agora/config/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "agora/core/error.h"

namespace agora {
namespace {

struct Shape {
  const char* name;
  int64_t hidden, intermediate, layers, heads, kv_heads;
  bool tied;
};

// The one place presets are declared.
constexpr Shape kPresets[] = {
    {"tiny", 64, 192, 2, 4, 2, true},
    {"small", 288, 768, 6, 6, 6, false},
    {"gpt2-124m", 768, 2048, 12, 12, 12, true},
    {"1b", 2048, 8192, 16, 32, 8, true},
};

}  // namespace

int64_t ModelConfig::num_parameters() const {
  const int64_t d = hidden_size, kv = num_kv_heads * head_dim();
  const int64_t attention = d * d * 2 + d * kv * 2;  // q, o; k, v
  const int64_t mlp = 3 * d * intermediate_size;     // gate, up, down
  const int64_t norms = 2 * d;
  const int64_t embedding = padded_vocab_size() * d;
  return embedding * (tie_embeddings ? 1 : 2) + num_layers * (attention + mlp + norms) + d;
}

void ModelConfig::validate() const {
  const auto positive = [](const char* field, int64_t value) {
    if (value <= 0) fail("model.{} = {} is invalid (allowed: a positive integer)", field, value);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_layers", num_layers);
  positive("num_heads", num_heads);
  positive("num_kv_heads", num_kv_heads);
  positive("max_seq_len", max_seq_len);
  if (hidden_size % num_heads != 0) {
    fail("model.hidden_size = {} is not a multiple of model.num_heads = {}", hidden_size,
         num_heads);
  }
  if (head_dim() % 2 != 0) {
    fail("model head dimension {} (hidden_size / num_heads) must be even for rotary embeddings",
         head_dim());
  }
  if (num_heads % num_kv_heads != 0) {
    fail("model.num_kv_heads = {} must divide model.num_heads = {}", num_kv_heads, num_heads);
  }
  if (!(rope_theta > 0)) fail("model.rope_theta = {} is invalid (allowed: > 0)", rope_theta);
  if (!(rms_norm_eps > 0)) fail("model.rms_norm_eps = {} is invalid (allowed: > 0)", rms_norm_eps);
  if (!(init_std > 0)) fail("model.init_std = {} is invalid (allowed: > 0)", init_std);
  if (!(yarn_factor >= 1.0)) {
    fail("model.yarn_factor = {} is invalid (allowed: >= 1; 1 turns YaRN off)", yarn_factor);
  }
  if (yarn_factor > 1.0 && yarn_original_max_seq_len <= 0) {
    fail("model.yarn_original_max_seq_len must be set (> 0) when model.yarn_factor = {}",
         yarn_factor);
  }
  // Newer transformers derive YaRN's factor as max_position_embeddings / original, ignoring the
  // stored factor; keeping the two equal means every reader computes the same frequencies.
  if (yarn_factor > 1.0 &&
      std::abs(yarn_factor * double(yarn_original_max_seq_len) - double(max_seq_len)) > 0.5) {
    fail(
        "model.yarn_factor ({}) x model.yarn_original_max_seq_len ({}) must equal the context the "
        "model runs at, max_seq_len = {} (data.seq_len)",
        yarn_factor, yarn_original_max_seq_len, max_seq_len);
  }
  if (!(yarn_beta_fast > yarn_beta_slow && yarn_beta_slow > 0)) {
    fail("model.yarn_beta_fast = {} and yarn_beta_slow = {} are invalid (allowed: fast > slow > 0)",
         yarn_beta_fast, yarn_beta_slow);
  }
  if (logn_attention_scaling && max_seq_len < 2) {
    fail("model.logn_attention_scaling needs max_seq_len >= 2 (log n is 0 at n = 1)");
  }
}

ModelConfig model_preset(std::string_view name, int64_t vocab_size, int64_t max_seq_len) {
  for (const Shape& shape : kPresets) {
    if (name != shape.name) continue;
    ModelConfig config;
    config.preset = shape.name;
    config.vocab_size = vocab_size;
    config.hidden_size = shape.hidden;
    config.intermediate_size = shape.intermediate;
    config.num_layers = shape.layers;
    config.num_heads = shape.heads;
    config.num_kv_heads = shape.kv_heads;
    config.tie_embeddings = shape.tied;
    config.max_seq_len = max_seq_len;
    return config;
  }
  fail("unknown model preset '{}' (allowed: {})", name, fmt::join(model_preset_names(), ", "));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Shape& shape : kPresets) names.push_back(shape.name);
  return names;
}

}  // namespace agora
