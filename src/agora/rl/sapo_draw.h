// SAPO's choice of shared groups, torch-free and written once for the one-process swarm
// (sapo.cc) and the node across machines (sapo_node.cc).
//
// A group whose completions all scored alike has zero advantage under GRPO's normalisation
// (grpo.h): training on it moves nothing, so a shared slot spent on it would be wasted. SAPO
// ("Sharing is Caring", Gensyn 2025) therefore draws its J shared groups among the others'
// groups whose rewards differ. The draw is seeded, so every run of the same config and seed
// chooses the same groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace agora {

// splitmix64's step: the mixing function of every SAPO draw (sampling seeds, shared picks).
uint64_t sapo_mix(uint64_t x);

// Whether any reward of the group differs from its first: false for none or one.
bool rewards_differ(const std::vector<double>& rewards);

// Up to `shared` distinct indices among the entries of `informative` that are true, in the order
// drawn: each pick advances `state` by sapo_mix and takes the remaining candidate at state modulo
// how many remain. Fewer when fewer are informative; none for shared <= 0.
std::vector<size_t> draw_shared(const std::vector<bool>& informative, int64_t shared,
                                uint64_t state);

}  // namespace agora
