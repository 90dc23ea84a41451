#include "agora/rl/sapo_draw.h"

#include <algorithm>

namespace agora {

uint64_t sapo_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool rewards_differ(const std::vector<double>& rewards) {
  return std::any_of(rewards.begin(), rewards.end(), [&](double r) { return r != rewards[0]; });
}

std::vector<size_t> draw_shared(const std::vector<bool>& informative, int64_t shared,
                                uint64_t state) {
  std::vector<size_t> candidates;
  for (size_t i = 0; i < informative.size(); ++i) {
    if (informative[i]) candidates.push_back(i);
  }
  std::vector<size_t> chosen;
  for (int64_t k = 0; k < shared && !candidates.empty(); ++k) {
    state = sapo_mix(state);
    const size_t pick = state % candidates.size();
    chosen.push_back(candidates[pick]);
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  return chosen;
}

}  // namespace agora
