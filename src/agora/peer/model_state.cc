#include "agora/peer/model_state.h"

#include <torch/torch.h>

#include "agora/core/error.h"
#include "agora/core/hash.h"

namespace agora::peer {
namespace {

std::string tensor_bytes(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
}

}  // namespace

wire::StateRecord state_record(Llama& model, uint64_t applied_steps) {
  wire::StateRecord record;
  record.set_applied_steps(applied_steps);
  std::string all;
  for (const auto& item : model->named_parameters()) {
    const std::string h = blake2b256_bytes(tensor_bytes(item.value()));
    record.add_tensor_names(item.key());
    record.add_tensor_hashes(h);
    all += h;
  }
  record.set_state_hash(blake2b256_bytes(all));
  return record;
}

std::shared_ptr<const Snapshot> snapshot_of(Llama& model) {
  auto out = std::make_shared<Snapshot>();
  for (const auto& item : model->named_parameters()) {
    TensorBytes t;
    t.dtype = "F32";
    for (int64_t d : item.value().sizes()) t.shape.push_back(d);
    t.data = tensor_bytes(item.value());
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
           t.dtype, fmt::join(t.shape, "x"), t.data.size(), fmt::join(shape, "x"));
    }
    const torch::Tensor source =
        torch::from_blob(const_cast<char*>(t.data.data()), shape, torch::kFloat32);
    item.value().copy_(source);
  }
}

std::string state_hash_hex(const wire::StateRecord& record) {
  std::array<uint8_t, 32> d{};
  if (record.state_hash().size() != d.size()) return "(none)";
  std::memcpy(d.data(), record.state_hash().data(), d.size());
  return to_hex(d);
}

}  // namespace agora::peer
