#include "agora/train/parameter_hash.h"

#include "agora/core/hash.h"
#include "agora/core/hex.h"

namespace agora {

std::string parameter_bytes(const torch::Tensor& parameter) {
  const torch::Tensor c = parameter.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()),
                     static_cast<size_t>(c.numel()) * sizeof(float));
}

ParameterHashes hash_parameters(Llama& model) {
  ParameterHashes out;
  std::string all;
  for (const auto& item : model->named_parameters()) {
    out.names.push_back(item.key());
    out.tensor_hashes.push_back(blake2b256_bytes(parameter_bytes(item.value())));
    all += out.tensor_hashes.back();
  }
  out.state_hash = blake2b256_bytes(all);
  return out;
}

std::string parameter_hash(Llama& model) {
  return hex_encode(hash_parameters(model).state_hash);
}

}  // namespace agora
