// The Llama's parameters as names and shapes, computed from its ModelConfig without libtorch:
// what a payload's layout or a state's size needs where the model itself is not built (the
// payload benchmark, the test adversary). The order is model/llama.h's named_parameters().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agora/config/model_config.h"

namespace agora {

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<ParameterShape> parameter_shapes(const ModelConfig& model);

}  // namespace agora
