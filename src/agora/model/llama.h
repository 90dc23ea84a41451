// Llama: the decoder every peer trains (docs/algorithms.md section 5).
//
//   tokens -> embed_tokens -> L x [ x + attn(rmsnorm(x)); x + mlp(rmsnorm(x)) ] -> norm -> lm_head
//
// Causal multi-head attention with rotary embeddings (rotary.h), optional grouped-query
// attention, SwiGLU MLP, RMSNorm, no biases, optional tied embeddings, vocabulary padded to a
// multiple of 64. Parameter names are Hugging Face's LlamaForCausalLM names
// (model.layers.3.self_attn.q_proj.weight, ...), so named_parameters() is the checkpoint layout.
//
// Device-agnostic: build it, then .to(device). Uses only the tensor API common to libtorch 1.13
// and 2.x (attention is written out rather than calling scaled_dot_product_attention).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "agora/config/model_config.h"

namespace agora {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Keys and values of every layer for the positions already seen, for incremental decoding.
struct KvCache {
  std::vector<torch::Tensor> keys, values;  // per layer: [B, kv_heads, length, head_dim]
  int64_t length = 0;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  // x: [B, T, d]; cos/sin: [T, head_dim] for positions start..start+T-1. With a cache, the new
  // keys and values are appended to (keys, values) and attention covers every cached position.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& logn_scale, torch::Tensor* keys,
                        torch::Tensor* values);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& logn_scale, torch::Tensor* keys,
                        torch::Tensor* values);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// Attention logit scales for queries at positions start..start+T-1 when
// config.logn_attention_scaling is on (log n / log of the training length, n = keys attended);
// an undefined tensor when it is off.
torch::Tensor logn_attention_scales(const ModelConfig& config, int64_t start, int64_t T,
                                    torch::Device device);

// The body (HF's LlamaModel, registered as "model").
class LlamaBodyImpl : public torch::nn::Module {
 public:
  explicit LlamaBodyImpl(const ModelConfig& config);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaImpl : public torch::nn::Module {
 public:
  // Validates the config and initialises the weights from torch's global generator (seed it
  // with torch::manual_seed first for a repeatable model).
  explicit LlamaImpl(const ModelConfig& config);

  // tokens: [B, T] int64 -> logits [B, T, padded_vocab_size]. Without a cache T must not exceed
  // max_seq_len; with one, positions continue from cache->length and the cache grows.
  torch::Tensor forward(const torch::Tensor& tokens, KvCache* cache = nullptr);
  // The same from input vectors instead of token ids: x [B, T, hidden_size], e.g. the mean of
  // several tokens' embeddings (train/superposition.h). forward(tokens) is
  // forward_embeddings(model->embed_tokens(tokens)).
  torch::Tensor forward_embeddings(const torch::Tensor& x, KvCache* cache = nullptr);

  const ModelConfig& config() const { return config_; }
  // The output projection's weight (the embedding's when tied).
  torch::Tensor lm_head_weight() const;

  LlamaBody model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

 private:
  void initialise_weights();
  const std::pair<torch::Tensor, torch::Tensor>& rotary(int64_t length, torch::Device device);

  ModelConfig config_;
  std::pair<torch::Tensor, torch::Tensor> rotary_cache_;  // cos, sin for the longest length seen
};
TORCH_MODULE(Llama);

}  // namespace agora
