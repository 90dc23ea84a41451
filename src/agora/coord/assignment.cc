#include "agora/coord/assignment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>

#include "agora/core/error.h"

namespace agora::coord {

std::vector<SequenceRange> take_sequences(DataQueue& queue, uint64_t count) {
  std::vector<SequenceRange> out;
  uint64_t needed = count;
  // Returned ids first, lowest first: they are the oldest data the run still owes.
  size_t used = 0;
  while (needed > 0 && used < queue.pending.size()) {
    SequenceRange& range = queue.pending[used];
    const uint64_t n = std::min(needed, range.count);
    out.push_back({range.first, n});
    range.first += n;
    range.count -= n;
    needed -= n;
    if (range.count == 0) ++used;
  }
  queue.pending.erase(queue.pending.begin(), queue.pending.begin() + static_cast<ptrdiff_t>(used));
  if (needed > 0) {
    if (queue.next_fresh > std::numeric_limits<uint64_t>::max() - needed) {
      fail("sequence ids ran out: next fresh id {} + {} passes 2^64", queue.next_fresh, needed);
    }
    // Merge with the last piece when contiguous, so one member's share stays one range.
    if (!out.empty() && out.back().first + out.back().count == queue.next_fresh) {
      out.back().count += needed;
    } else {
      out.push_back({queue.next_fresh, needed});
    }
    queue.next_fresh += needed;
  }
  return out;
}

void return_sequences(DataQueue& queue, const std::vector<SequenceRange>& ranges) {
  for (const SequenceRange& range : ranges) {
    if (range.count == 0) continue;
    if (range.first > queue.next_fresh || queue.next_fresh - range.first < range.count) {
      fail("returned sequences {}..{} reach past the next fresh id {}: they were never handed out",
           range.first, range.first + range.count - 1, queue.next_fresh);
    }
    auto& pending = queue.pending;
    auto it = std::lower_bound(
        pending.begin(), pending.end(), range,
        [](const SequenceRange& a, const SequenceRange& b) { return a.first < b.first; });
    const bool overlaps_next = it != pending.end() && it->first < range.first + range.count;
    const bool overlaps_prev =
        it != pending.begin() && std::prev(it)->first + std::prev(it)->count > range.first;
    if (overlaps_next || overlaps_prev) {
      fail("returned sequences {}..{} are already pending: an id would be handed out twice",
           range.first, range.first + range.count - 1);
    }
    it = pending.insert(it, range);
    // Merge with the neighbours so the queue stays short.
    if (std::next(it) != pending.end() && it->first + it->count == std::next(it)->first) {
      it->count += std::next(it)->count;
      pending.erase(std::next(it));
    }
    if (it != pending.begin() && std::prev(it)->first + std::prev(it)->count == it->first) {
      std::prev(it)->count += it->count;
      pending.erase(it);
    }
  }
}

uint64_t total_count(const std::vector<SequenceRange>& ranges) {
  uint64_t sum = 0;
  for (const SequenceRange& r : ranges) sum += r.count;
  return sum;
}

std::string format_ranges(const std::vector<SequenceRange>& ranges) {
  std::string out;
  for (const SequenceRange& r : ranges) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}+{}", r.first, r.count);
  }
  return out;
}

std::vector<double> throughput_weights(const std::vector<double>& sequences_per_second) {
  auto known = [](double v) { return std::isfinite(v) && v > 0.0; };
  std::vector<double> measured;
  for (double v : sequences_per_second) {
    if (known(v)) measured.push_back(v);
  }
  double fallback = 1.0;
  if (!measured.empty()) {
    std::sort(measured.begin(), measured.end());
    const size_t mid = measured.size() / 2;
    fallback = measured.size() % 2 == 1 ? measured[mid] : 0.5 * (measured[mid - 1] + measured[mid]);
  }
  std::vector<double> weights;
  weights.reserve(sequences_per_second.size());
  for (double v : sequences_per_second) weights.push_back(known(v) ? v : fallback);
  return weights;
}

