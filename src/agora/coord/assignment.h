// Assignment: which sequence ids a round trains, and how they are split among its members.
//
// Pure functions over coord::DataQueue, deterministic to the bit: the same queue, members and
// throughputs give the same assignment on every run (and after a coordinator restart).
//
// What they promise:
//   - take_sequences hands out returned (pending) ids before fresh ones, lowest id first, and
//     never the same id twice while it is out;
//   - return_sequences puts ids back so that the next take hands them out first;
//   - fastest_shares sums exactly to the total and ends the round soonest; ties go to the lower
//     index, which the caller orders by member key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agora/coord/run_state.h"

namespace agora::coord {

// Removes `count` ids from `queue` and returns them as ranges in hand-out order: pending ranges
// first (lowest first, the last one split if only part of it is needed), then fresh ids from
// queue.next_fresh. Throws Error when fresh ids would pass 2^64.
std::vector<SequenceRange> take_sequences(DataQueue& queue, uint64_t count);

// Puts `ranges` back into queue.pending (kept sorted and merged). Empty ranges are skipped.
// Throws Error when a range overlaps one already pending or reaches next_fresh: that would hand
// an id out twice, so it is a bug in the caller, never silently accepted.
void return_sequences(DataQueue& queue, const std::vector<SequenceRange>& ranges);

// The sum of the counts.
uint64_t total_count(const std::vector<SequenceRange>& ranges);

// "first+count,first+count,..." in the given order ("" for none): how logs list a step's data.
std::string format_ranges(const std::vector<SequenceRange>& ranges);

// Weights for a split from measured throughputs (sequences per second, 0 = unknown): a known
// value is its own weight; an unknown one counts as the median of the known ones, or 1.0 when
// none is known. Non-finite or negative values count as unknown.
std::vector<double> throughput_weights(const std::vector<double>& sequences_per_second);

// Weights for a round in which member i also recomputes check_sequences[i] sequences of spot
// checks (a verifier's work beside its share): if the round's work, `total` sequences plus all
// checks, were spread at the members' speeds it would take T = (total + sum c) / sum w seconds,
// and member i spends c_i / w_i of them on checks, so it trains at w_i - c_i / T. A member with
// checks filling the round keeps a token weight (1e-3 w_i): weights stay positive. The sizes
// must match (Error otherwise).
std::vector<double> weights_after_checks(const std::vector<double>& weights, uint64_t total,
                                         const std::vector<uint64_t>& check_sequences);

// Splits `total` whole sequences among members that train `weights[i]` sequences a second so
// that the last one finishes first: the split that minimizes max_i shares[i] / weights[i] (the
// round's length). Each member gets at least floor(total * w_i / sum); each remaining sequence
// goes to the member that would finish it soonest, (shares[i] + 1) / w_i (ties: lower index).
// (A split in proportion to the weights, rounded by largest remainders, can round a slow member
// up: weights 5.9 and 3 x 40.7 over 128 give it 6, ending at 1.017 s, where 5 for it and 41 for
// each of the others end at 1.007 s.)
// Throws Error when weights is empty or a weight is not positive and finite.
std::vector<uint64_t> fastest_shares(uint64_t total, const std::vector<double>& weights);

// Cuts `ranges` (in order) into consecutive pieces of sizes[i] ids each; sum(sizes) must equal
// total_count(ranges) (Error otherwise). A size of 0 gives an empty piece.
std::vector<std::vector<SequenceRange>> cut_ranges(const std::vector<SequenceRange>& ranges,
                                                   const std::vector<uint64_t>& sizes);

}  // namespace agora::coord
