// ModelConfig: the shape of a Llama-style decoder, and the named presets, declared in one place.
//
// Torch-free on purpose: configs, checkpoints' config.json and the coordinator all speak it.
// The field names follow Hugging Face's LlamaConfig where one exists (config.json is written from
// them), so `hidden_size` here is `hidden_size` there.
//
// Presets (parameter counts for a vocabulary of 8192, the demo tokenizer's; `agora` prints the
// exact count for any vocabulary):
//   tiny       ~0.6M   d=64,   2 layers, 4 heads (2 kv), tied      unit tests
//   small      ~11M    d=288,  6 layers, 6 heads, untied           CPU demos
//   gpt2-124m  ~124M   d=768, 12 layers, 12 heads, tied (GPT-2 vocabulary)   GPUs
//   1b         ~1.1B   d=2048, 16 layers, 32 heads (8 kv), tied             GPUs
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

struct ModelConfig {
  std::string preset = "custom";  // informative only

  int64_t vocab_size = 0;  // the tokenizer's; the embedding is padded to a multiple of 64
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // < num_heads: grouped-query attention; must divide num_heads
  int64_t max_seq_len = 0;   // the training context length
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  double init_std = 0.02;  // residual projections get init_std / sqrt(2 * num_layers)

  // YaRN context extension (docs/algorithms.md section 5.3): off while yarn_factor == 1. The
  // model was (or will be) trained at yarn_original_max_seq_len and runs at max_seq_len = factor
  // * that (validate() insists on the equality, which is how newer transformers read the factor).
  double yarn_factor = 1.0;
  int64_t yarn_original_max_seq_len = 0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;

  // Multiply each query's attention logits by log(n) / log(max_seq_len), n = keys it attends.
  bool logn_attention_scaling = false;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t padded_vocab_size() const { return (vocab_size + 63) / 64 * 64; }
  // Exact trainable parameter count (with the padded vocabulary).
  int64_t num_parameters() const;
  // Throws Error naming the field, its value and what is allowed.
  void validate() const;
};

// The preset's shape for a tokenizer of `vocab_size` and a context of `max_seq_len`.
// Throws Error listing the presets when `name` is unknown.
ModelConfig model_preset(std::string_view name, int64_t vocab_size, int64_t max_seq_len);
std::vector<std::string> model_preset_names();

}  // namespace agora