std::vector<double> weights_after_checks(const std::vector<double>& weights, uint64_t total,
                                         const std::vector<uint64_t>& check_sequences) {
  if (weights.size() != check_sequences.size()) {
    fail("{} weights but {} check counts; one of each per member", weights.size(),
         check_sequences.size());
  }
  double speed = 0.0;
  double work = static_cast<double>(total);
  for (size_t i = 0; i < weights.size(); ++i) {
    speed += weights[i];
    work += static_cast<double>(check_sequences[i]);
  }
  if (!(speed > 0.0) || !std::isfinite(speed) || work == static_cast<double>(total)) {
    return weights;
  }
  const double seconds = work / speed;
  std::vector<double> out;
  out.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const double training = weights[i] - static_cast<double>(check_sequences[i]) / seconds;
    out.push_back(std::max(training, 1e-3 * weights[i]));
  }
  return out;
}

namespace {

// The sum of `weights`, after checking that there is one and each is positive and finite.
double checked_weight_sum(uint64_t total, const std::vector<double>& weights) {
  if (weights.empty()) fail("cannot split {} sequences among no members", total);
  double sum = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(std::isfinite(weights[i]) && weights[i] > 0.0)) {
      fail("member {}'s weight is {}; weights must be positive and finite", i, weights[i]);
    }
    sum += weights[i];
  }
  return sum;
}

// floor(total * w_i / sum) each, never more than total in all; `assigned` gets their sum.
std::vector<uint64_t> floor_quotas(uint64_t total, const std::vector<double>& weights, double sum,
                                   uint64_t& assigned) {
  std::vector<uint64_t> shares(weights.size());
  assigned = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double quota = static_cast<double>(total) * (weights[i] / sum);
    // Rounding can push a quota a hair past what is left; never hand out more than total.
    shares[i] = std::min(static_cast<uint64_t>(std::floor(quota)), total - assigned);
    assigned += shares[i];
  }
  return shares;
}

}  // namespace

std::vector<uint64_t> fastest_shares(uint64_t total, const std::vector<double>& weights) {
  const double sum = checked_weight_sum(total, weights);
  uint64_t assigned = 0;
  std::vector<uint64_t> shares = floor_quotas(total, weights, sum, assigned);
  // Every floor quota ends by total / sum seconds, which no split can beat, so an optimal split
  // holds at least these; the rest go one at a time to whoever would finish its next sequence
  // first. That is the greedy rule for identical jobs on machines of unequal speed, and it is
  // optimal for the round's length (the last member's finish).
  using Next = std::pair<double, size_t>;  // (finish time with one more sequence, member)
  std::priority_queue<Next, std::vector<Next>, std::greater<>> next;
  for (size_t i = 0; i < weights.size(); ++i) {
    next.emplace(static_cast<double>(shares[i] + 1) / weights[i], i);
  }
  for (; assigned < total; ++assigned) {
    const size_t i = next.top().second;
    next.pop();
    ++shares[i];
    next.emplace(static_cast<double>(shares[i] + 1) / weights[i], i);
  }
  return shares;
}

std::vector<std::vector<SequenceRange>> cut_ranges(const std::vector<SequenceRange>& ranges,
                                                   const std::vector<uint64_t>& sizes) {
  const uint64_t available = total_count(ranges);
  const uint64_t wanted = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  if (available != wanted) {
    fail("cannot cut {} sequences into pieces that sum to {}", available, wanted);
  }
  std::vector<std::vector<SequenceRange>> pieces(sizes.size());
  size_t index = 0;
  uint64_t offset = 0;  // ids of ranges[index] already given out
  for (size_t i = 0; i < sizes.size(); ++i) {
    uint64_t needed = sizes[i];
    while (needed > 0) {
      const SequenceRange& range = ranges[index];
      const uint64_t n = std::min(needed, range.count - offset);
      if (n > 0) pieces[i].push_back({range.first + offset, n});
      offset += n;
      needed -= n;
      if (offset == range.count) {
        ++index;
        offset = 0;
      }
    }
  }
  return pieces;
}

}  // namespace agora::coord
