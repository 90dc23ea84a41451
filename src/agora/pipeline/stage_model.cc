#include "agora/pipeline/stage_model.h"

#include <fmt/format.h>

#include <cmath>

#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/core/hex.h"
#include "agora/model/rotary.h"
#include "agora/train/parameter_hash.h"

namespace agora {
namespace {

// "layers.3.mlp.down_proj.weight" on a stage whose first layer is 8 -> "model.layers.11.mlp..."
std::string hf_name(const std::string& local, int64_t first_layer) {
  if (local.rfind("layers.", 0) == 0) {
    const size_t dot = local.find('.', 7);
    const int64_t index = std::stoll(local.substr(7, dot - 7));
    return fmt::format("model.layers.{}{}", first_layer + index, local.substr(dot));
  }
  if (local.rfind("lm_head.", 0) == 0) return local;
  return "model." + local;
}

bool writes_residual(const std::string& name) {
  return name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
}

}  // namespace

StageModelImpl::StageModelImpl(const ModelConfig& config, const StageSpan& span, uint64_t seed,
                               const SubspaceBasis* subspace)
    : config_(config), span_(span), subspace_(subspace) {
  config_.validate();
  if (span.end_layer > config.num_layers || span.first_layer < 0 || span.layers() < 1) {
    fail("stage {}: layers [{}, {}) do not fit a model of {} layers", span.stage, span.first_layer,
         span.end_layer, config.num_layers);
  }
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  if (span.embedding) {
    embed_tokens = register_module(
        "embed_tokens", torch::nn::Embedding(config.padded_vocab_size(), config.hidden_size));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = span.first_layer; i < span.end_layer; ++i)
    layers->push_back(DecoderLayer(config));
  if (span.head) {
    norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
    lm_head = register_module("lm_head", linear(config.hidden_size, config.padded_vocab_size()));
  }
  torch::NoGradGuard no_grad;
  const double residual_std = config.init_std / std::sqrt(2.0 * config.num_layers);
  for (const NamedParameter& p : hf_parameters()) {
    if (p.tensor.dim() < 2) continue;  // norm gains stay 1
    const double std = writes_residual(p.name) ? residual_std : config.init_std;
    const torch::Tensor drawn =
        torch::empty(p.tensor.sizes()).normal_(0.0, std, seeded_generator(seed, p.name));
    p.tensor.copy_(drawn);
  }
  constrain_to_subspace();
}

std::vector<NamedParameter> StageModelImpl::hf_parameters() const {
  std::vector<NamedParameter> out;
  for (const auto& item : named_parameters()) {
    NamedParameter p{hf_name(item.key(), span_.first_layer), item.value(), item.value().dim() >= 2};
    out.push_back(std::move(p));
  }
  return out;
}

torch::Tensor StageModelImpl::forward(const torch::Tensor& input) {
  torch::Tensor x;
  if (first()) {
    if (input.dim() != 2) fail("stage 0 takes [batch, time] token ids, got {} dims", input.dim());
    x = embed_tokens(input);
    if (subspace_ != nullptr) x = x + subspace_->fixed_embedding().index({input});
  } else {
    if (input.dim() != 3 || input.size(2) != config_.hidden_size) {
      fail("stage {} takes [batch, time, {}] activations, got {}", span_.stage, config_.hidden_size,
           c10::str(input.sizes()));
    }
    x = input;
  }
  const int64_t T = x.size(1);
  if (T > config_.max_seq_len) {
    fail("sequence of {} tokens is longer than the model's context ({})", T, config_.max_seq_len);
  }
  const RotaryTables rotary = rotary_tables(config_, T, x.device());
  const torch::Tensor logn = logn_attention_scales(config_, 0, T, x.device());
  for (size_t i = 0; i < layers->size(); ++i) {
    x = layers->at<DecoderLayerImpl>(i).forward(x, rotary.cos, rotary.sin, logn, nullptr, nullptr);
  }
  if (!last()) return x;
  return lm_head(norm(x));
}

void StageModelImpl::constrain_to_subspace() {
  if (subspace_ == nullptr || last()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor& U = subspace_->basis();
  for (const NamedParameter& p : hf_parameters()) {
    if (writes_residual(p.name)) {
      p.tensor.copy_(torch::matmul(U, torch::matmul(U.t(), p.tensor)));  // [d, in]: output rows
    } else if (p.name == "model.embed_tokens.weight") {
      p.tensor.copy_(subspace_->project(p.tensor));  // [V, d]: each token's row
    }
  }
}

void StageModelImpl::copy_into(Llama& whole) const {
  torch::NoGradGuard no_grad;
  auto targets = whole->named_parameters();
  for (const NamedParameter& p : hf_parameters()) {
    torch::Tensor* target = targets.find(p.name);
    if (target == nullptr) fail("the whole model has no parameter {}", p.name);
    if (p.name == "model.embed_tokens.weight" && subspace_ != nullptr) {
      target->copy_(p.tensor + subspace_->fixed_embedding());
    } else {
      target->copy_(p.tensor);
    }
  }
}

void StageModelImpl::copy_from(const Llama& whole) {
  torch::NoGradGuard no_grad;
  if (subspace_ != nullptr) fail("copy_from: a subspace stage cannot start from a whole model");
  const auto sources = whole->named_parameters();
  for (const NamedParameter& p : hf_parameters()) {
    const torch::Tensor* source = sources.find(p.name);
    if (source == nullptr) fail("the whole model has no parameter {}", p.name);
    p.tensor.copy_(*source);
  }
}

std::string stage_parameter_hash(const StageModel& stage) {
  std::string hashes;
  for (const torch::Tensor& p : stage->parameters()) hashes += blake2b256_bytes(parameter_bytes(p));
  return hex_encode(blake2b256_bytes(hashes));
}

}  // namespace agora
