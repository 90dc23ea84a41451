#include "agora/peer/holder_spread.h"

#include <algorithm>

#include "agora/core/error.h"

namespace agora::peer {

std::vector<size_t> spread_over_holders(const std::vector<uint64_t>& bytes, size_t holders,
                                        size_t per_holder) {
  if (holders == 0 || per_holder == 0) {
    fail("cannot spread {} tensors over {} holders, {} at a time each", bytes.size(), holders,
         per_holder);
  }
  const size_t batch = per_holder * holders;
  std::vector<uint64_t> load(holders);
  std::vector<size_t> in_batch(holders);
  std::vector<size_t> first(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i % batch == 0) std::fill(in_batch.begin(), in_batch.end(), 0);
    size_t pick = 0;
    for (size_t h = 1; h < holders; ++h) {
      const bool room = in_batch[h] < per_holder;
      if (room && (in_batch[pick] >= per_holder || load[h] < load[pick])) pick = h;
    }
    load[pick] += bytes[i];
    ++in_batch[pick];
    first[i] = pick;
  }
  return first;
}

}  // namespace agora::peer
