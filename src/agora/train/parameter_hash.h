// The hash peers compare to prove they hold the same model: BLAKE2b-256 over every parameter's
// name, shape, dtype and raw bytes, in the model's order. Equal hashes mean bit-identical weights.
#pragma once

#include <string>

#include "agora/model/llama.h"

namespace agora {

// Lower-case hex.
std::string parameter_hash(Llama& model);

}  // namespace agora
