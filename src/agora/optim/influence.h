// Bounded influence: no contribution to a step moves the model more than an honest one can.
//
// DeMo averages, per DCT coefficient, the values of the payloads that selected it, then takes
// the sign of the inverse transform. A payload with huge (still finite) values would decide the
// sign of every coefficient it selects, whatever everybody else sent. So before aggregating,
// every payload's values are bounded per tensor:
//
//   n_j   = ||values of payload j for tensor t||_2        (summed in double, in order)
//   m     = the lower median of the nonzero n_j           (sorted ascending, index (Q-1)/2 of Q)
//   bound = ratio * m
//   a payload with n_j > bound has its values for t scaled by bound / n_j (float)
//
// Why the lower median: with f hostile payloads among P, the element at index (P-1)/2 lies
// between two honest norms whenever f <= (P-1)/2, whether the attackers send huge or zero
// values; so a strict minority cannot raise or lower the bound past the honest range. With two
// payloads it is the smaller one (a run of two has no majority to defend). Entries of all zeros
// are left out: they carry nothing, and counted they let zeros, half of a round, bound every
// honest entry to nothing (a near-zero entry still pulls the median as any other value does).
// Honest payloads are
// rarely above twice the median, so at the default ratio of 2 an honest-only step is usually
// left bit for bit as it was (bench/poisoning counts how often it is not).
//
// Everything is computed from the decoded payloads alone, in a fixed order, with IEEE double and
// float operations whose results are exact-rounded (sum of products, sqrt, division), so every
// honest peer bounds the same values to the same bits. One-bit payloads all have the same norm
// per tensor (sqrt of their selection count) and are never scaled. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "agora/optim/payload.h"

namespace agora {

// Scales, in place, the values of every tensor entry whose norm exceeds `ratio` times the lower
// median of the entries' norms for that tensor. `payloads` all have the same layout (decoded
// against the strategy's). Returns how many (payload, tensor) entries were scaled. ratio <= 0
// turns the bound off.
int64_t bound_influence(std::vector<Payload>& payloads, double ratio);

}  // namespace agora
