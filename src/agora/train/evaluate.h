// Validation loss: the mean next-token cross-entropy over consecutive windows of a token set.
// With a sampler of bag s > 1 it is the superposition loss instead (train/superposition.h): the
// mean over positions of the mean of s cross-entropies against the next bag.
//
// Window i covers tokens [i*T, (i+1)*T] of its shard: inputs [i*T, (i+1)*T), targets shifted by
// one; a final partial window is dropped; windows never cross shards (Sampler::window_at's
// layout). Every target token weighs the same. Runs without gradients, in eval mode, and leaves
// the model in the mode it found it.
#pragma once

#include <cstdint>

#include "agora/data/sampler.h"
#include "agora/model/llama.h"

namespace agora {

struct EvalResult {
  double loss = 0;
  int64_t windows = 0;
  int64_t tokens = 0;
};

// At most `max_windows` windows (0: all), `batch` windows per forward pass.
EvalResult evaluate(Llama& model, const Sampler& windows, int64_t max_windows, int64_t batch);

}  // namespace agora
