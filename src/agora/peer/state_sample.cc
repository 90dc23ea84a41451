#include "agora/peer/state_sample.h"

#include <algorithm>

#include "agora/core/hash.h"

namespace agora::peer {

std::vector<size_t> sample_state(const std::string& sample, const std::vector<StateTensor>& tensors,
                                 double fraction) {
  std::vector<size_t> out;
  if (sample.empty() || fraction >= 1) {
    for (size_t i = 0; i < tensors.size(); ++i) out.push_back(i);
    return out;
  }
  uint64_t total = 0;
  std::vector<std::pair<std::string, size_t>> ranked;
  for (size_t i = 0; i < tensors.size(); ++i) {
    total += tensors[i].bytes;
    ranked.push_back({blake2b256_bytes(sample + tensors[i].name), i});
  }
  std::sort(ranked.begin(), ranked.end());
  const double wanted = fraction * static_cast<double>(total);
  uint64_t taken = 0;
  for (const auto& [rank, i] : ranked) {
    if (!out.empty() && static_cast<double>(taken) >= wanted) break;
    out.push_back(i);
    taken += tensors[i].bytes;
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace agora::peer
