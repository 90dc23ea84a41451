// PublishedPolicy: the policy as rollout workers hold it, and the compact updates that move them.
//
// The learner trains its own model in float32; shipping those weights after every update would
// cost 4 bytes a parameter each time. Instead it keeps a second copy, the published policy, and
// after each update sends the int8 difference between the two (one float32 scale per row, the
// int8_rows codec of optim/payload.h, so about 1 byte a parameter) and applies that same
// difference to its own copy. Learner and workers then hold bit-identical published policies
// (decoding and adding are the same float32 operations everywhere), checked by the state hash
// each update carries. The published policy is what workers sample with, and what re-scoring
// checks their claims against; the learner's own model differs from it by less than one int8
// step per row, and GRPO's ratio treats the gap as the small off-policy distance it is. Since
// every delta is taken against the published copy, rounding errors do not accumulate.
//
// A worker that starts late, or falls further behind than the learner keeps deltas for, asks
// for the whole policy: dense float32, exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "agora/model/llama.h"
#include "agora/optim/payload.h"

namespace agora {

class PublishedPolicy {
 public:
  // A copy of `model`'s parameters as version `version`.
  explicit PublishedPolicy(Llama& model, uint64_t version = 0);

  Llama& model() { return model_; }
  uint64_t version() const { return version_; }
  const std::string& state_hash() const { return state_hash_; }  // raw 32 bytes

  // Moves to `live`'s parameters as closely as int8 rows allow, as version version() + 1.
  // Returns the delta's payload bytes (kind pseudo_gradient, step = the new version).
  std::string advance(Llama& live);
  // The whole policy: dense float32 entries, step = version().
  std::string whole();

  // Applies an encoded delta (or, when `whole`, sets the parameters) to `model`. Throws Error
  // naming what is wrong when the bytes do not decode to `model`'s layout or carry another step
  // than `step`.
  static void apply(Llama& model, std::string_view payload, bool whole, uint64_t step);
  static PayloadLayout layout(Llama& model, bool whole);

 private:
  Llama model_{nullptr};
  uint64_t version_ = 0;
  std::string state_hash_;
};

}  // namespace agora
