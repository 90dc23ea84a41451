// Forging DeMo payloads without libtorch, for the adversary (agora_adversary.cc).
//
// The layout a run's honest peers expect is computed from its config: the Llama parameters in the
// order libtorch's named_parameters() lists them (src/agora/model/llama.cc: the embedding, then
// per layer q, k, v, o, gate, up, down and the two norms, then the final norm and an untied
// lm_head), each through demo_tensor_layout. The adversary checks it against the first honest
// payload it fetches and takes that payload's layout when they differ.
//
// A forged payload starts from a base (an honest payload of an earlier step, or a synthetic one
// when none is held yet) and is transformed as the attack says. Every result encodes: it passes
// the layout check every witness makes today, which is the point.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "agora/config/parameter_shapes.h"
#include "agora/config/run_config.h"
#include "agora/optim/payload.h"

namespace agora::adversary {

// DeMo's payload layout for `config` (model, demo.chunk, demo.topk, demo.one_bit).
PayloadLayout demo_layout(const RunConfig& config);

// What is done to the base's values.
enum class Values { kKeep, kScale, kFltMax, kSignFlip, kNoise, kZero };

// A payload of `layout` for `step`: the first topk positions of every chunk, values drawn from
// N(0, 1e-3) (one-bit: random signs). Stands for an honest payload before any is held.
Payload synthetic_payload(const PayloadLayout& layout, uint64_t step, std::mt19937_64& rng);

// `base` with its step field set to `step` and its values transformed: kScale multiplies them by
// `factor`, kFltMax replaces each by +-3e38 (the base's sign times the factor's: a negative
// factor pushes against the honest direction), kSignFlip negates, kNoise draws
// new positions and Gaussian values of the base's RMS, kZero sends zeros (one-bit: all +1).
Payload forge(Payload base, uint64_t step, Values values, double factor, std::mt19937_64& rng);

}  // namespace agora::adversary
