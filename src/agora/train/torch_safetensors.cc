#include "agora/train/torch_safetensors.h"

#include "agora/core/error.h"

namespace agora {
namespace {

DType to_dtype(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return DType::kF32;
    case torch::kFloat64:
      return DType::kF64;
    case torch::kFloat16:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kInt64:
      return DType::kI64;
    case torch::kInt32:
      return DType::kI32;
    case torch::kInt16:
      return DType::kI16;
    case torch::kInt8:
      return DType::kI8;
    case torch::kUInt8:
      return DType::kU8;
    case torch::kBool:
      return DType::kBool;
    default:
      fail("cannot store torch dtype {} in safetensors", c10::toString(type));
  }
}

torch::ScalarType to_scalar_type(DType dtype, const std::string& where) {
  switch (dtype) {
    case DType::kF32:
      return torch::kFloat32;
    case DType::kF64:
      return torch::kFloat64;
    case DType::kF16:
      return torch::kFloat16;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kInt64;
    case DType::kI32:
      return torch::kInt32;
    case DType::kI16:
      return torch::kInt16;
    case DType::kI8:
      return torch::kInt8;
    case DType::kU8:
      return torch::kUInt8;
    case DType::kBool:
      return torch::kBool;
    default:
      fail("{}: dtype {} has no torch equivalent here", where, dtype_name(dtype));
  }
}

}  // namespace

void save_tensors(const std::filesystem::path& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> cpu;  // keeps the bytes alive while the views point at them
  cpu.reserve(tensors.size());
  std::vector<TensorView> views;
  for (const auto& [name, tensor] : tensors) {
    cpu.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& t = cpu.back();
    TensorView view;
    view.name = name;
    view.dtype = to_dtype(t.scalar_type());
    view.shape.assign(t.sizes().begin(), t.sizes().end());
    view.bytes = {static_cast<const uint8_t*>(t.data_ptr()),
                  static_cast<size_t>(t.numel()) * t.element_size()};
    views.push_back(std::move(view));
  }
  write_safetensors(path, views, metadata);
}

torch::Tensor load_tensor(const SafetensorsFile& file, const TensorInfo& info) {
  const auto type = to_scalar_type(info.dtype, file.path().string() + " " + info.name);
  const auto bytes = file.bytes(info);
  torch::Tensor out = torch::empty(info.shape, torch::TensorOptions().dtype(type));
  if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out;
}

std::map<std::string, torch::Tensor> load_tensors(const std::filesystem::path& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& info : file.tensors()) out.emplace(info.name, load_tensor(file, info));
  return out;
}

}  // namespace agora
