#include "agora/peer/model_state.h"

#include <torch/torch.h>

#include "agora/core/error.h"
#include "agora/core/hex.h"
#include "agora/peer/peer_network_detail.h"
#include "agora/train/parameter_hash.h"

namespace agora::peer {

wire::StateRecord state_record(Llama& model, uint64_t applied_steps) {
  const ParameterHashes hashes = hash_parameters(model);
  wire::StateRecord record;
  record.set_applied_steps(applied_steps);
  for (size_t i = 0; i < hashes.names.size(); ++i) {
    record.add_tensor_names(hashes.names[i]);
    record.add_tensor_hashes(hashes.tensor_hashes[i]);
  }
  record.set_state_hash(hashes.state_hash);
  return record;
}

std::shared_ptr<const Snapshot> snapshot_of(Llama& model) {
  auto out = std::make_shared<Snapshot>();
  for (const auto& item : model->named_parameters()) {
    TensorBytes t;
    t.dtype = "F32";
    for (int64_t d : item.value().sizes()) t.shape.push_back(d);
    t.data = parameter_bytes(item.value());
    (*out)[item.key()] = std::move(t);
  }
  return out;
}

void load_snapshot(Llama& model, const Snapshot& snapshot) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const auto it = snapshot.find(item.key());
    if (it == snapshot.end()) fail("the fetched parameters lack tensor {}", item.key());
    const TensorBytes& t = it->second;
    const std::vector<int64_t> shape(item.value().sizes().begin(), item.value().sizes().end());
    if (t.dtype != "F32" || t.shape != shape ||
        t.data.size() != static_cast<size_t>(item.value().numel()) * sizeof(float)) {
      fail("fetched tensor {} is {} {} ({} bytes); this model needs F32 of shape [{}]", item.key(),
           detail::printable(t.dtype, 16), fmt::join(t.shape, "x"), t.data.size(),
           fmt::join(shape, "x"));
    }
    const torch::Tensor source =
        torch::from_blob(const_cast<char*>(t.data.data()), shape, torch::kFloat32);
    item.value().copy_(source);
  }
}

std::string state_hash_hex(const wire::StateRecord& record) {
  constexpr size_t kHashBytes = 32;
  return record.state_hash().size() == kHashBytes ? hex_encode(record.state_hash()) : "(none)";
}

}  // namespace agora::peer
