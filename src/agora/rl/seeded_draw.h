// Checkable sampling: every token of a rollout is drawn by a uniform number the learner can
// recompute, so a worker cannot choose its tokens (docs/rl.md section 4).
//
// Re-scoring (rescore.h) checks that a rollout's claimed log-probabilities are the policy's, but
// a worker that writes the tokens itself (the right answer, or the best of several samples) and
// scores them honestly by teacher forcing passes it. With seeded draws, slot (problem, sample)
// of a run has a seed from (run id, problem id, sample), and the token at completion position t
// is drawn by inverse transform sampling: with u_t = uniform(seed, t) in [0, 1) and the policy's
// tempered distribution p over the vocabulary, the token is the least j with
// p_0 + ... + p_j > u_t. The learner, in the forward pass it already makes to re-score, computes
// for each submitted token j the interval [p_0 + ... + p_{j-1}, p_0 + ... + p_j) and checks that
// u_t falls inside it, within a tolerance for other hardware. A token the policy did not draw
// lies outside unless the worker was lucky at every position.
//
// The seed names no worker: a slot handed again to another worker (reassignment) gives the same
// tokens under the same policy version, so withholding an unlucky rollout gains nothing.
//
// The numbers are the same on every machine: the seed is BLAKE2b of the tagged fields, and u_t
// is splitmix64 of (seed, t), its top 53 bits scaled to [0, 1).
#pragma once

#include <cstdint>
#include <string_view>

namespace agora {

uint64_t slot_seed(std::string_view run_id, uint64_t problem_id, uint32_t sample);
double slot_uniform(uint64_t seed, uint32_t position);

// How far u lies outside [low, high): 0 inside, else the distance to the nearer end.
inline double draw_gap(double u, double low, double high) {
  return u < low ? low - u : (u >= high ? u - high : 0.0);
}

}  // namespace agora
