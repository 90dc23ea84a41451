#include "agora/optim/influence.h"

#include <algorithm>
#include <cmath>

namespace agora {
namespace {

double squared_norm(const std::vector<float>& values) {
  double squares = 0;
  for (const float v : values) squares += static_cast<double>(v) * static_cast<double>(v);
  return squares;
}

// The norm of entry t of every payload. Each is the same in-order double sum as squared_norm();
// four payloads' sums advance together because a lone sum waits on its previous addition at
// every value, and independent sums overlap (a quarter of the time at 100 payloads, same bits).
void norms_of(const std::vector<Payload>& payloads, size_t t, std::vector<double>& norms) {
  const size_t n = payloads.front().tensors[t].values.size();
  size_t j = 0;
  for (; j + 4 <= payloads.size(); j += 4) {
    const std::vector<float>& a = payloads[j].tensors[t].values;
    const std::vector<float>& b = payloads[j + 1].tensors[t].values;
    const std::vector<float>& c = payloads[j + 2].tensors[t].values;
    const std::vector<float>& d = payloads[j + 3].tensors[t].values;
    if (a.size() != n || b.size() != n || c.size() != n || d.size() != n) break;
    double sa = 0, sb = 0, sc = 0, sd = 0;
    for (size_t i = 0; i < n; ++i) {
      sa += static_cast<double>(a[i]) * static_cast<double>(a[i]);
      sb += static_cast<double>(b[i]) * static_cast<double>(b[i]);
      sc += static_cast<double>(c[i]) * static_cast<double>(c[i]);
      sd += static_cast<double>(d[i]) * static_cast<double>(d[i]);
    }
    norms[j] = std::sqrt(sa);
    norms[j + 1] = std::sqrt(sb);
    norms[j + 2] = std::sqrt(sc);
    norms[j + 3] = std::sqrt(sd);
  }
  for (; j < payloads.size(); ++j) {
    norms[j] = std::sqrt(squared_norm(payloads[j].tensors[t].values));
  }
}

}  // namespace

int64_t bound_influence(std::vector<Payload>& payloads, double ratio) {
  if (ratio <= 0 || payloads.size() < 2) return 0;
  int64_t clipped = 0;
  const size_t tensors = payloads.front().tensors.size();
  std::vector<double> norms(payloads.size()), sorted;
  for (size_t t = 0; t < tensors; ++t) {
    norms_of(payloads, t, norms);
    // Entries of all zeros carry nothing and are left out of the median: counted, a round of
    // zeros half full (a stage of two with one hostile replica) would bound every honest entry
    // to nothing.
    sorted.clear();
    for (const double n : norms) {
      if (n > 0) sorted.push_back(n);
    }
    if (sorted.empty()) continue;
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
