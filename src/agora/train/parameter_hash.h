// The hash peers compare to prove they hold the same model, the same everywhere: the local
// trainer's summary, a network peer's state reports and joiners' checks all use this one.
//
// Each parameter, in the model's order, hashes to the BLAKE2b-256 of its float32 bytes
// (little-endian, contiguous: what safetensors stores and what joiners fetch). The state hash is
// the BLAKE2b-256 of those hashes concatenated in order. Equal state hashes mean bit-identical
// parameters; a joiner checks each fetched tensor against its own hash before it has the rest.
#pragma once

#include <string>
#include <vector>

#include "agora/model/llama.h"

namespace agora {

struct ParameterHashes {
  std::vector<std::string> names;          // the model's parameter names, in order
  std::vector<std::string> tensor_hashes;  // 32 raw bytes each
  std::string state_hash;                  // 32 raw bytes
};

ParameterHashes hash_parameters(Llama& model);

// A parameter's bytes as hashed, served and loaded: float32, contiguous, on the CPU.
std::string parameter_bytes(const torch::Tensor& parameter);

// hash_parameters(model).state_hash in lower-case hex.
std::string parameter_hash(Llama& model);

}  // namespace agora
