#include "agora/train/published_policy.h"

#include "agora/core/error.h"
#include "agora/optim/payload_tensors.h"
#include "agora/train/parameter_hash.h"

namespace agora {

PublishedPolicy::PublishedPolicy(Llama& model, uint64_t version) : version_(version) {
  model_ = Llama(model->config());
  model_->to(torch::kCPU);
  torch::NoGradGuard no_grad;
  const auto source = model->named_parameters();
  for (auto& p : model_->named_parameters()) p.value().copy_(source[p.key()]);
  model_->eval();
  state_hash_ = hash_parameters(model_).state_hash;
}

PayloadLayout PublishedPolicy::layout(Llama& model, bool whole) {
  PayloadLayout layout;
  layout.kind = PayloadKind::kPseudoGradient;
  for (const auto& p : model->parameters()) {
    layout.tensors.push_back(whole ? dense_layout(p.sizes().vec(), ValueType::kF32)
                                   : int8_rows_layout(p.sizes().vec()));
  }
  return layout;
}

std::string PublishedPolicy::advance(Llama& live) {
  torch::NoGradGuard no_grad;
  Payload delta;
  delta.kind = PayloadKind::kPseudoGradient;
  delta.step = version_ + 1;
  const auto source = live->named_parameters();
  for (const auto& p : model_->named_parameters()) {
    const torch::Tensor target = source[p.key()].detach().to(torch::kCPU, torch::kFloat32);
    delta.tensors.push_back(int8_rows_payload(target - p.value()));
  }
  std::string bytes = encode_payload(delta);
  // Applied from the bytes, as a worker applies them: the same operations give the same bits.
  apply(model_, bytes, /*whole=*/false, delta.step);
  version_ = delta.step;
  state_hash_ = hash_parameters(model_).state_hash;
  return bytes;
}

std::string PublishedPolicy::whole() {
  torch::NoGradGuard no_grad;
  Payload payload;
  payload.kind = PayloadKind::kPseudoGradient;
  payload.step = version_;
  for (const auto& p : model_->parameters()) {
    payload.tensors.push_back(dense_payload(p.detach(), ValueType::kF32));
  }
  return encode_payload(payload);
}

void PublishedPolicy::apply(Llama& model, std::string_view bytes, bool whole, uint64_t step) {
  const Payload payload = decode_payload(bytes, layout(model, whole));
  if (payload.step != step) {
    fail("rl policy payload is for version {}, expected {}", payload.step, step);
  }
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& p : model->parameters()) {
    const torch::Tensor values = to_tensor(payload.tensors[i++]).to(p.device());
    if (whole) {
      p.copy_(values);
    } else {
      p.add_(values);
    }
  }
}

}  // namespace agora
