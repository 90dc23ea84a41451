// Torch tensors <-> safetensors files: the adapter between the torch-free safetensors layer
// (agora/tensor/safetensors.h) and the trainer.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "agora/tensor/safetensors.h"

namespace agora {

// Writes the tensors (any device; copied to CPU, contiguous) in the given order, atomically.
void save_tensors(const std::filesystem::path& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata);

// One tensor of an open file as an owned CPU torch tensor. Throws Error for a dtype torch
// cannot hold.
torch::Tensor load_tensor(const SafetensorsFile& file, const TensorInfo& info);

// Every tensor of the file, by name.
std::map<std::string, torch::Tensor> load_tensors(const std::filesystem::path& path);

}  // namespace agora
