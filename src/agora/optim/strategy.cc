#include "agora/optim/strategy.h"

#include <algorithm>
#include <tuple>

namespace agora {

std::vector<const Contribution*> canonical_order(std::span<const Contribution> contributions) {
  std::vector<const Contribution*> out;
  for (const Contribution& c : contributions) {
    if (!c.bytes.empty()) out.push_back(&c);
  }
  std::sort(out.begin(), out.end(), [](const Contribution* a, const Contribution* b) {
    return std::tie(a->peer, a->bytes) < std::tie(b->peer, b->bytes);
  });
  return out;
}

}  // namespace agora
