#include "agora/optim/influence.h"

#include <algorithm>
#include <cmath>

namespace agora {

int64_t bound_influence(std::vector<Payload>& payloads, double ratio) {
  if (ratio <= 0 || payloads.size() < 2) return 0;
  int64_t clipped = 0;
  const size_t tensors = payloads.front().tensors.size();
  std::vector<double> norms(payloads.size()), sorted;
  for (size_t t = 0; t < tensors; ++t) {
    for (size_t j = 0; j < payloads.size(); ++j) {
      double squares = 0;
      for (const float v : payloads[j].tensors[t].values) {
        squares += static_cast<double>(v) * static_cast<double>(v);
      }
      norms[j] = std::sqrt(squares);
    }
    sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const double bound = ratio * sorted[(sorted.size() - 1) / 2];
    for (size_t j = 0; j < payloads.size(); ++j) {
      if (!(norms[j] > bound)) continue;
      const auto scale = static_cast<float>(bound / norms[j]);
      for (float& v : payloads[j].tensors[t].values) v *= scale;
      ++clipped;
    }
  }
  return clipped;
}

}  // namespace agora
