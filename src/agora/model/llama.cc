#include "agora/model/llama.h"

#include <cmath>

#include "agora/core/error.h"
#include "agora/model/rotary.h"

namespace agora {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Normalise in float32 whatever the activation dtype, as HF's LlamaRMSNorm does.
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + eps_);
  return weight * normed.to(x.dtype());
}

AttentionImpl::AttentionImpl(const ModelConfig& config)
    : num_heads_(config.num_heads),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim()) {
  const int64_t d = config.hidden_size, kv = num_kv_heads_ * head_dim_;
  q_proj = register_module("q_proj", linear(d, d));
  k_proj = register_module("k_proj", linear(d, kv));
  v_proj = register_module("v_proj", linear(d, kv));
  o_proj = register_module("o_proj", linear(d, d));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin, const torch::Tensor& logn_scale,
                                     torch::Tensor* keys, torch::Tensor* values) {
  const int64_t B = x.size(0), T = x.size(1);
  // [B, T, heads * D] -> [B, heads, T, D]
  torch::Tensor q = q_proj(x).view({B, T, num_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor k = k_proj(x).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor v = v_proj(x).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (keys != nullptr) {
    if (keys->defined()) {
      k = torch::cat({*keys, k}, 2);
      v = torch::cat({*values, v}, 2);
    }
    *keys = k;
    *values = v;
  }
  if (logn_scale.defined()) q = q * logn_scale.view({1, 1, T, 1}).to(q.dtype());
  if (num_kv_heads_ != num_heads_) {
    // Grouped-query attention: kv head j serves query heads j*g .. j*g+g-1 (HF's repeat_kv).
    const int64_t group = num_heads_ / num_kv_heads_;
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  const int64_t S = k.size(2);  // keys: cached positions + these T
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head_dim_));
  // Query i sits at absolute position S - T + i and may attend keys 0 .. S - T + i.
  const torch::Tensor future =
      torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
          .triu(S - T + 1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const torch::Tensor weights = torch::softmax(scores.to(torch::kFloat32), -1).to(q.dtype());
  const torch::Tensor out = torch::matmul(weights, v).transpose(1, 2).reshape({B, T, -1});
  return o_proj(out);
}

MlpImpl::MlpImpl(const ModelConfig& config) {
  const int64_t d = config.hidden_size, h = config.intermediate_size;
  gate_proj = register_module("gate_proj", linear(d, h));
  up_proj = register_module("up_proj", linear(d, h));
  down_proj = register_module("down_proj", linear(h, d));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  // SwiGLU: down(silu(gate x) * up x)
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& config) {
  self_attn = register_module("self_attn", Attention(config));
  mlp = register_module("mlp", Mlp(config));
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin, const torch::Tensor& logn_scale,
                                        torch::Tensor* keys, torch::Tensor* values) {
  const torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin, logn_scale, keys, values);
  return h + mlp(post_attention_layernorm(h));
}

LlamaBodyImpl::LlamaBodyImpl(const ModelConfig& config) {
  embed_tokens = register_module(
      "embed_tokens", torch::nn::Embedding(config.padded_vocab_size(), config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) layers->push_back(DecoderLayer(config));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor logn_attention_scales(const ModelConfig& config, int64_t start, int64_t T,
                                    torch::Device device) {
  if (!config.logn_attention_scaling) return {};
  // Query at position p attends n = p + 1 keys; the factor is 1 at the training length.
  const int64_t train_len =
      config.yarn_factor > 1.0 ? config.yarn_original_max_seq_len : config.max_seq_len;
  return torch::log(
             torch::arange(start + 1, start + T + 1, torch::TensorOptions().dtype(torch::kFloat32)))
      .div(std::log(double(train_len)))
      .to(device);
}

LlamaImpl::LlamaImpl(const ModelConfig& config) : config_(config) {
  config_.validate();
  model = register_module("model", LlamaBody(config_));
  if (!config_.tie_embeddings) {
    lm_head = register_module("lm_head", linear(config_.hidden_size, config_.padded_vocab_size()));
  }
  initialise_weights();
}

void LlamaImpl::initialise_weights() {
  // Normal(0, init_std) everywhere; the projections that write into the residual stream (o_proj,
  // down_proj) are scaled by 1/sqrt(2L) so the residual's variance does not grow with depth
  // (GPT-2's scheme). Norm weights stay at 1.
  torch::NoGradGuard no_grad;
  const double std = config_.init_std;
  const double residual_std = std / std::sqrt(2.0 * config_.num_layers);
  for (auto& item : named_parameters()) {
    if (item.value().dim() < 2) continue;
    const bool residual = item.key().find("o_proj") != std::string::npos ||
                          item.key().find("down_proj") != std::string::npos;
    item.value().normal_(0.0, residual ? residual_std : std);
  }
}

torch::Tensor LlamaImpl::lm_head_weight() const {
  return config_.tie_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

const std::pair<torch::Tensor, torch::Tensor>& LlamaImpl::rotary(int64_t length,
                                                                 torch::Device device) {
  if (!rotary_cache_.first.defined() || rotary_cache_.first.size(0) < length ||
      rotary_cache_.first.device() != device) {
    const int64_t size = std::max(length, config_.max_seq_len);
    const RotaryTables tables = rotary_tables(config_, size, device);
    rotary_cache_ = {tables.cos, tables.sin};
  }
  return rotary_cache_;
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& tokens, KvCache* cache) {
  if (tokens.dim() != 2)
    fail("model input must be [batch, time] token ids, got {} dims", tokens.dim());
  return forward_embeddings(model->embed_tokens(tokens), cache);
}

torch::Tensor LlamaImpl::forward_embeddings(const torch::Tensor& input, KvCache* cache) {
  if (input.dim() != 3 || input.size(2) != config_.hidden_size) {
    fail("model input vectors must be [batch, time, {}], got {}", config_.hidden_size,
         c10::str(input.sizes()));
  }
  const int64_t T = input.size(1);
  const int64_t start = cache ? cache->length : 0;
  if (!cache && T > config_.max_seq_len) {
    fail("sequence of {} tokens is longer than the model's context ({})", T, config_.max_seq_len);
  }
  const auto& [cos_all, sin_all] = rotary(start + T, input.device());
  const torch::Tensor cos = cos_all.narrow(0, start, T), sin = sin_all.narrow(0, start, T);

  const torch::Tensor logn_scale = logn_attention_scales(config_, start, T, input.device());

  if (cache && cache->keys.empty()) {
    cache->keys.resize(config_.num_layers);
    cache->values.resize(config_.num_layers);
  }
  torch::Tensor x = input;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    x = model->layers->at<DecoderLayerImpl>(i).forward(x, cos, sin, logn_scale,
                                                       cache ? &cache->keys[i] : nullptr,
                                                       cache ? &cache->values[i] : nullptr);
  }
  x = model->norm(x);
  if (cache) cache->length += T;
  return torch::matmul(x, lm_head_weight().t());
}

}  // namespace agora
