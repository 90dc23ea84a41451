// The model's parameters as the network sees them: hashed, served and loaded tensor by tensor.
//
// A state record names every parameter in the model's order with its hash, and the state hash
// over them (train/parameter_hash.h: the same hash the local trainer reports). Two peers with the
// same state hash hold bit-identical parameters; a joiner can check each tensor it fetched on its
// own, before it has the rest.
#pragma once

#include <memory>

#include "agora/model/llama.h"
#include "agora/peer/peer_network.h"
#include "agora/wire/agora.pb.h"

namespace agora::peer {

wire::StateRecord state_record(Llama& model, uint64_t applied_steps);

// A copy of every parameter's bytes, to serve while training moves on.
std::shared_ptr<const Snapshot> snapshot_of(Llama& model);

// Copies `snapshot` into `model`; throws Error naming the tensor when one is missing or its
// size differs from the model's. The claimed dtype and shape are ignored: the bytes are the
// float32 bytes the hash covers, in the model's own shape.
void load_snapshot(Llama& model, const Snapshot& snapshot);

// The record's state hash in hex, for logs.
std::string state_hash_hex(const wire::StateRecord& record);

}  // namespace agora::peer
